"""The ``siftmq`` command line.  Sub-commands are added as their packages land."""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="siftmq", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the MQTT broker")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=1883)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        print("siftmq: the broker is not built yet (see the broker issue)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
