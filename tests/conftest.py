"""Shared fixtures: fake AWS credentials (never real ones), a fake clock, and the stores under test.

Also the watch on 5xx replies: a test during which the handlers or the local server log a 5xx (in
this process, or in a ``querator serve`` child started by ``watched_serve``, such as ``served_url``)
fails, showing the logged cause, unless it is marked ``allow_5xx``.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from typing import TYPE_CHECKING

import pytest

from querator.testing import FakeClock, moto_server_process, serve_process

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Fail a test during which a 5xx was logged in this process, with the cause in the message.

    A 500 says only "Internal error; request id ...": without this, a test that does not check every
    status (or retries past it) would pass over a server bug. Servers in child processes are watched
    when ``watched_serve`` started them (``served_url`` is one); others log to their own stderr.
    """
    watch = ServerErrorWatch()
    watched = logging.getLogger("querator")
    for log in SERVE_LOGS:
        log.new_5xx()  # before this test: not its own
    watched.addHandler(watch)
    try:
        result = yield
    finally:
        watched.removeHandler(watch)
        logged = [watch.format(record) for record in watch.records]
        logged += [record for log in SERVE_LOGS for record in log.new_5xx()]
        SERVE_LOGS[:] = [log for log in SERVE_LOGS if not log.ended]
        if logged:
            item.add_report_section("call", "5xx logged", "\n\n".join(logged))
    if logged and item.get_closest_marker(ALLOW_5XX) is None:
        pytest.fail(
            f"{len(logged)} 5xx logged during the test (mark it {ALLOW_5XX} if that is its point):\n"
            + "\n\n".join(logged),
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


@pytest.fixture(autouse=True)
def no_metrics_carried_over() -> None:
    """Powertools keeps one metric set per process: a test that counted without flushing (a call of
    an endpoint, a handler still running on another thread) would hand its metrics to the next test
    that flushes, as a line of its stdout. Each test starts with the set empty."""
    from querator import observability  # noqa: PLC0415 - the package under test, imported late

    observability.metrics.clear_metrics()


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
def served_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One ``querator serve`` (its own SQLite store) for the session; tests isolate by queue name.

    The reaper runs every 0.5 s so tests that wait for dead-lettering wait less. Its stderr is
    watched for 5xx like this process's log.
    """
    with watched_serve("--reaper-interval", "0.5", directory=tmp_path_factory.mktemp("serve")) as url:
        yield url


#: A 5xx as ``querator serve`` prints it: an error line naming the request id, then its traceback.
_SERVE_5XX = re.compile(r"^\d\d:\d\d:\d\d ERROR .*; request id ")
_SERVE_LINE = re.compile(r"^\d\d:\d\d:\d\d ")


class ServeLog:
    """The stderr of a ``querator serve`` child, in a file, read on from where it was last read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        #: The server has stopped: nothing more will be written.
        self.ended = False

    def new_5xx(self) -> list[str]:
        """The 5xx records written since the last call, each with its traceback."""
        with self.path.open("rb") as log:
            log.seek(self._offset)
            text = log.read()
        self._offset += len(text)
        records: list[list[str]] = []
        inside = False
        for line in text.decode("utf-8", "replace").splitlines():
            if _SERVE_5XX.match(line):
                records.append([line])
                inside = True
            elif inside and not _SERVE_LINE.match(line):
                records[-1].append(line)
            else:
                inside = False
        return ["\n".join(record) for record in records]


#: The logs of the servers ``watched_serve`` started in this process, read after each test.
SERVE_LOGS: list[ServeLog] = []


@contextmanager
def watched_serve(*args: str, directory: Path) -> Iterator[str]:
    """``querator.testing.serve_process`` with its data and its stderr in ``directory``; yields its
    URL. A 5xx the child prints fails the test it happened in, as one logged here does."""
    log = ServeLog(directory / "stderr.log")
    SERVE_LOGS.append(log)
    try:
        with (
            log.path.open("wb") as sink,
            serve_process(*args, env={"XDG_DATA_HOME": str(directory / "data")}, stderr=sink) as url,
        ):
            yield url
    finally:
        # Read once more after the test that started it (then forgotten): it may have ended first.
        log.ended = True
