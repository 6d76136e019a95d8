"""The console page in the browser, with waits that poll until a deadline (never sleep)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

if TYPE_CHECKING:
    from collections.abc import Callable

    from selenium import webdriver
    from selenium.webdriver.remote.webelement import WebElement

#: Seconds a page may take to show what a test waits for.
DEADLINE = 20


class Page:
    """The console in the browser, with waits that poll until a deadline."""

    def __init__(self, driver: webdriver.Chrome, base: str) -> None:
        self.driver = driver
        self.base = base

    def open(self, fragment: str = "#/") -> Page:
        # A new URL that differs only in its #fragment would not reload the page (and its data-ready
        # would be the previous page's): start from a blank page each time.
        self.driver.get("about:blank")
        self.driver.get(f"{self.base}/console/{fragment}")
        self.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "true")
        return self

    def go(self, fragment: str) -> Page:
        self.driver.execute_script("location.hash = arguments[0]", fragment)
        return self

    def until(self, check: Callable[[Any], Any], message: str = "") -> Any:
        # The page re-renders as it refreshes: an element found a moment ago may be gone; look again.
        ignored = (NoSuchElementException, StaleElementReferenceException)
        return WebDriverWait(self.driver, DEADLINE, poll_frequency=0.1, ignored_exceptions=ignored).until(
            check, message
        )

    def element(self, css: str) -> WebElement:
        return self.until(lambda d: d.find_element(By.CSS_SELECTOR, css), f"no {css}")

    def text_of(self, css: str) -> str:
        return self.element(css).text

    def wait_text(self, css: str, wanted: str) -> str:
        """The text of ``css`` once it contains ``wanted``."""
        return self.until(
            lambda d: next((e.text for e in d.find_elements(By.CSS_SELECTOR, css) if wanted in e.text), None),
            f"{css} never showed {wanted!r}",
        )

    def confirm(self) -> str:
        """Press Confirm in the confirmation dialog; returns what the dialog said."""
        dialog = self.until(
            lambda d: (
                d.find_element(By.ID, "confirm")
                if d.find_element(By.ID, "confirm").get_attribute("open") is not None
                else None
            )
        )
        text = dialog.find_element(By.ID, "confirm-text").text
        dialog.find_element(By.ID, "confirm-ok").click()
        return text
