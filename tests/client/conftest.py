"""Fixtures of the client tests: a scripted fake server for faults, and one ``querator serve`` for the
module that tests the real API (queue names are unique per test, so tests share it)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest

from querator.client import Client
from tests.client.fakeserver import FakeServer

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture(scope="session")
def fake_server() -> Iterator[FakeServer]:
    server = FakeServer().start()
    yield server
    server.stop()


@pytest.fixture
def fake(fake_server: FakeServer) -> FakeServer:
    fake_server.reset()
    return fake_server


@pytest.fixture
def fake_client(fake: FakeServer) -> Iterator[Client]:
    # Tiny backoff: the tests count requests, they do not measure waits.
    with Client(fake.url, backoff_base=0.001, backoff_cap=0.01, max_retries=3, timeout=5) as client:
        yield client


@pytest.fixture
def client(served_url: str) -> Iterator[Client]:
    with Client(served_url) as client:
        yield client


@pytest.fixture
def queue_name() -> str:
    return f"q-{uuid.uuid4().hex[:12]}"
