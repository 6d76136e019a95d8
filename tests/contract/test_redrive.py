"""Contract: ``queue.redrive`` moves dead letters back, each exactly once, on every store."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from querator.domain.errors import InvalidRequestError, NothingToLeaseError, StoreUnavailableError
from querator.domain.model import RetryRequest, StorageItem
from tests.contract.helpers import beside, items, make_queue, payloads


def dead_letter(service, queue: str, *values: str, **fields: Any) -> list[str]:
    """Produce ``values`` to ``queue``, lease them and retry them into its dead-letter queue."""
    service.produce(queue, items(*values, **fields))
    leased = service.lease(queue, batch_size=len(values), client_id="c")
    requests = [RetryRequest(id=item.id, dead=True) for item in leased.items]
    assert len(service.retry(queue, leased.partition, requests).applied) == len(values)
    return [item.id for item in leased.items]


def stored(service, queue: str) -> list[Any]:
    info = service.get_queue(queue)
    return [item for p in range(info.partitions) for item in service.list_items(queue, p)]


def counters(service, queue: str) -> int:
    return sum(p.total + p.scheduled for p in service.stats(queue))


def test_dead_letters_go_back_to_their_queue_as_new_items_with_attempts_reset(service, clock):
    make_queue(service, "dlq")
    make_queue(service, "jobs", dead_queue="dlq")
    old_ids = dead_letter(service, "jobs", "a", "b", reference="r1", encoding="text/plain", kind="email")
    clock.advance(timedelta(minutes=5))

    outcome = service.redrive("dlq")

    assert (outcome.moved, outcome.remaining, outcome.stranded) == (2, 0, 0)
    assert stored(service, "dlq") == [] and counters(service, "dlq") == 0
    back = stored(service, "jobs")
    assert sorted(payloads(back)) == [b"a", b"b"]
    assert {(i.reference, i.encoding, i.kind, i.attempts) for i in back} == {("r1", "text/plain", "email", 0)}
    assert {i.created_at for i in back} == {clock.now()}
    assert {i.expire_deadline for i in back} == {clock.now() + service.get_queue("jobs").expire_timeout}
    assert not {i.id for i in back} & set(old_ids)
    leased = service.lease("jobs", batch_size=10, client_id="again")
    assert sorted(payloads(leased.items)) == [b"a", b"b"]
    assert {i.attempts for i in leased.items} == {1}


def test_each_dead_letter_goes_back_to_the_queue_it_came_from(service):
    make_queue(service, "dlq")
    make_queue(service, "jobs", dead_queue="dlq")
    make_queue(service, "mail", dead_queue="dlq", partitions=3)
    dead_letter(service, "jobs", "job-1", "job-2")
    dead_letter(service, "mail", "mail-1", "mail-2", "mail-3")

    assert service.redrive("dlq").moved == 5

    assert sorted(payloads(stored(service, "jobs"))) == [b"job-1", b"job-2"]
    assert sorted(payloads(stored(service, "mail"))) == [b"mail-1", b"mail-2", b"mail-3"]


def test_to_sends_every_dead_letter_to_the_named_queue(service):
    make_queue(service, "dlq")
    make_queue(service, "jobs", dead_queue="dlq")
    make_queue(service, "repair")
    dead_letter(service, "jobs", "a")

    assert service.redrive("dlq", to="repair").moved == 1

    assert payloads(stored(service, "repair")) == [b"a"] and stored(service, "jobs") == []


def test_limit_moves_the_oldest_first_and_calling_until_remaining_is_zero_moves_each_once(service):
    make_queue(service, "dlq")
    make_queue(service, "jobs", dead_queue="dlq")
    values = [f"item-{n:02}" for n in range(25)]
    dead_letter(service, "jobs", *values)

    replies = []
    while not replies or replies[-1].remaining:
        replies.append(service.redrive("dlq", limit=10))
        assert len(replies) <= 5

    assert [(r.moved, r.remaining) for r in replies] == [(10, 15), (10, 5), (5, 0)]
    assert payloads(stored(service, "jobs")) == [v.encode() for v in values]  # FIFO kept


def test_a_leased_dead_letter_stays_and_counts_as_remaining(service):
    make_queue(service, "dlq")
    make_queue(service, "jobs", dead_queue="dlq")
    dead_letter(service, "jobs", "held", "free")
    inspected = service.lease("dlq", batch_size=1, client_id="inspector")

    outcome = service.redrive("dlq")

    assert (outcome.moved, outcome.remaining) == (1, 1)
    assert payloads(stored(service, "dlq")) == payloads(inspected.items)


def test_dead_letters_of_a_deleted_queue_are_stranded_and_not_counted_as_remaining(service):
    make_queue(service, "dlq")
    make_queue(service, "jobs", dead_queue="dlq")
    make_queue(service, "gone", dead_queue="dlq")
    dead_letter(service, "gone", "orphan-1", "orphan-2")
    dead_letter(service, "jobs", "job")
    service.delete_queue("gone")

    outcome = service.redrive("dlq")

    assert (outcome.moved, outcome.remaining, outcome.stranded) == (1, 0, 2)
    assert sorted(payloads(stored(service, "dlq"))) == [b"orphan-1", b"orphan-2"]
    # Still movable by name.
    make_queue(service, "rescue")
    assert service.redrive("dlq", to="rescue").moved == 2


def test_dead_letters_without_a_recorded_source_go_to_the_one_queue_that_dead_letters_there(service):
    make_queue(service, "dlq")
    make_queue(service, "jobs", dead_queue="dlq")
    # As a dead letter stored before redrive recorded source queues: imported, no source queue.
    service.import_items("dlq", 0, [StorageItem(payload=b"legacy", attempts=3, source_id="x" * 30)])

    assert service.redrive("dlq").moved == 1
    assert payloads(stored(service, "jobs")) == [b"legacy"]

    make_queue(service, "mail", dead_queue="dlq")
    service.import_items("dlq", 0, [StorageItem(payload=b"which", attempts=3)])
    outcome = service.redrive("dlq")
    assert (outcome.moved, outcome.stranded) == (0, 1)  # two candidates: left for a redrive with 'to'


@pytest.mark.parametrize(
    ("to", "limit", "field"),
    [
        ("nope", 1000, "to"),  # does not exist
        ("dlq", 1000, "to"),  # the queue itself
        ("other-dlq", 1000, "to"),  # another dead-letter queue
        (None, 0, "limit"),
        (None, 1001, "limit"),
    ],
)
def test_bad_redrives_are_refused_and_move_nothing(service, to, limit, field):
    make_queue(service, "dlq")
    make_queue(service, "other-dlq")
    make_queue(service, "jobs", dead_queue="dlq")
    make_queue(service, "mail", dead_queue="other-dlq")
    dead_letter(service, "jobs", "a")

    with pytest.raises(InvalidRequestError) as refused:
        service.redrive("dlq", to=to, limit=limit)

    assert refused.value.context["field"] == field
    assert payloads(stored(service, "dlq")) == [b"a"] and stored(service, "jobs") == []


def test_a_queue_that_is_no_dead_letter_queue_needs_to(service):
    make_queue(service, "jobs")
    make_queue(service, "other")
    service.produce("jobs", items("a"))

    with pytest.raises(InvalidRequestError, match="not the dead_queue of any queue"):
        service.redrive("jobs")

    assert service.redrive("jobs", to="other").moved == 1


class _Interrupted:
    """The store, with ``move`` dying after ``after`` items of a call: before the rest are written
    (``lost_reply=False``) or after writing them all, the reply lost (``lost_reply=True``)."""

    def __init__(self, store: Any, after: int, *, lost_reply: bool) -> None:
        self._store = store
        self._after = after
        self._lost_reply = lost_reply

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def move(self, queue, partition, moves, **kwargs):
        if self._lost_reply:
            self._store.move(queue, partition, moves, **kwargs)
        else:
            self._store.move(queue, partition, moves[: self._after], **kwargs)
        raise StoreUnavailableError("the connection dropped")


class _InterruptedLog:
    """Engine v3's claim log, with ``settle`` (where a redrive moves dead letters) dying after
    ``after`` settlements of a call, as ``_Interrupted`` does with engine v2's ``move``: each
    settlement is its own atomic step, so the ones before are applied."""

    def __init__(self, log: Any, after: int, *, lost_reply: bool) -> None:
        self._log = log
        self._after = after
        self._lost_reply = lost_reply

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)

    def settle(self, key, settlements, **kwargs):
        if self._lost_reply:
            self._log.settle(key, settlements, **kwargs)
        else:
            self._log.settle(key, settlements[: self._after], **kwargs)
        raise StoreUnavailableError("the connection dropped")


@pytest.mark.parametrize("lost_reply", [False, True])
def test_an_interrupted_redrive_run_again_stores_every_item_exactly_once(service, clock, lost_reply):
    make_queue(service, "dlq")
    make_queue(service, "jobs", dead_queue="dlq", partitions=2)
    values = [f"v{n}" for n in range(12)]
    dead_letter(service, "jobs", *values[:6])
    dead_letter(service, "jobs", *values[6:])
    if service.log is not None:
        dying = beside(service, clock, log=_InterruptedLog(service.log, 4, lost_reply=lost_reply))
    else:
        dying = beside(service, clock, store=_Interrupted(service.store, 4, lost_reply=lost_reply))

    with pytest.raises(StoreUnavailableError):
        dying.redrive("dlq", limit=8)
    remaining = service.redrive("dlq").remaining

    assert remaining == 0 and stored(service, "dlq") == []
    assert Counter(payloads(stored(service, "jobs"))) == Counter(v.encode() for v in values)
    assert counters(service, "jobs") == 12


def test_redriven_items_can_be_leased_and_dead_lettered_again(service):
    make_queue(service, "dlq")
    make_queue(service, "jobs", dead_queue="dlq", max_attempts=1)
    dead_letter(service, "jobs", "again")
    service.redrive("dlq")

    again = service.lease("jobs", batch_size=1, client_id="c")
    service.retry("jobs", again.partition, [RetryRequest(id=again.items[0].id)])  # attempts used up

    with pytest.raises(NothingToLeaseError):
        service.lease("jobs", batch_size=1, client_id="c")
    assert payloads(stored(service, "dlq")) == [b"again"]
    assert service.redrive("dlq").moved == 1
