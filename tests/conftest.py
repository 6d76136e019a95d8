"""Shared fixtures: fake AWS credentials (never real ones), a fake clock, and the stores under test.

Also the watch on 5xx replies: a test during which the handlers (or the local server, in this
process) log a 5xx fails, showing the logged cause, unless it is marked ``allow_5xx``.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from typing import TYPE_CHECKING

import pytest

from querator.testing import FakeClock, moto_server_process, serve_process

if TYPE_CHECKING:
    from collections.abc import Iterator

#: The marker a test that provokes a 5xx on purpose carries, so that its opt-out is visible.
ALLOW_5XX = "allow_5xx"


def pytest_configure(config: pytest.Config) -> None:
    """``querator serve`` keeps its data under the user's data directory by default: the servers the
    tests start (which inherit this environment) keep theirs in a directory of this session."""
    os.environ["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="querator-tests-data-")
    config.addinivalue_line(
        "markers", f"{ALLOW_5XX}: the test provokes 5xx replies on purpose (they do not fail it)"
    )


class ServerErrorWatch(logging.Handler):
    """Keeps the 5xx records of the ``querator`` loggers: error level, with a ``status`` of 500 or
    more (``querator.api.gateway`` and ``querator.localserver`` log every 5xx that way)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        status = getattr(record, "status", 0)
        if isinstance(status, int) and status >= 500:
            self.records.append(record)

    def report(self) -> str:
        """Each record with its traceback, for the failure message."""
        return "\n\n".join(self.format(record) for record in self.records)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Fail a test during which a 5xx was logged in this process, with the cause in the message.

    A 500 says only "Internal error; request id ...": without this, a test that does not check every
    status (or retries past it) would pass over a server bug. Servers in child processes (``querator
    serve``) log to their own stderr and are not watched here.
    """
    watch = ServerErrorWatch()
    watched = logging.getLogger("querator")
    watched.addHandler(watch)
    try:
        result = yield
    finally:
        watched.removeHandler(watch)
    if watch.records and item.get_closest_marker(ALLOW_5XX) is None:
        pytest.fail(
            f"{len(watch.records)} 5xx logged during the test (mark it {ALLOW_5XX} if that is its"
            f" point):\n{watch.report()}",
            pytrace=False,
        )
    return result


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
