"""Fixtures of the CLI tests: one ``querator serve`` for the session, ``QUERATOR_URL`` pointing at it,
and ``run`` calling ``main([...])`` in-process with stdout / stderr captured."""

from __future__ import annotations

import io
import json
import sys
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from querator.cli import main
from querator.client import Client

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


@pytest.fixture
def run(
    served_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., Result]:
    monkeypatch.setenv("QUERATOR_URL", served_url)
    monkeypatch.delenv("QUERATOR_SIGV4_REGION", raising=False)

    def invoke(*argv: str, stdin: str | None = None) -> Result:
        capsys.readouterr()
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        code = main(list(argv))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return invoke


@pytest.fixture
def client(served_url: str) -> Iterator[Client]:
    with Client(served_url) as client:
        yield client


@pytest.fixture
def queue_name() -> str:
    return f"cli-{uuid.uuid4().hex[:12]}"
