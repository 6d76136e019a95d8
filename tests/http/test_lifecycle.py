"""The whole item lifecycle through ``querator serve``, as a client sees it.

Times here are real (the server's clock); anything that waits for a lease or a schedule to run out
polls with a deadline instead of sleeping a fixed time.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.http.conftest import Http, decoded, eventually

pytestmark = pytest.mark.server


def create(api: Http, name: str, **fields: Any) -> None:
    api.ok(
        "/v1/queues.create", {"queue_name": name, "lease_timeout": "30s", "expire_timeout": "1h", **fields}
    )


def produce(api: Http, name: str, *texts: str, headers: dict[str, str] | None = None) -> None:
    api.ok("/v1/queue.produce", {"queue_name": name, "items": [{"utf8": t} for t in texts]}, headers=headers)


def lease(api: Http, name: str, batch: int = 10, client: str = "c1", timeout: str | None = None) -> Any:
    body = {"queue_name": name, "batch_size": batch, "client_id": client}
    if timeout:
        body["request_timeout"] = timeout
    return api.post("/v1/queue.lease", body)


def totals(api: Http, name: str) -> list[tuple[int, int, int]]:
    stats = api.ok("/v1/queue.stats", {"queue_name": name})
    return [(p["total"], p["total_leased"], p["scheduled"]) for p in stats["logicalQueues"][0]["partitions"]]


def rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def test_produce_lease_complete_and_retry_now_later_dead(api, queue_name):
    dead = f"{queue_name}-dead"
    create(api, dead)
    create(api, queue_name, dead_queue=dead)
    produce(api, queue_name, "done", "again", "later", "dead")

    leased = lease(api, queue_name).body
    ids = {
        payload.decode(): item["id"]
        for payload, item in zip(decoded(leased["items"]), leased["items"], strict=True)
    }
    assert list(ids) == ["done", "again", "later", "dead"] and all(
        i["attempts"] == 1 for i in leased["items"]
    )
    api.ok("/v1/queue.complete", {"queue_name": queue_name, "partition": 0, "ids": [ids["done"]]})
    retry_at = rfc3339(datetime.now(UTC) + timedelta(seconds=1))
    api.ok(
        "/v1/queue.retry",
        {
            "queue_name": queue_name,
            "partition": 0,
            "items": [
                {"id": ids["again"]},
                {"id": ids["later"], "retry_at": retry_at},
                {"id": ids["dead"], "dead": True},
            ],
        },
    )
    # Retried now: leasable again at once, under a new id, with its attempts counted.
    again = lease(api, queue_name).body["items"]
    assert decoded(again) == [b"again"] and again[0]["id"] != ids["again"] and again[0]["attempts"] == 2
    # Retried later: scheduled until retry_at, then leasable.
    scheduled = api.ok("/v1/storage/scheduled.list", {"queue_name": queue_name, "partition": 0})["items"]
    assert decoded(scheduled) == [b"later"]
    later = eventually(lambda: lease(api, queue_name).body.get("items"))
    assert decoded(later) == [b"later"]
    # Dead: in the dead-letter queue, naming its last id in the source queue.
    in_dead = api.ok("/v1/storage/items.list", {"queue_name": dead, "partition": 0})["items"]
    assert decoded(in_dead) == [b"dead"] and in_dead[0]["source_id"] == ids["dead"]
    # The stale id of a retried item can no longer act.
    stale = api.post("/v1/queue.complete", {"queue_name": queue_name, "partition": 0, "ids": [ids["again"]]})
    assert stale.status == 400 and ids["again"] in stale.body["message"]


def test_renew_keeps_a_lease_past_its_first_deadline(api, queue_name):
    create(api, queue_name, lease_timeout="1s")
    produce(api, queue_name, "slow")
    item = lease(api, queue_name).body["items"][0]
    renewed = api.ok(
        "/v1/queue.renew",
        {"queue_name": queue_name, "partition": 0, "ids": [item["id"]], "lease_timeout": "1m"},
    )
    assert renewed["items"][0]["id"] == item["id"]
    assert renewed["items"][0]["lease_deadline"] > item["lease_deadline"]
    time.sleep(1.2)  # past the first deadline; the renewed lease must hold
    assert lease(api, queue_name, client="c2").status == 454
    api.ok("/v1/queue.complete", {"queue_name": queue_name, "partition": 0, "ids": [item["id"]]})


def test_an_expired_lease_puts_the_item_at_the_tail_under_a_new_id(api, queue_name):
    create(api, queue_name, lease_timeout="1s")
    produce(api, queue_name, "first")
    produce(api, queue_name, "second")
    held = lease(api, queue_name, batch=1).body["items"][0]
    assert decoded([held]) == [b"first"]

    # Nobody completes it. Watch (without leasing) until its lease has run out...
    def lease_ran_out() -> bool:
        listed = api.ok("/v1/storage/items.list", {"queue_name": queue_name, "partition": 0})["items"]
        return not any(i["is_leased"] for i in listed)

    eventually(lease_ran_out)
    # ...then it comes back behind "second", under a new id, with its attempts counted.
    items = lease(api, queue_name, batch=2, client="c2").body["items"]
    assert decoded(items) == [b"second", b"first"]
    assert items[1]["id"] != held["id"] and items[1]["attempts"] == 2
    stale = api.post("/v1/queue.complete", {"queue_name": queue_name, "partition": 0, "ids": [held["id"]]})
    assert stale.status == 400


def test_max_attempts_sends_an_item_to_the_dead_letter_queue(api, queue_name):
    dead = f"{queue_name}-dead"
    create(api, dead)
    create(api, queue_name, dead_queue=dead, max_attempts=1, lease_timeout="1s")
    produce(api, queue_name, "poison")
    held = lease(api, queue_name).body["items"][0]
    # Nobody completes it; once its lease ran out the reaper (every 0.5 s) or the next lease
    # dead-letters it. The check leases too: the session's server holds every test's queues, and on a
    # loaded machine a reaper pass over them all once took longer than the wait (CI, 2026-11-26).

    def dead_letters() -> list[dict[str, Any]]:
        assert lease(api, queue_name, timeout="0s").status == 454  # never the poison item again
        return list(api.ok("/v1/storage/items.list", {"queue_name": dead, "partition": 0})["items"])

    moved = eventually(dead_letters)
    assert decoded(moved) == [b"poison"] and moved[0]["source_id"] == held["id"]
    assert totals(api, queue_name) == [(0, 0, 0)]


def test_scheduled_items_are_invisible_until_enqueue_at(api, queue_name):
    create(api, queue_name)
    at = rfc3339(datetime.now(UTC) + timedelta(seconds=1.5))
    api.ok(
        "/v1/queue.produce",
        {
            "queue_name": queue_name,
            "items": [{"utf8": "s1", "enqueue_at": at}, {"utf8": "s2", "enqueue_at": at}],
        },
    )
    assert lease(api, queue_name).status == 454
    assert totals(api, queue_name) == [(0, 0, 2)]
    items = eventually(lambda: lease(api, queue_name).body.get("items"))
    assert decoded(items) == [b"s1", b"s2"]  # produce order for equal times


def test_partitions_fill_evenly_and_one_consumer_drains_them_all(api, queue_name):
    create(api, queue_name, requested_partitions=3)
    for n in range(6):
        produce(api, queue_name, f"item-{n}")
    assert [t[0] for t in totals(api, queue_name)] == [2, 2, 2]
    seen: list[bytes] = []
    partitions = set()
    for _ in range(6):
        reply = lease(api, queue_name)
        if reply.status == 454:
            break
        partitions.add(reply.body["partition"])
        seen += decoded(reply.body["items"])
        ids = [i["id"] for i in reply.body["items"]]
        api.ok(
            "/v1/queue.complete", {"queue_name": queue_name, "partition": reply.body["partition"], "ids": ids}
        )
    assert sorted(seen) == [f"item-{n}".encode() for n in range(6)] and partitions == {0, 1, 2}


def test_idempotent_produce_over_http(api, queue_name):
    create(api, queue_name)
    for _ in range(3):
        produce(api, queue_name, "once", headers={"Idempotency-Key": f"key-{queue_name}"})
    assert totals(api, queue_name) == [(1, 0, 0)]


def test_a_waiting_lease_returns_as_soon_as_an_item_is_produced(api, queue_name):
    create(api, queue_name)
    result: dict[str, Any] = {}

    def wait() -> None:
        started = time.monotonic()
        result["reply"] = lease(api, queue_name, timeout="15s")
        result["elapsed"] = time.monotonic() - started

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.5)
    # The same client waiting twice on one queue is refused while the first waits.
    duplicate = lease(api, queue_name, client="c1", timeout="1s")
    produce(api, queue_name, "wake up")
    waiter.join(timeout=20)
    assert duplicate.status == 400 and "client" in duplicate.body["message"].lower()
    assert result["reply"].status == 200 and decoded(result["reply"].body["items"]) == [b"wake up"]
    assert result["elapsed"] < 10, "the lease waited for its timeout instead of returning the new item"


def test_stats_clear_and_storage_inspection(api, queue_name):
    create(api, queue_name)
    produce(api, queue_name, *[f"i{n}" for n in range(5)])
    first = api.ok("/v1/storage/items.list", {"queue_name": queue_name, "partition": 0, "limit": 3})["items"]
    second = api.ok(
        "/v1/storage/items.list",
        {"queue_name": queue_name, "partition": 0, "pivot": first[-1]["id"], "limit": 3},
    )["items"]
    assert decoded(first + second[1:]) == [f"i{n}".encode() for n in range(5)]
    lease(api, queue_name, batch=1)
    assert totals(api, queue_name) == [(5, 1, 0)]
    api.ok("/v1/queue.clear", {"queue_name": queue_name, "queue": True})
    assert totals(api, queue_name) == [(1, 1, 0)]
    api.ok("/v1/queue.clear", {"queue_name": queue_name, "queue": True, "destructive": True})
    assert totals(api, queue_name) == [(0, 0, 0)]
    imported = api.ok(
        "/v1/storage/items.import",
        {"queue_name": queue_name, "partition": 0, "items": [{"source_id": "s", "payload": "aGk="}]},
    )["items"]
    api.ok("/v1/storage/items.delete", {"queue_name": queue_name, "partition": 0, "ids": [imported[0]["id"]]})
    assert totals(api, queue_name) == [(0, 0, 0)]


def test_deleting_a_queue_removes_its_items(api, queue_name):
    create(api, queue_name)
    produce(api, queue_name, "a")
    api.ok("/v1/queues.delete", {"queue_name": queue_name})
    assert api.post("/v1/queue.stats", {"queue_name": queue_name}).status == 400
    create(api, queue_name)
    assert totals(api, queue_name) == [(0, 0, 0)]
