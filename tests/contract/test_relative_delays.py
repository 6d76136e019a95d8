"""Relative delays on every store: ``enqueue_in`` beside ``enqueue_at``, ``retry_in`` beside ``retry_at``.

A delay is counted from the service's clock at the call (the fake clock here), never the caller's.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from querator.domain.errors import InvalidRequestError, NothingToLeaseError
from querator.domain.model import NewItem, RetryRequest, StorageItem
from tests.contract.helpers import items, make_queue, payloads


def lease_payloads(service) -> list[bytes]:
    try:
        return payloads(service.lease("jobs", batch_size=10, client_id="c1", timeout=timedelta(0)).items)
    except NothingToLeaseError:
        return []


def test_enqueue_in_schedules_the_item_from_the_service_clock(service, clock):
    make_queue(service)
    service.produce("jobs", items("later", enqueue_in=timedelta(minutes=5)))
    service.produce("jobs", items("now"))

    scheduled = service.list_scheduled("jobs", 0)
    assert payloads(scheduled) == [b"later"]
    assert scheduled[0].enqueue_at == clock.now() + timedelta(minutes=5)
    now = service.lease("jobs", batch_size=10, client_id="c1").items
    assert payloads(now) == [b"now"]
    service.complete("jobs", 0, [now[0].id])

    clock.advance(timedelta(minutes=5) - timedelta(microseconds=1))
    assert lease_payloads(service) == []
    clock.advance(timedelta(microseconds=1))
    assert lease_payloads(service) == [b"later"]


def test_enqueue_in_zero_is_now(service):
    make_queue(service)
    service.produce("jobs", items("a", enqueue_in=timedelta(0)))

    assert service.list_scheduled("jobs", 0) == []
    assert lease_payloads(service) == [b"a"]


def test_retry_in_schedules_the_retried_item_from_the_service_clock(service, clock):
    make_queue(service)
    service.produce("jobs", items("a"))
    held = service.lease("jobs", batch_size=1, client_id="c1").items[0]
    clock.advance(timedelta(seconds=7))  # the delay counts from the retry, not from the lease

    outcome = service.retry("jobs", 0, [RetryRequest(id=held.id, retry_in=timedelta(seconds=30))])

    assert outcome.applied == [held.id]
    scheduled = service.list_scheduled("jobs", 0)
    assert payloads(scheduled) == [b"a"]
    assert scheduled[0].enqueue_at == clock.now() + timedelta(seconds=30)
    clock.advance(timedelta(seconds=29))
    assert lease_payloads(service) == []
    clock.advance(timedelta(seconds=1))
    assert lease_payloads(service) == [b"a"]


def test_import_takes_enqueue_in(service, clock):
    make_queue(service)
    service.import_items("jobs", 0, [StorageItem(payload=b"i", enqueue_in=timedelta(hours=1))])

    scheduled = service.list_scheduled("jobs", 0)
    assert payloads(scheduled) == [b"i"]
    assert scheduled[0].enqueue_at == clock.now() + timedelta(hours=1)


@pytest.mark.parametrize(
    "build",
    [
        lambda now: NewItem(payload=b"x", enqueue_in=timedelta(seconds=-1)),
        lambda now: NewItem(payload=b"x", enqueue_at=now, enqueue_in=timedelta(seconds=1)),
        lambda now: RetryRequest(id="x", retry_in=timedelta(seconds=-1)),
        lambda now: RetryRequest(id="x", retry_at=now, retry_in=timedelta(seconds=1)),
        lambda now: StorageItem(enqueue_at=now, enqueue_in=timedelta(seconds=1)),
    ],
    ids=["negative-enqueue_in", "both-enqueue", "negative-retry_in", "both-retry", "both-import"],
)
def test_a_negative_delay_or_both_forms_are_refused_naming_the_field(build, clock):
    with pytest.raises(InvalidRequestError) as refused:
        build(clock.now())
    assert refused.value.context["field"] in ("enqueue_in", "retry_in")


def test_a_delay_past_the_latest_schedulable_time_is_refused(service):
    make_queue(service)
    with pytest.raises(InvalidRequestError, match="enqueue_in must be before"):
        service.produce("jobs", items("x", enqueue_in=timedelta(days=365 * 2000)))
