"""Item priorities through the client: ``NewItem(priority=)`` and ``retry(priority=)`` against
``querator serve`` (lower leases first, ``.priority`` on what comes back), the wire bodies (no
``priority`` key for the default, so older servers take them), replies without one (5), and bad
priorities refused with ``ValueError`` before anything is sent."""

from __future__ import annotations

import re
import threading
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest

from querator.client import Client, LeasedItem, NewItem, RetryItem, StoredItem
from querator.client import models as client_models
from querator.domain import priority as domain_priority
from querator.domain.ids import _ID_PATTERN

if TYPE_CHECKING:
    from tests.client.fakeserver import FakeServer

BAD_PRIORITIES = [10, -1, "x", "3", 2.5, True, None]
BAD_IDS = ["10", "-1", "x", "'3'", "2.5", "True", "None"]


def _create(client: Client, name: str) -> str:
    client.create_queue(name, lease_timeout="30s", expire_timeout="1h")
    return name


def _band_of(item_id: str, priority: int) -> bool:
    """The id has the shape the server mints for ``priority`` (docs: ``.0``-``.4``, none, ``p6``-``p9``
    in front): engine v3's position (``l`` and 16 hex digits) or engine v2's 30 hex digits."""
    prefix = domain_priority.BANDS[priority]
    return (
        _ID_PATTERN.fullmatch(item_id) is not None
        and re.fullmatch(rf"{re.escape(prefix)}(l[0-9a-f]{{16}}|[0-9a-f]{{30}})", item_id) is not None
    )


def test_the_clients_priority_bounds_are_the_servers() -> None:
    assert (client_models.MIN_PRIORITY, client_models.MAX_PRIORITY, client_models.DEFAULT_PRIORITY) == (
        domain_priority.MIN_PRIORITY,
        domain_priority.MAX_PRIORITY,
        domain_priority.DEFAULT_PRIORITY,
    )


# -- against querator serve ---------------------------------------------------------------------------


def test_produce_with_priorities_leases_lowest_priority_first(client: Client, queue_name: str) -> None:
    _create(client, queue_name)
    client.produce(
        queue_name,
        [
            NewItem(payload=b"late-1", priority=9),
            b"default-1",
            NewItem(payload=b"urgent", priority=0),
            NewItem(payload=b"soon", priority=3),
            NewItem(payload=b"default-2", priority=5),
            NewItem(payload=b"late-2", priority=9),
        ],
    )

    listed = client.list_items(queue_name)
    lease = client.lease(queue_name, 10, request_timeout="1s")

    expected = [
        (b"urgent", 0),
        (b"soon", 3),
        (b"default-1", 5),
        (b"default-2", 5),
        (b"late-1", 9),
        (b"late-2", 9),
    ]
    assert [(i.payload, i.priority) for i in lease.items] == expected
    assert [(i.payload, i.priority) for i in listed] == expected
    assert all(_band_of(i.id, i.priority) for i in lease.items), lease.ids
    # The ids of other priorities work like any other: complete takes them.
    client.complete(queue_name, lease.items)
    assert client.stats(queue_name).total == 0


def test_retry_with_a_priority_puts_the_item_back_with_it(client: Client, queue_name: str) -> None:
    _create(client, queue_name)
    client.produce(queue_name, [b"a", b"b", b"c"])
    first = client.lease(queue_name, 1).items[0]
    assert (first.payload, first.priority) == (b"a", 5)

    # The convenience argument: back ahead of everything of priority 5.
    client.retry(queue_name, [first], priority=0)
    again = client.lease(queue_name, 1).items[0]
    assert (again.payload, again.priority) == (b"a", 0)
    assert _band_of(again.id, 0)

    # A RetryItem of its own: back behind everything else.
    client.retry(queue_name, [RetryItem(id=again.id, priority=8)], partition=again.partition)
    rest = client.lease(queue_name, 3, request_timeout="1s")
    assert [(i.payload, i.priority) for i in rest.items] == [(b"b", 5), (b"c", 5), (b"a", 8)]

    # Without a priority an item keeps the one it has.
    client.retry(queue_name, [rest.items[2]])
    kept = client.lease(queue_name, 1).items[0]
    assert (kept.payload, kept.priority) == (b"a", 8)


def test_reprioritize_moves_waiting_items_and_leased_ones_go_back_with_it(
    client: Client, queue_name: str
) -> None:
    _create(client, queue_name)
    client.produce(queue_name, [b"a", b"b", b"c"])
    leased = client.lease(queue_name, 1).items[0]
    waiting = client.list_items(queue_name)[1:]
    assert [i.payload for i in waiting] == [b"b", b"c"]

    moved = client.reprioritize(queue_name, [waiting[1]], 1)
    kept = client.reprioritize(queue_name, [leased], 9)

    assert list(moved) == [waiting[1].id]
    assert _band_of(moved[waiting[1].id], 1)
    assert kept == {leased.id: leased.id}
    client.retry(queue_name, [leased])
    lease = client.lease(queue_name, 3, request_timeout="1s")
    assert [(i.payload, i.priority) for i in lease.items] == [(b"c", 1), (b"b", 5), (b"a", 9)]


