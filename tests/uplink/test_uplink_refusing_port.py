"""The "nothing listens there" port of the bridge tests (tests/uplink/_remote.py).

``free_port()`` closes the socket that found the port: any other socket may take the port at
once (another test's listener; on 2 busy cores the suite opens thousands), and a bridge test
that relied on it being unreachable then talked to a stranger.  ``refusing_port()`` keeps a
bound socket that does not listen for the whole test: a connection is refused, and the port
cannot be taken meanwhile.
"""

from __future__ import annotations

import errno
import socket

import pytest

from tests.uplink._remote import free_port, refusing_port


def _take(port: int) -> socket.socket:
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        s.listen()
    except OSError:
        s.close()
        raise
    return s


def test_a_freed_port_can_be_taken_by_anyone() -> None:
    """Why ``free_port`` is wrong for "nothing listens": the port it names can listen."""
    port = free_port()
    with _take(port) as stranger, socket.create_connection(("127.0.0.1", port), timeout=5):
        assert stranger.getsockname()[1] == port


def test_a_refusing_port_refuses_and_cannot_be_taken() -> None:
    with refusing_port() as port:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        with pytest.raises(OSError) as exc:
            _take(port).close()
        assert exc.value.errno == errno.EADDRINUSE
