"""Black-box tests: ``querator serve`` started as a user starts it, driven over HTTP on 127.0.0.1."""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from unittest import mock
from urllib.parse import urlsplit

import pytest

from querator.config import load_settings
from querator.localserver import LocalServer

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


@dataclass
class Reply:
    status: int
    body: Any


class Http:
    """A keep-alive HTTP/1.1 connection to the served API (one per thread)."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        assert parts.hostname == "127.0.0.1"
        self.base_url = base_url
        self._host, self._port = parts.hostname, parts.port or 80

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
        timeout: float = 30,
    ) -> Reply:
        connection = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        try:
            payload = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
            sent = {"Content-Type": "application/json", **(headers or {})}
            connection.request(method, path, body=payload, headers=sent)
            response = connection.getresponse()
            data = response.read()
        finally:
            connection.close()
        kind = response.getheader("Content-Type", "")
        return Reply(response.status, json.loads(data) if kind.startswith("application/json") else data)

    def post(self, path: str, body: Any = None, **kwargs: Any) -> Reply:
        return self.request("POST", path, {} if body is None else body, **kwargs)

    def ok(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        reply = self.post(path, body, **kwargs)
        assert reply.status == 200, (path, reply.body)
        return reply.body


@pytest.fixture
def api(served_url: str) -> Http:
    return Http(served_url)


@pytest.fixture
def queue_name() -> str:
    return f"q-{uuid.uuid4().hex[:10]}"


def decoded(items: list[dict[str, Any]]) -> list[bytes]:
    return [base64.b64decode(item.get("bytes", item.get("payload", ""))) for item in items]


def eventually(check: Callable[[], Any], *, timeout: float = 15.0, every: float = 0.1) -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout}s: last result {result!r}")
        time.sleep(every)


@contextlib.contextmanager
def in_process_server(**options: Any) -> Iterator[LocalServer]:
    """A ``LocalServer`` in this process on a free port (memory store, no reaper runs), stopped
    afterwards; it sets the variables it needs in this process, which are put back."""
    with mock.patch.dict(os.environ):
        load_settings.cache_clear()
        local = LocalServer(port=0, store="memory", reaper_interval=3600, **options).start()
        try:
            yield local
        finally:
            local.stop()
            load_settings.cache_clear()