def test_a_failed_handlers_retry_keeps_the_items_priority(client: Client, queue_name: str) -> None:
    _create(client, queue_name)
    client.produce(queue_name, [NewItem(payload=b"x", priority=2)])
    seen: list[tuple[int, int]] = []

    def handler(item: LeasedItem) -> None:
        seen.append((item.attempts, item.priority))
        if item.attempts == 1:
            raise RuntimeError("first attempt fails")

    report = client.consume(
        queue_name,
        handler,
        backoff=lambda attempts: timedelta(milliseconds=50),
        idle_timeout=1.0,
        idle_backoff=0.1,
        handle_signals=False,
        stop=threading.Event(),
    )

    assert seen == [(1, 2), (2, 2)]
    assert (report.retried, report.completed) == (1, 1)


def test_import_keeps_the_priority_of_listed_items(client: Client, queue_name: str) -> None:
    source = _create(client, f"{queue_name}-src")
    target = _create(client, queue_name)
    client.produce(source, [NewItem(payload=b"two", priority=2), b"five"])

    imported = client.import_items(target, client.list_items(source))

    assert len(imported.ids) == 2
    assert [(i.payload, i.priority) for i in client.list_items(target)] == [(b"two", 2), (b"five", 5)]


@pytest.mark.parametrize("bad", BAD_PRIORITIES, ids=BAD_IDS)
def test_a_bad_priority_is_refused_and_nothing_is_stored(client: Client, queue_name: str, bad: Any) -> None:
    _create(client, queue_name)
    with pytest.raises(ValueError, match=r"^priority must be"):
        client.produce(queue_name, [b"ok", NewItem(payload=b"bad", priority=bad)])
    assert client.stats(queue_name).total == 0


# -- wire bodies, against the scripted fake ------------------------------------------------------------


def _sent(fake: FakeServer, path: str) -> dict[str, Any]:
    bodies = [s.json() for s in fake.seen if s.plain == path]
    assert len(bodies) == 1, bodies
    body: dict[str, Any] = bodies[0]
    return body


def test_a_default_priority_is_not_sent_so_older_servers_take_the_body(
    fake: FakeServer, fake_client: Client
) -> None:
    fake_client.produce("q", [b"plain", NewItem(payload="five", priority=5), NewItem(payload="", priority=0)])
    fake_client.retry("q", [RetryItem(id="a" * 30), RetryItem(id="b" * 30, priority=7)])
    fake_client.retry("q", ["c" * 30], priority=9)
    fake_client.import_items(
        "q", [StoredItem(id="d" * 30, payload=b""), StoredItem(id="e", payload=b"", priority=1)]
    )

    produced = _sent(fake, "/v1/queue.produce")["items"]
    assert produced == [{"bytes": "cGxhaW4="}, {"utf8": "five"}, {"utf8": "", "priority": 0}]
    retried = [s.json()["items"] for s in fake.seen if s.plain == "/v1/queue.retry"]
    assert retried == [[{"id": "a" * 30}, {"id": "b" * 30, "priority": 7}], [{"id": "c" * 30, "priority": 9}]]
    imported = _sent(fake, "/v1/storage/items.import")["items"]
    assert ["priority" in i for i in imported] == [False, True]
    assert imported[1]["priority"] == 1


@pytest.mark.parametrize("bad", BAD_PRIORITIES[:-1], ids=BAD_IDS[:-1])
def test_a_bad_priority_raises_value_error_before_anything_is_sent(
    fake: FakeServer, fake_client: Client, bad: Any
) -> None:
    with pytest.raises(ValueError, match=r"^priority must be"):
        NewItem(payload=b"x", priority=bad)
    with pytest.raises(ValueError, match=r"^priority must be"):
        RetryItem(id="a" * 30, priority=bad)
    with pytest.raises(ValueError, match=r"^priority must be"):
        fake_client.retry("q", ["a" * 30], priority=bad)
    with pytest.raises(ValueError, match=r"^priority must be"):
        fake_client.reprioritize("q", ["a" * 30], bad)
    # Even when every item is a RetryItem of its own, the argument is checked.
    with pytest.raises(ValueError, match=r"^priority must be"):
        fake_client.retry("q", [RetryItem(id="a" * 30)], priority=bad)
    assert fake.seen == []


def test_the_value_error_says_what_a_priority_is() -> None:
    with pytest.raises(
        ValueError, match=r"^priority must be between 0 and 9 \(lower leases first\), not 10$"
    ):
        NewItem(priority=10)
    with pytest.raises(ValueError, match=r"^priority must be an integer between 0 and 9, not 'x'$"):
        RetryItem(id="a", priority="x")  # type: ignore[arg-type]


def test_replies_without_a_priority_read_as_the_default() -> None:
    old = {"id": "a" * 30, "attempts": 1, "bytes": "eA"}
    assert LeasedItem.from_wire(old, partition=0).priority == 5
    assert LeasedItem.from_wire({**old, "id": ".1" + "a" * 30, "priority": 1}, partition=0).priority == 1
    assert StoredItem.from_wire({"id": "a" * 30}).priority == 5
    assert StoredItem.from_wire({"id": "p7" + "a" * 30, "priority": 7}).priority == 7
    # And the output shapes carry it.
    assert LeasedItem.from_wire(old, partition=0).to_wire()["priority"] == 5
    assert StoredItem.from_wire({"id": "a", "priority": 3}).to_wire()["priority"] == 3
