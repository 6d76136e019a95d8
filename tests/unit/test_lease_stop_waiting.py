"""``QueueService.stop_waiting``: the hook ``querator serve`` uses on SIGTERM. A waiting lease looks
once more and answers (items, or nothing to lease) instead of waiting out its timeout; later leases do
not wait. On a fake clock: a wait that was not cut short would move it by the whole timeout."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

import pytest

from querator.domain.errors import LeaseRateLimitedError, NothingToLeaseError
from querator.domain.model import NewItem, QueueInfo, QueueUpdate
from querator.testing import EPOCH, FakeClock, memory_service

if TYPE_CHECKING:
    from querator.service import QueueService

WAIT = timedelta(seconds=20)


class StopDuringWait(FakeClock):
    """A fake clock on which the process is told to stop during the lease's first wait, after
    ``during`` has run (an item produced meanwhile, say)."""

    def __init__(self) -> None:
        super().__init__()
        self.service: QueueService | None = None
        self.during = lambda: None

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        if self.service is not None:
            self.during()
            self.service.stop_waiting()


@pytest.fixture
def clock() -> StopDuringWait:
    return StopDuringWait()


@pytest.fixture
def service(clock: StopDuringWait) -> QueueService:
    service = memory_service(clock=clock)
    service.create_queue(
        QueueInfo(
            name="jobs",
            lease_timeout=timedelta(minutes=1),
            expire_timeout=timedelta(hours=1),
            created_at=EPOCH,
            updated_at=EPOCH,
        )
    )
    clock.service = service
    return service


def test_a_waiting_lease_answers_nothing_to_lease_at_the_next_poll(
    service: QueueService, clock: StopDuringWait
) -> None:
    started = clock.now()
    with pytest.raises(NothingToLeaseError):
        service.lease("jobs", batch_size=5, client_id="c", timeout=WAIT)
    assert clock.now() - started < timedelta(seconds=1)  # one poll's pause, not the 20 s


def test_a_waiting_lease_answers_with_what_its_last_look_finds(
    service: QueueService, clock: StopDuringWait
) -> None:
    clock.during = lambda: service.produce("jobs", [NewItem(payload=b"late")])
    lease = service.lease("jobs", batch_size=5, client_id="c", timeout=WAIT)
    assert [item.payload for item in lease.items] == [b"late"]


def test_after_the_stop_a_lease_does_not_wait(service: QueueService, clock: StopDuringWait) -> None:
    service.stop_waiting()
    clock.service = None
    started = clock.now()
    with pytest.raises(NothingToLeaseError):
        service.lease("jobs", batch_size=1, client_id="c", timeout=WAIT)
    assert clock.now() - started < timedelta(seconds=1)


def test_a_lease_waiting_for_a_rate_limit_answers_within_one_poll(
    service: QueueService, clock: StopDuringWait
) -> None:
    service.update_queue(QueueUpdate(name="jobs", rate_limit=0.1))  # a lease every 10 s
    service.produce("jobs", [NewItem(payload=b"a"), NewItem(payload=b"b")])
    clock.service = None
    assert len(service.lease("jobs", batch_size=2, client_id="c", timeout=timedelta(0)).items) == 1
    clock.service = service
    start = clock.now()

    with pytest.raises(LeaseRateLimitedError):
        service.lease("jobs", batch_size=1, client_id="c", timeout=WAIT)

    # Not the 10 s to the next lease: one step of the wait, then the answer.
    assert clock.now() - start <= timedelta(milliseconds=250)
