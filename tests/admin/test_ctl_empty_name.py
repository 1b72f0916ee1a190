"""``siftmq ctl bridges show|reconnect ""`` and ``clients show ""`` are usage errors.

Before, the empty name went out as ``/api/v1/bridges//reconnect``, a path of no endpoint:
the API answered ``405 method POST not allowed on /api/v1/bridges//reconnect`` (status 1).
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from broker._ctl_cli import _Usage, dispatch


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def call(self, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((method, path))
        return {}


@pytest.mark.parametrize(
    "args",
    [
        argparse.Namespace(area="bridges", verb="show", name=""),
        argparse.Namespace(area="bridges", verb="reconnect", name=""),
        argparse.Namespace(area="clients", verb="show", client_id=""),
    ],
)
def test_an_empty_name_is_a_usage_error(args: argparse.Namespace) -> None:
    client = _Recorder()
    with pytest.raises(_Usage, match="empty"):
        dispatch(client, args)  # type: ignore[arg-type]
    assert client.calls == []


def test_a_name_is_one_quoted_segment() -> None:
    client = _Recorder()
    dispatch(client, argparse.Namespace(area="bridges", verb="reconnect", name="a/b"))  # type: ignore[arg-type]
    assert client.calls == [("POST", "/bridges/a%2Fb/reconnect")]
