"""Browser tests of the console: Debian's Chromium and chromedriver, driven by Selenium, headless.

Playwright's own browser download is not reachable here, so the system browser is driven. ``./run
test`` installs it (Debian packages ``chromium`` and ``chromium-driver``) when it is missing; without it
these tests fail with that instruction instead of skipping.
"""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

from querator.testing import serve_process
from tests.browser.pages import Page

if TYPE_CHECKING:
    from collections.abc import Iterator


def _find(name: str, env: str) -> str:
    path = os.environ.get(env) or shutil.which(name)
    if not path:
        pytest.fail(
            f"the browser tests need {name} (Debian package chromium / chromium-driver; ./run test installs"
            f" them with apt-get, or set {env})"
        )
    return path


@pytest.fixture(scope="session")
def browser() -> Iterator[webdriver.Chrome]:
    options = Options()
    options.binary_location = _find("chromium", "CHROMIUM")
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1366,900",
    ):
        options.add_argument(argument)
    # Selenium Manager would try to download a driver: the system one is given, and it stays offline.
    os.environ["SE_OFFLINE"] = "true"
    driver = webdriver.Chrome(service=Service(_find("chromedriver", "CHROMEDRIVER")), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="session")
def console_server() -> Iterator[str]:
    """A ``querator serve`` of its own (SQLite in a temporary directory) for the console tests."""
    with serve_process("--reaper-interval", "0.5") as url:
        yield url


@pytest.fixture
def page(browser: webdriver.Chrome, console_server: str) -> Iterator[Page]:
    browser.get_log("browser")  # drop what earlier tests left
    yield Page(browser, console_server)
    # An uncaught script error is a bug even when the page looked right (API errors the test
    # provoked are network entries, not script errors).
    errors = [entry["message"] for entry in browser.get_log("browser") if entry.get("source") == "javascript"]
    assert errors == []
