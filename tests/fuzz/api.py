"""Helpers of the fuzz suites: a keep-alive client of the served API and the envelope check."""

from __future__ import annotations

import json
from typing import Any

import requests

#: A queue that exists for the whole session, so fuzzed writes can reach the store.
QUEUE = "fuzz"


class Api:
    """A keep-alive session on the server, with the helpers the suites share."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.session = requests.Session()

    def post(self, method: str, body: Any, *, content_type: str = "application/json") -> requests.Response:
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        return self.session.post(
            f"{self.url}/v1/{method}", data=data, headers={"Content-Type": content_type}, timeout=60
        )

    def counts(self, queue: str = QUEUE) -> list[tuple[int, int, int]]:
        """(total, leased, scheduled) per partition: what a rejected request must not change."""
        reply = self.post("queue.stats", {"queue_name": queue})
        assert reply.status_code == 200, reply.text
        partitions = reply.json()["logicalQueues"][0]["partitions"]
        return [(p.get("total", 0), p.get("total_leased", 0), p.get("scheduled", 0)) for p in partitions]


def assert_envelope(response: requests.Response) -> None:
    """No server error, and every error is the contract's envelope with ``code`` = the HTTP status.

    501 is the contract's answer to an unknown path ("no such method"), not a server error.
    """
    assert response.status_code < 500 or response.status_code == 501, (
        f"{response.status_code}: {response.text[:300]}"
    )
    if response.status_code >= 400:
        body = response.json()
        assert set(body) == {"code", "code_text", "message"}, body
        assert body["code"] == response.status_code
        assert isinstance(body["message"], str)
        assert body["message"]
