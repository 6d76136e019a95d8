"""The README's quick start runs as written against a fresh queue set (CLI lines in-process, then the
Python block), so it stays true."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from querator.client import Client
    from tests.cli.conftest import Result

README = Path(__file__).resolve().parents[2] / "README.md"


def _quick_start() -> tuple[list[str], str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("### Quick start: the CLI and the Python client", 1)[1]
    shell = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    python = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert shell is not None and python is not None
    lines = [line.split("#", 1)[0].strip() for line in shell.group(1).splitlines()]
    return [line for line in lines if line], python.group(1)


def test_the_readme_quick_start_runs(
    run: Callable[..., Result], client: Client, served_url: str, capsys: object
) -> None:
    commands, python = _quick_start()
    leased_ids: list[str] = []
    for command in commands:
        argv = shlex.split(command)
        assert argv[:3] == ["uv", "run", "querator"], command
        argv = argv[3:]
        if "ID..." in argv:
            argv = [a for a in argv if a != "ID..."] + leased_ids
        result = run(*argv)
        assert result.code == 0, (command, result.err)
        if argv[0] == "lease":
            leased_ids = [item["id"] for item in result.json()["items"]]
    assert len(leased_ids) == 2
    assert client.stats("orders").total == 0

    exec(compile(python.replace("http://127.0.0.1:2319", served_url), "README", "exec"), {})  # noqa: S102

    stats = client.stats("orders")
    assert (stats.total, stats.total_leased) == (0, 0)
