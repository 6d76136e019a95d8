"""``querator serve`` stopped with SIGTERM while consumers wait and leases are being claimed: every
client gets an HTTP answer, no item stays leased to nobody, and the server exits 0."""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

from tests.http.conftest import Http, decoded, eventually

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.server, pytest.mark.slow]

WAITERS = 8
BATCH = 3
ITEMS_PER_ROUND = 16
ROUNDS = 3


def _serve(store: str) -> tuple[subprocess.Popen[str], str]:
    child = subprocess.Popen(  # noqa: S603 - our own module
        [sys.executable, "-m", "querator.cli", "serve", "--port", "0", "--store", store, "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    line = child.stdout.readline().strip()
    assert line.startswith("Querator listening on http://127.0.0.1:"), line
    return child, line.removeprefix("Querator listening on ")


def _lease(port: int, queue_name: str, client_id: str) -> tuple[int, Any]:
    """One long-poll on a connection of its own; raises if the connection drops without a reply."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = {"queue_name": queue_name, "batch_size": BATCH, "client_id": client_id, "request_timeout": "20s"}
    try:
        connection.request("POST", "/v1/queue.lease", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def _waiting(api: Http, queue_name: str, client_id: str) -> bool:
    """True when ``client_id``'s lease waits: a lease with its id (which never waits) is refused."""
    body = {"queue_name": queue_name, "batch_size": 1, "client_id": client_id, "request_timeout": "0s"}
    reply = api.post("/v1/queue.lease", body)
    return reply.status == 400 and "already has a waiting lease" in reply.body["message"]


def _consume(
    port: int, queue_name: str, client_id: str, answers: list[tuple[int, Any]], failures: list[Exception]
) -> None:
    try:
        while True:
            status, body = _lease(port, queue_name, client_id)
            # The test's probe (``_waiting``) held this client id for a moment: lease again, as a
            # consumer does on this 400.
            if status != 400 or "already has a waiting lease" not in body["message"]:
                break
        answers.append((status, body))
    except Exception as exc:  # a dropped connection is what the test looks for
        failures.append(exc)


def _stop_under_load(store: str, round_: int) -> tuple[list[str], list[str]]:
    """Start the server, make every consumer wait, produce and SIGTERM at once; the payloads produced
    and those delivered in replies."""
    child, url = _serve(store)
    try:
        api = Http(url)
        port = int(url.rsplit(":", 1)[1])
        # A queue per round: items one round left leasable would not let the next round's consumers wait.
        # Leases far longer than the test: an item leased to nobody would not come back in it.
        queue_name = f"jobs-{round_}"
        api.ok(
            "/v1/queues.create", {"queue_name": queue_name, "lease_timeout": "10m", "expire_timeout": "1h"}
        )
        answers: list[tuple[int, Any]] = []
        failures: list[Exception] = []
        names = [f"r{round_}-c{n}" for n in range(WAITERS)]
        consumers = [
            threading.Thread(target=_consume, args=(port, queue_name, name, answers, failures))
            for name in names
        ]
        for thread in consumers:
            thread.start()
        for name in names:
            eventually(lambda name=name: _waiting(api, queue_name, name))
        # Items arrive while every consumer waits, and the server is told to stop right away: some
        # leases are claiming items at that moment, the others are still waiting.
        produced = [f"r{round_}-i{n}" for n in range(ITEMS_PER_ROUND)]
        api.ok("/v1/queue.produce", {"queue_name": queue_name, "items": [{"utf8": p} for p in produced]})
        started = time.monotonic()
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=15)
        stopped = time.monotonic() - started
        for thread in consumers:
            thread.join(timeout=10)
    finally:
        if child.poll() is None:  # the test failed before its SIGTERM: the child goes anyway
            child.kill()
            child.communicate(timeout=15)

    assert failures == [], failures
    assert child.returncode == 0, err
    assert "Traceback" not in err, err
    # Each got its answer: items, or the contract's "nothing to lease".
    assert len(answers) == WAITERS, answers
    assert {status for status, _ in answers} <= {200, 454}, answers
    assert stopped < 5, stopped  # the waits end at once; nothing needs the whole grace
    delivered = [p.decode() for status, body in answers if status == 200 for p in decoded(body["items"])]
    return produced, delivered


def test_sigterm_answers_every_client_and_leaves_nothing_leased_to_nobody(tmp_path: Path) -> None:
    store = f"sqlite:{tmp_path / 'querator.db'}"
    produced: list[str] = []
    delivered: list[str] = []
    for round_ in range(ROUNDS):
        more, got = _stop_under_load(store, round_)
        produced += more
        delivered += got

    # Restarted on the same file: each item is in a reply a consumer got, or leasable at once.
    child, url = _serve(store)
    try:
        api = Http(url)
        leasable: list[str] = []
        for round_ in range(ROUNDS):
            while True:
                body = {"queue_name": f"jobs-{round_}", "batch_size": 100, "client_id": "after"}
                reply = api.post("/v1/queue.lease", {**body, "request_timeout": "0s"})
                if reply.status == 454:
                    break
                assert reply.status == 200, reply.body
                leasable += [p.decode() for p in decoded(reply.body["items"])]
    finally:
        child.send_signal(signal.SIGTERM)
        child.communicate(timeout=15)
    assert len(delivered) == len(set(delivered))
    assert sorted(delivered + leasable) == sorted(produced)
    assert child.returncode == 0
