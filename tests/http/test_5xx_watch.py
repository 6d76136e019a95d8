"""The test suite's watch on 5xx replies (``tests/conftest.py``): a test during which a 5xx is logged
fails with the logged cause, unless it is marked ``allow_5xx``."""

from __future__ import annotations

import contextlib
import sqlite3
from typing import TYPE_CHECKING

import pytest

from tests.conftest import SERVE_LOGS, watched_serve
from tests.http.conftest import Http

if TYPE_CHECKING:
    from pathlib import Path

pytest_plugins = ["pytester"]

PLANTED = """
import pytest

from querator.api.gateway import FunctionApp


def _boom(request):
    raise RuntimeError("planted for the watch")


def _call():
    app = FunctionApp({("POST", "/v1/boom"): _boom})
    event = {"httpMethod": "POST", "path": "/v1/boom", "requestContext": {"requestId": "req-planted"}}
    return app.resolve(event, None)


def test_a_planted_500():
    assert _call()["statusCode"] == 500  # the test itself would pass


@pytest.mark.allow_5xx
def test_a_500_it_asked_for():
    assert _call()["statusCode"] == 500
"""

WATCH = """
from tests.conftest import ALLOW_5XX, pytest_runtest_call  # noqa: F401 - the hook under test


def pytest_configure(config):
    config.addinivalue_line("markers", f"{ALLOW_5XX}: provokes 5xx on purpose")
"""


# The inner run's planted 500 is logged in this process too: this test asks for it.
@pytest.mark.allow_5xx
def test_a_logged_500_fails_its_test_with_the_cause_unless_the_test_allows_it(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(WATCH)
    pytester.makepyfile(test_planted=PLANTED)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_a_planted_500*",
            "*1 5xx logged during the test (mark it allow_5xx if that is its point)*",
            "*POST /v1/boom failed with 500; request id req-planted*",
            "Traceback (most recent call last):*",
            "RuntimeError: planted for the watch",
        ]
    )


def _break_the_store(url: str, database: Path) -> str:
    """A 500 from the server at ``url``: its store loses a table under it; the reply's request id."""
    api = Http(url)
    api.ok("/v1/queues.create", {"queue_name": "jobs", "lease_timeout": "1m", "expire_timeout": "1h"})
    with contextlib.closing(sqlite3.connect(database)) as connection:
        connection.execute("DROP TABLE lease_records")
        connection.commit()
    reply = api.post("/v1/queue.lease", {"queue_name": "jobs", "batch_size": 1, "client_id": "c"})
    assert reply.status == 500, reply.body
    return str(reply.body["message"]).removeprefix("Internal error; request id ")


# The watch of this test's own server sees the 500 too; the test reads it first, directly.
@pytest.mark.allow_5xx
def test_a_500_of_a_watched_serve_child_is_read_from_its_stderr_with_the_traceback(tmp_path: Path) -> None:
    database = tmp_path / "querator.db"
    with watched_serve("--store", f"sqlite:{database}", directory=tmp_path) as url:
        [log] = [log for log in SERVE_LOGS if log.path.parent == tmp_path]
        assert log.new_5xx() == []
        request_id = _break_the_store(url, database)
        [record] = log.new_5xx()
    first, *rest = record.splitlines()
    assert first.endswith(f" ERROR POST /v1/queue.lease failed with 500; request id {request_id}")
    assert rest[0] == "Traceback (most recent call last):"
    assert (
        rest[-1] == "querator.domain.errors.StoreUnavailableError: store failed: no such table: lease_records"
    )


CHILD = """
from tests.conftest import watched_serve
from tests.http.test_5xx_watch import _break_the_store


def test_a_500_in_a_child_server(tmp_path):
    with watched_serve("--store", f"sqlite:{tmp_path / 'q.db'}", directory=tmp_path) as url:
        _break_the_store(url, tmp_path / "q.db")
"""


@pytest.mark.allow_5xx
def test_a_500_a_watched_child_server_prints_fails_its_test(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(WATCH)
    pytester.makepyfile(test_child=CHILD)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*1 5xx logged during the test*",
            "*ERROR POST /v1/queue.lease failed with 500; request id *",
            "Traceback (most recent call last):",
            "*StoreUnavailableError: store failed: no such table: lease_records",
        ]
    )
