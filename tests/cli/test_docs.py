"""docs/cli.md against the parser: every command has a row in the command table, every row is a
command, and every option a row names is one the command takes."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from querator.cli import build_parser

DOC = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text(encoding="utf-8")
TABLE = DOC.split("| command | does |", 1)[1].split("\n\n", 1)[0]
ROWS = re.findall(r"^\| `([^`]+)` \|", TABLE, re.MULTILINE)


def _commands() -> dict[str, argparse.ArgumentParser]:
    """Every client command path ("queues create", "produce") and its parser; not serve."""
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subcommands:
            found[" ".join(path)] = parser
        for action in subcommands:
            for name, child in action.choices.items():
                walk(child, [*path, name])

    walk(build_parser(), [])
    del found["serve"]
    return found


def _row_command(row: str) -> str:
    words = []
    for word in row.split():
        if not re.fullmatch(r"[a-z-]+", word):
            break
        words.append(word)
    return " ".join(words)


def test_every_command_has_a_row_and_every_row_is_a_command() -> None:
    assert sorted(_row_command(row) for row in ROWS) == sorted(_commands())


def test_every_option_in_a_row_is_an_option_of_its_command() -> None:
    commands = _commands()
    for row in ROWS:
        parser = commands[_row_command(row)]
        options = {option for action in parser._actions for option in action.option_strings}
        named = set(re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", row)) - {"--"}
        assert named <= options, (row, named - options)
