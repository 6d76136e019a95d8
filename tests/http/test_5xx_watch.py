"""The test suite's watch on 5xx replies (``tests/conftest.py``): a test during which a 5xx is logged
fails with the logged cause, unless it is marked ``allow_5xx``."""

from __future__ import annotations

import pytest

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
