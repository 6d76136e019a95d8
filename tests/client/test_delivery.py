"""A queue's ``delivery`` and ``max_leased_per_group`` through the client: ``create_queue`` against
``querator serve`` (read back by ``queue_info`` and ``list_queues``, ``"fifo"`` / 0 when not given),
bad values refused by the server with a 400 naming the field, the wire bodies (sent only when given,
so older servers take them), and replies without them (an older server: ``"fifo"`` / 0)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest

from querator.client import BadRequestError, Client, QueueInfo, QueueNotFoundError

if TYPE_CHECKING:
    from tests.client.fakeserver import FakeServer

BAD_DELIVERIES = ["lifo", "FAIR", "", 1, True]
BAD_MAXIMA = [-1, 1_000_001, "3", 2.5, True]


# -- against querator serve ---------------------------------------------------------------------------


def test_a_fair_queue_reads_back_with_its_group_limit(client: Client, queue_name: str) -> None:
    client.create_queue(
        queue_name, lease_timeout="30s", expire_timeout="1h", delivery="fair", max_leased_per_group=3
    )

    info = client.queue_info(queue_name)

    assert (info.delivery, info.max_leased_per_group) == ("fair", 3)
    [listed] = client.list_queues(pivot=queue_name, limit=1)
    assert (listed.queue_name, listed.delivery, listed.max_leased_per_group) == (queue_name, "fair", 3)
    assert (info.to_wire()["delivery"], info.to_wire()["max_leased_per_group"]) == ("fair", 3)


def test_a_queue_created_without_them_is_fifo_without_a_limit(client: Client, queue_name: str) -> None:
    client.create_queue(queue_name, lease_timeout="30s", expire_timeout="1h")
    info = client.queue_info(queue_name)
    assert (info.delivery, info.max_leased_per_group) == ("fifo", 0)
    client.create_queue(f"{queue_name}-f", lease_timeout="30s", expire_timeout="1h", delivery="fifo")
    assert client.queue_info(f"{queue_name}-f").delivery == "fifo"


@pytest.mark.parametrize("bad", BAD_DELIVERIES, ids=repr)
def test_a_bad_delivery_is_a_400_naming_it_and_creates_nothing(
    client: Client, queue_name: str, bad: Any
) -> None:
    with pytest.raises(BadRequestError, match=r"delivery: ") as caught:
        client.create_queue(queue_name, lease_timeout="30s", expire_timeout="1h", delivery=bad)
    assert not isinstance(caught.value, QueueNotFoundError)
    with pytest.raises(QueueNotFoundError):
        client.queue_info(queue_name)


@pytest.mark.parametrize("bad", BAD_MAXIMA, ids=repr)
def test_a_bad_max_leased_per_group_is_a_400_naming_it_and_creates_nothing(
    client: Client, queue_name: str, bad: Any
) -> None:
    with pytest.raises(BadRequestError, match=r"max_leased_per_group: "):
        client.create_queue(
            queue_name, lease_timeout="30s", expire_timeout="1h", delivery="fair", max_leased_per_group=bad
        )
    with pytest.raises(QueueNotFoundError):
        client.queue_info(queue_name)


def test_update_refuses_bad_values_naming_the_field(client: Client, queue_name: str) -> None:
    client.create_queue(queue_name, lease_timeout="30s", expire_timeout="1h")
    with pytest.raises(BadRequestError, match=r"delivery: "):
        client.update_queue(queue_name, delivery="round-robin")
    with pytest.raises(BadRequestError, match=r"max_leased_per_group: "):
        client.update_queue(queue_name, max_leased_per_group=-1)
    info = client.queue_info(queue_name)
    assert (info.delivery, info.max_leased_per_group) == ("fifo", 0)


# -- wire bodies, against the scripted fake ------------------------------------------------------------


def _sent(fake: FakeServer, path: str) -> list[dict[str, Any]]:
    return [s.json() for s in fake.seen if s.plain == path]


def test_they_are_sent_only_when_given(fake: FakeServer, fake_client: Client) -> None:
    fake_client.create_queue("a", lease_timeout="30s", expire_timeout="1h")
    fake_client.create_queue(
        "b", lease_timeout="30s", expire_timeout="1h", delivery="fair", max_leased_per_group=0
    )
    fake_client.update_queue("a", max_attempts=2)
    fake_client.update_queue("b", delivery="fifo", max_leased_per_group=5)

    created = _sent(fake, "/v1/queues.create")
    assert ["delivery" in body or "max_leased_per_group" in body for body in created] == [False, True]
    assert (created[1]["delivery"], created[1]["max_leased_per_group"]) == ("fair", 0)
    updated = _sent(fake, "/v1/queues.update")
    assert updated == [
        {"queue_name": "a", "max_attempts": 2},
        {"queue_name": "b", "delivery": "fifo", "max_leased_per_group": 5},
    ]


def test_a_reply_without_them_reads_as_fifo_without_a_limit() -> None:
    old = {"queue_name": "q", "lease_timeout": "30s", "expire_timeout": "1h0m0s"}
    info = QueueInfo.from_wire(old)
    assert (info.delivery, info.max_leased_per_group) == ("fifo", 0)
    assert info.lease_timeout == timedelta(seconds=30)
    fair = QueueInfo.from_wire({**old, "delivery": "fair", "max_leased_per_group": 4})
    assert (fair.delivery, fair.max_leased_per_group) == ("fair", 4)
    assert {"delivery": "fair", "max_leased_per_group": 4}.items() <= fair.to_wire().items()
