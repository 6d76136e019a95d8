"""The ``querator`` command: ``querator serve`` and the client commands."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from querator.cli import commands as client_commands
from querator.cli import console, consume, serve

if TYPE_CHECKING:
    from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="querator", description="A lease (reservation) FIFO queue: local server and client."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve.register(commands)
    common = client_commands.register(commands)
    consume.register(commands, common)
    console.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; the return value is the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args, extras = build_parser().parse_known_args(argv)
    if extras:
        # The error comes from the command's own parser, so its usage line is the one shown.
        command: argparse.ArgumentParser = args.command_parser
        if not getattr(args, "intermixed", False):
            command.error(f"unrecognized arguments: {' '.join(extras)}{getattr(args, 'usage_hint', '')}")
        # argparse takes a list positional (PAYLOAD..., ID...) only before the first option;
        # intermixed parsing takes it wherever it is, and still refuses an unknown option.
        args = command.parse_intermixed_args(argv[len(args.command_path.split()) :])
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
