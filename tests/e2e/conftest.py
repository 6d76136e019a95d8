"""The e2e suite talks to a deployed stack (AWS or LocalStack) with the caller's real credentials.

Opt-in twice: the ``e2e`` marker is deselected by default (pyproject ``addopts``), and the tests skip
unless ``QUERATOR_E2E_URL`` (the stack's ``ApiUrl`` output) is set. Run with
``QUERATOR_E2E_URL=https://…/dev/ uv run --frozen pytest -m e2e tests/e2e``.
"""

from __future__ import annotations

import os

import pytest

from tests.e2e.sigv4 import SignedApi


@pytest.fixture(autouse=True)
def aws_credentials() -> None:
    """Overrides the suite-wide fake credentials: signing needs the caller's own."""


@pytest.fixture(scope="session")
def api() -> SignedApi:
    url = os.environ.get("QUERATOR_E2E_URL")
    if not url:
        pytest.skip("QUERATOR_E2E_URL is not set (the deployed stack's ApiUrl output)")
    return SignedApi.from_environment(url)
