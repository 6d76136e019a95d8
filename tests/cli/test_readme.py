"""The README's quick start, pasted as a reader pastes it: each ``$`` line runs in bash against a fresh
``querator serve`` and what it prints must be what the README shows under it (ids, times, ages and
durations aside); then the Python block runs and must print the block under it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from querator.client import Client
from querator.testing import serve_process

pytestmark = pytest.mark.server

README = Path(__file__).resolve().parents[2] / "README.md"
BIN = Path(sys.executable).parent
#: What differs from one run to the next, each replaced by a placeholder on both sides.
VARYING = [
    # Ids: engine v3's (`l` and 16 hex digits, 17 characters) and v2's (30 hex digits).
    (re.compile(r"\b[0-9A-Za-z]{16,}\b"), "<id>"),
    (re.compile(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z"), "<time>"),
    (re.compile(r"\bafter \d+(\.\d+)? s\b"), "after <n> s"),
    (re.compile(r"(?<![\w.])(\d+(\.\d+)?(h|m|s|ms|µs|ns))+(?![\w.])"), "<duration>"),
    # A table's rule is as wide as its widest cell.
    (re.compile(r"(?<!\S)-+(?!\S)"), "---"),
]


def _block(start: str) -> str:
    text = README.read_text(encoding="utf-8")
    return text.split(f"<!-- {start}:start -->", 1)[1].split(f"<!-- {start}:end -->", 1)[0]


def _session() -> list[tuple[str, list[str]]]:
    """(command, the lines shown under it) for each ``$`` line of the console block."""
    console = re.search(r"```console\n(.*?)```", _block("quick-start"), re.DOTALL)
    assert console is not None
    steps: list[tuple[str, list[str]]] = []
    for line in console.group(1).splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    return steps


def _normal(lines: list[str]) -> list[list[str]]:
    """Lines as words, with the varying parts replaced: column widths and values may differ."""
    words = []
    for line in lines:
        text = line
        for pattern, placeholder in VARYING:
            text = pattern.sub(placeholder, text)
        words.append(text.split())
    return words


def test_the_quick_start_prints_what_the_readme_shows() -> None:
    with serve_process() as url:
        env = {**os.environ, "QUERATOR_URL": url, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
        (activate, nothing), *steps = _session()
        # The environment `./run serve` installed; here, the one the tests run in (BIN on PATH).
        assert (activate, nothing) == (". .venv/bin/activate", [])
        for command, shown in steps:
            assert command.startswith("querator "), command
            printed = subprocess.run(  # noqa: S603 - the README's own lines, run by bash
                ["bash", "-c", command],  # noqa: S607 - bash from PATH, as a reader runs it
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=60,
                check=False,
            ).stdout
            assert _normal(printed.splitlines()) == _normal(shown), command

        # A reader who reads for more than 30 s: the lease of `first` has run out by the Python block.
        with Client(url) as client:
            held = [i.id for i in client.list_items("orders") if i.is_leased]
            assert len(held) == 1
            client.retry("orders", held, partition=0)

        python = re.search(r"```python\n(.*?)```", _block("python-start"), re.DOTALL)
        output = re.search(r"```text\n(.*?)```", _block("python-start"), re.DOTALL)
        assert python is not None and output is not None
        source = python.group(1).replace("http://127.0.0.1:2319", url)
        printed = subprocess.run(  # noqa: S603 - the README's own Python block
            [sys.executable, "-c", source], capture_output=True, text=True, timeout=60, check=True
        )
        assert printed.stdout == output.group(1), printed.stderr


def test_the_placeholders_keep_what_matters() -> None:
    # Counts and payloads stay as they are; only ids, times and durations become placeholders.
    assert _normal(
        ["        0  0660ef638f743e518f1d6e953f44a8  no  0  2026-11-23T10:52:24.059966Z  first"]
    ) == [["0", "<id>", "no", "0", "<time>", "first"]]
    assert _normal(["0  1  1  0  6.22892s  1m2.5s", "stopped (idle) after 1.3 s: 2 leased"]) == [
        ["0", "1", "1", "0", "<duration>", "<duration>"],
        ["stopped", "(idle)", "after", "<n>", "s:", "2", "leased"],
    ]
