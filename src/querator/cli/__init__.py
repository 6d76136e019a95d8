"""The ``querator`` command: ``querator serve`` and the client commands."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from querator.cli import commands as client_commands
from querator.cli import serve

if TYPE_CHECKING:
    from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="querator", description="A lease (reservation) FIFO queue: local server and client."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve.register(commands)
    client_commands.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; the return value is the process exit code."""
    args = build_parser().parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
