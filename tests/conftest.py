"""Shared fixtures: fake AWS credentials (never real ones), a fake clock, and the stores under test."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import TYPE_CHECKING

import pytest

from querator.testing import FakeClock, moto_server_process, serve_process

if TYPE_CHECKING:
    from collections.abc import Iterator


def pytest_configure(config: pytest.Config) -> None:
    """``querator serve`` keeps its data under the user's data directory by default: the servers the
    tests start (which inherit this environment) keep theirs in a directory of this session."""
    os.environ["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="querator-tests-data-")


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(os.environ.get("XDG_DATA_HOME", ""), ignore_errors=True)


@pytest.fixture(autouse=True)
def aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """moto's documented set-up: fake keys before any client exists, so nothing can reach AWS."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SECURITY_TOKEN": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_DYNAMODB", raising=False)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """One single-threaded moto server for the session; tests isolate by fresh table names."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    with moto_server_process() as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def served_url() -> Iterator[str]:
    """One ``querator serve`` (its own embedded store) for the session; tests isolate by queue name.

    The reaper runs every 0.5 s so tests that wait for dead-lettering wait less.
    """
    with serve_process("--reaper-interval", "0.5") as url:
        yield url
