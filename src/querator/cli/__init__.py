"""The ``querator`` command: ``querator serve`` and the client commands."""

from __future__ import annotations

import argparse
import re
import sys
from importlib import metadata
from typing import TYPE_CHECKING, Any

from querator.cli import commands as client_commands
from querator.cli import console, consume, serve

if TYPE_CHECKING:
    from collections.abc import Sequence


#: A negative duration (``-5s``, ``-1.5h``): argparse would read it as an unknown option and say
#: "expected one argument" instead of letting the command say what is wrong with the value.
_NEGATIVE_DURATION = re.compile(r"-[0-9.]+[a-zµμ]")


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` that takes ``--lease-timeout -5s`` as an option and its value."""

    def _parse_optional(self, arg_string: str) -> Any:
        if _NEGATIVE_DURATION.match(arg_string):
            return None  # a value, not an option
        return super()._parse_optional(arg_string)


def package_version() -> str:
    """The installed ``querator`` version (``0.0.0`` from a source tree never installed)."""
    try:
        return metadata.version("querator")
    except metadata.PackageNotFoundError:
        return "0.0.0"


def build_parser() -> argparse.ArgumentParser:
    # Subparsers are made with the class of their parent, so every command gets ``Parser``.
    parser = Parser(prog="querator", description="A lease (reservation) FIFO queue: local server and client.")
    parser.add_argument("--version", action="version", version=f"querator {package_version()}")
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
