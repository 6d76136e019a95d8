"""Contract: ``queue.renew`` never leases an item for longer than its queue's ``expire_timeout``."""

from __future__ import annotations

from datetime import timedelta

import pytest

from querator.domain.errors import InvalidRequestError
from tests.contract.helpers import EXPIRE, items, make_queue


def _leased(service):
    make_queue(service)
    service.produce("jobs", items("a"))
    return service.lease("jobs", batch_size=1, client_id="c1", timeout=timedelta(0)).items[0]


def test_renew_refuses_a_lease_timeout_longer_than_expire_timeout_and_keeps_the_lease(service, clock):
    held = _leased(service)
    deadline = held.lease_deadline

    # Go's longest duration: it used to set the deadline in the year 2319.
    with pytest.raises(InvalidRequestError, match="lease_timeout may not be longer") as caught:
        service.renew("jobs", 0, [held.id], lease_timeout=timedelta(hours=2562047))

    assert caught.value.context["field"] == "lease_timeout"
    assert "9223369200s > 3600s" in str(caught.value)
    # Nothing was renewed: the lease still ends when it did.
    listed = service.list_items("jobs", 0)
    assert [(i.id, i.lease_deadline) for i in listed] == [(held.id, deadline)]


def test_renew_refuses_one_microsecond_past_expire_timeout(service):
    held = _leased(service)
    with pytest.raises(InvalidRequestError, match="expire_timeout"):
        service.renew("jobs", 0, [held.id], lease_timeout=EXPIRE + timedelta(microseconds=1))


def test_renew_takes_a_lease_timeout_equal_to_expire_timeout(service, clock):
    held = _leased(service)
    renewed = service.renew("jobs", 0, [held.id], lease_timeout=EXPIRE)
    assert [r.lease_deadline for r in renewed.items] == [clock.now() + EXPIRE]
