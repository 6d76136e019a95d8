"""The lease reply cap (docs/api.md, "Limits"): a reply never passes ``MAX_REPLY_BYTES`` however the
large items got into the queue (a produce, an idempotent produce, a retry that moved them), and
what it cannot carry is left unclaimed, leased once later. Every store, either engine."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from querator.api import schemas
from querator.domain.errors import NothingToLeaseError
from querator.domain.model import NewItem, RetryRequest
from querator.service import CURSOR_LAG, MAX_REPLY_BYTES
from tests.contract.helpers import make_queue

if TYPE_CHECKING:
    from querator.service import QueueService
    from querator.testing import FakeClock

#: 20 items of 300,000 bytes: 8 MB of base64, more than one reply carries.
COUNT, SIZE = 20, 300_000


def _large() -> list[NewItem]:
    return [NewItem(payload=bytes([i]) * SIZE) for i in range(COUNT)]


def _produce(service: QueueService, clock: FakeClock, how: str) -> None:
    if how == "produce":
        service.produce("jobs", _large())
    elif how == "idempotent produce":
        service.produce("jobs", _large(), idempotency_key="large-1")
    else:
        # Each item leased alone and retried: they wait again at the tail, where the retry's move
        # wrote them (the claims passed where the produce put them).
        service.produce("jobs", _large())
        clock.advance(CURSOR_LAG * 2)
        for _ in range(COUNT):
            lease = service.lease("jobs", batch_size=1, client_id="mover")
            service.retry("jobs", lease.partition, [RetryRequest(id=i.id) for i in lease.items])
    clock.advance(CURSOR_LAG * 2)


@pytest.mark.parametrize("how", ["produce", "idempotent produce", "retried"])
def test_a_lease_reply_of_large_items_stays_under_the_cap(
    service: QueueService, clock: FakeClock, how: str
) -> None:
    make_queue(service)
    _produce(service, clock, how)

    first = service.lease("jobs", batch_size=COUNT, client_id="c")
    wire = json.dumps(schemas.LeaseResponse.from_domain(first).to_wire())

    assert 0 < len(first.items) < COUNT
    assert len(wire.encode()) <= MAX_REPLY_BYTES
    # Nothing was claimed that the reply did not carry: every other item is leased once later.
    rest = []
    while True:
        try:
            lease = service.lease("jobs", batch_size=COUNT, client_id="c")
        except NothingToLeaseError:
            break
        assert len(json.dumps(schemas.LeaseResponse.from_domain(lease).to_wire()).encode()) <= MAX_REPLY_BYTES
        rest += lease.items
    assert sorted(i.payload[0] for i in first.items + rest) == list(range(COUNT))


def test_a_queue_that_once_held_a_large_item_leases_full_batches_again(
    service: QueueService, clock: FakeClock
) -> None:
    make_queue(service)
    service.produce("jobs", [NewItem(payload=b"x" * SIZE)])
    clock.advance(CURSOR_LAG * 2)
    big = service.lease("jobs", batch_size=1, client_id="c")
    assert not service.complete("jobs", big.partition, [i.id for i in big.items]).failed

    service.produce("jobs", [NewItem(payload=f"small-{n}".encode()) for n in range(500)])
    clock.advance(CURSOR_LAG * 2)

    # The large item is gone: 500 small ones fit one reply (sized by one large item, 9 would).
    assert len(service.lease("jobs", batch_size=500, client_id="c").items) == 500
