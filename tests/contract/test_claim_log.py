"""Engine v3's claim log (``querator.ports.log``), held to its port on every store.

The promises of issue 35, point 3, as far as the log keeps them: order (oldest first, runs
disjoint under concurrent claims), fencing (an id valid for one lease), packed rows (a lease of
part of a row; complete, retry, renew of any subset; an expired lease of part of a row), atomic
moves (retry, expiry and dead letters), the schedule, deletes, and a writer that dies between
taking its positions and writing them.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from querator.domain.model import Item, reply_bytes_at_most
from querator.domain.positions import (
    HOLE_TIMEOUT_S,
    POSITION_MARK,
    parse_position_id,
    parse_scheduled_id,
    scheduled_id,
)
from querator.ports import Guard
from querator.ports.log import LogAges, LogKey, Settlement

if TYPE_CHECKING:
    from collections.abc import Sequence

    from querator.ports.log import Claim, ClaimLog

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=30)
KEY = LogKey("jobs", 0, "")
DEAD = LogKey("jobs-dead", 0, "")


def _items(*payloads: bytes | str, at: datetime = NOW, **fields: Any) -> list[Item]:
    return [
        Item(
            id="",
            payload=p.encode() if isinstance(p, str) else p,
            created_at=at,
            expire_deadline=at + timedelta(days=1),
            **fields,
        )
        for p in payloads
    ]


def _payloads(items: Sequence[Item]) -> list[bytes]:
    return [item.payload for item in items]


def _claim(log: ClaimLog, count: int, *, key: LogKey = KEY, now: datetime = NOW) -> Claim:
    return log.claim(key, count=count, deadline=now + LEASE, now=now)


def _complete(log: ClaimLog, ids: Sequence[str], *, key: LogKey = KEY, now: datetime = NOW) -> Any:
    return log.settle(key, [Settlement(id=i) for i in ids], guard=Guard.LEASE_VALID, now=now)


def _drain(log: ClaimLog, *, key: LogKey = KEY, now: datetime = NOW, batch: int = 10) -> list[Item]:
    """Claim and complete until nothing waits; bounded."""
    taken: list[Item] = []
    for _ in range(100):
        claim = _claim(log, batch, key=key, now=now)
        if not claim.items and not claim.holes:
            return taken
        taken += claim.items
        _complete(log, [item.id for item in claim.items], key=key, now=now)
    raise AssertionError("the log did not drain in 100 claims")


# --- append, head, ids ------------------------------------------------------------------------------


def test_append_gives_position_ids_in_produce_order(claim_log: ClaimLog) -> None:
    stored = claim_log.append(KEY, _items("a", "b", "c"), now=NOW)

    assert _payloads(stored) == [b"a", b"b", b"c"]
    positions = [parse_position_id(item.id) for item in stored]
    assert all(p is not None and p[0] == "" for p in positions)
    numbers = [p[1] for p in positions if p is not None]
    assert numbers == sorted(numbers) and len(set(numbers)) == 3
    head = claim_log.head(KEY)
    assert head.waiting == 3 and head.leases == 0 and head.leased == 0


def test_a_new_log_starts_at_the_clock_so_a_recreated_queue_reuses_no_id(claim_log: ClaimLog) -> None:
    first = claim_log.append(KEY, _items("old"), now=NOW)
    _drain(claim_log)
    while claim_log.purge(KEY, limit=100):
        pass
    assert claim_log.head(KEY).tail == 0

    later = NOW + timedelta(seconds=1)
    second = claim_log.append(KEY, _items("new"), now=later)

    assert second[0].id > first[0].id
    old_position = parse_position_id(first[0].id)
    assert old_position is not None and old_position[1] <= int(NOW.timestamp() * 1_000_000) + 1
    claim = _claim(claim_log, 1, now=later)
    assert _complete(claim_log, [first[0].id], now=later).rejected == [first[0].id]
    assert _complete(claim_log, [claim.items[0].id], now=later).applied == [claim.items[0].id]


def test_lanes_are_logs_of_their_own(claim_log: ClaimLog) -> None:
    urgent = LogKey("jobs", 0, ".1")
    claim_log.append(KEY, _items("normal"), now=NOW)
    stored = claim_log.append(urgent, _items("urgent"), now=NOW)

    assert stored[0].id.startswith(".1" + POSITION_MARK) and stored[0].priority == 1
    assert _payloads(_claim(claim_log, 10, key=urgent).items) == [b"urgent"]
    assert _payloads(_claim(claim_log, 10).items) == [b"normal"]
    assert claim_log.head(LogKey("jobs", 1, "")).tail == 0


# --- claims: order, counts, packed rows -------------------------------------------------------------


def test_claims_take_oldest_first_and_parts_of_a_packed_row(claim_log: ClaimLog) -> None:
    claim_log.append(KEY, _items(*[f"i{n}" for n in range(10)]), now=NOW)

    first, second, rest = _claim(claim_log, 3), _claim(claim_log, 4), _claim(claim_log, 10)

    assert _payloads(first.items) == [b"i0", b"i1", b"i2"]
    assert _payloads(second.items) == [b"i3", b"i4", b"i5", b"i6"]
    assert _payloads(rest.items) == [b"i7", b"i8", b"i9"]
    assert len({first.token, second.token, rest.token}) == 3
    assert not (first.holes or second.holes or rest.holes)
    head = claim_log.head(KEY)
    assert head.waiting == 0 and head.leases == 3 and head.leased == 10


def test_a_claim_sets_the_deadline_and_counts_the_attempt(claim_log: ClaimLog) -> None:
    claim_log.append(KEY, _items("x", attempts=2), now=NOW)

    claim = _claim(claim_log, 1)

    assert claim.deadline == NOW + LEASE
    assert claim.items[0].lease_deadline == NOW + LEASE
    assert claim.items[0].attempts == 3


def test_an_empty_log_gives_an_empty_claim(claim_log: ClaimLog) -> None:
    claim = _claim(claim_log, 10)

    assert claim.token == "" and claim.items == [] and claim.holes == []
    assert claim_log.head(KEY).leases == 0


def test_items_keep_their_fields_through_the_log(claim_log: ClaimLog) -> None:
    produced = _items(
        bytes(range(256)), reference="ref-1", encoding="base64", kind="email", group="tenant", source_id="abc"
    )
    stored = claim_log.append(KEY, produced, now=NOW)

    leased = _claim(claim_log, 1).items[0]

    assert leased.id == stored[0].id
    for name in ("payload", "reference", "encoding", "kind", "group", "source_id", "created_at"):
        assert getattr(leased, name) == getattr(produced[0], name), name
    assert leased.expire_deadline == produced[0].expire_deadline


def test_head_remembers_the_largest_item(claim_log: ClaimLog) -> None:
    claim_log.append(KEY, _items(b"x" * 10, b"y" * 5000, b"z" * 20), now=NOW)

    assert claim_log.head(KEY).largest >= 5000


def test_rows_larger_than_a_packed_row_keep_order(claim_log: ClaimLog) -> None:
    payloads = [bytes([n]) * 3000 for n in range(12)] + [b"big" * 50_000]
    claim_log.append(KEY, _items(*payloads), now=NOW)

    assert _payloads(_drain(claim_log, batch=5)) == payloads


def test_concurrent_claims_take_disjoint_runs_in_order(
    claim_log: ClaimLog, request: pytest.FixtureRequest
) -> None:
    claim_log.append(KEY, _items(*[f"{n:03}" for n in range(120)]), now=NOW)
    runs: list[list[bytes]] = []
    lock = threading.Lock()
    # moto in process is not safe for concurrent requests (conftest.build_service): there the
    # threads take turns, and the moto server run is the concurrent one.
    turns = threading.Lock() if request.node.callspec.params["claim_log"] == "moto" else None

    def consume() -> None:
        for _ in range(40):
            if turns is None:
                claim = _claim(claim_log, 5)
            else:
                with turns:
                    claim = _claim(claim_log, 5)
            if not claim.items:
                return
            with lock:
                runs.append(_payloads(claim.items))

    threads = [threading.Thread(target=consume) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert not any(thread.is_alive() for thread in threads)
    assert all(run == sorted(run) for run in runs)
    flat = sorted(p for run in runs for p in run)
    assert flat == [f"{n:03}".encode() for n in range(120)]


# --- settling: fencing, subsets, moves --------------------------------------------------------------


def test_an_id_is_valid_for_one_lease(claim_log: ClaimLog) -> None:
    claim_log.append(KEY, _items("a", "b"), now=NOW)
    ids = [item.id for item in _claim(claim_log, 2).items]

    assert _complete(claim_log, ids[:1]).applied == ids[:1]
    again = _complete(claim_log, ids)

    assert again.applied == [ids[1]]
    assert again.rejected == [ids[0]]
    head = claim_log.head(KEY)
    assert head.leases == 0 and head.leased == 0


def test_unknown_and_malformed_ids_are_rejected_not_raised(claim_log: ClaimLog) -> None:
    claim_log.append(KEY, _items("a"), now=NOW)
    claim = _claim(claim_log, 1)
    never = POSITION_MARK + "f" * 16

    result = _complete(claim_log, [never, claim.items[0].id])

    assert result.applied == [claim.items[0].id]
    assert result.rejected == [never]


def test_a_holder_whose_lease_ran_out_cannot_act(claim_log: ClaimLog) -> None:
    claim_log.append(KEY, _items("a"), now=NOW)
    item = _claim(claim_log, 1).items[0]
    late = NOW + LEASE + timedelta(seconds=1)

    assert _complete(claim_log, [item.id], now=late).rejected == [item.id]
    assert claim_log.renew(KEY, [item.id], deadline=late + LEASE, now=late).rejected == [item.id]


def test_retry_of_a_subset_goes_to_the_tail_under_a_new_id(claim_log: ClaimLog) -> None:
    claim_log.append(KEY, _items("a", "b", "c"), now=NOW)
    a, b, c = _claim(claim_log, 3).items
    claim_log.append(KEY, _items("d"), now=NOW)

    retried = claim_log.settle(KEY, [Settlement(id=b.id, to=KEY, item=b)], guard=Guard.LEASE_VALID, now=NOW)

    assert retried.applied == [b.id]
    again = _claim(claim_log, 10)
    assert _payloads(again.items) == [b"d", b"b"]
    assert again.items[1].id != b.id and again.items[1].attempts == 2
    assert _complete(claim_log, [b.id]).rejected == [b.id]
    assert _complete(claim_log, [a.id, c.id]).applied == [a.id, c.id]
    assert claim_log.head(KEY).leased == 2


def test_a_dead_letter_moves_to_another_queue_at_once(claim_log: ClaimLog) -> None:
    claim_log.append(KEY, _items("a", "b"), now=NOW)
    a, _ = _claim(claim_log, 2).items
    letter = replace(a, source_id=a.id, source_queue="jobs")

    result = claim_log.settle(KEY, [Settlement(id=a.id, to=DEAD, item=letter)], guard=Guard.ANY, now=NOW)

    assert result.applied == [a.id]
    dead = _claim(claim_log, 10, key=DEAD).items
    assert _payloads(dead) == [b"a"] and dead[0].source_queue == "jobs" and dead[0].source_id == a.id
    assert claim_log.head(KEY).leased == 1


def test_a_retry_for_later_waits_in_the_schedule(claim_log: ClaimLog) -> None:
    claim_log.append(KEY, _items("a"), now=NOW)
    a = _claim(claim_log, 1).items[0]
    due = NOW + timedelta(minutes=5)

    claim_log.settle(
        KEY, [Settlement(id=a.id, to=KEY, item=replace(a, enqueue_at=due))], guard=Guard.LEASE_VALID, now=NOW
    )

    head = claim_log.head(KEY)
    assert head.scheduled == 1 and head.waiting == 0
    assert head.next_due is not None and head.next_due <= due
    assert _claim(claim_log, 10).items == []
    assert claim_log.promote(KEY, now=due - timedelta(seconds=1), limit=10) == 0
    assert claim_log.promote(KEY, now=due, limit=10) == 1
    later = _claim(claim_log, 10, now=due).items
    assert _payloads(later) == [b"a"] and later[0].attempts == 2
    assert claim_log.head(KEY).scheduled == 0


def test_scheduled_items_are_promoted_oldest_due_first(claim_log: ClaimLog) -> None:
    claim_log.append(KEY, _items("later", enqueue_at=NOW + timedelta(minutes=2)), now=NOW)
    claim_log.append(KEY, _items("sooner", enqueue_at=NOW + timedelta(minutes=1)), now=NOW)
    stored = claim_log.list_items(KEY, after="", limit=10, now=NOW)
    assert all(parse_scheduled_id(item.id) is not None for item in stored)

    assert claim_log.promote(KEY, now=NOW + timedelta(minutes=3), limit=1) == 1
    assert claim_log.promote(KEY, now=NOW + timedelta(minutes=3), limit=1) == 1
    assert _payloads(_claim(claim_log, 10, now=NOW + timedelta(minutes=3)).items) == [b"sooner", b"later"]


def test_any_guard_moves_waiting_and_scheduled_items_too(claim_log: ClaimLog) -> None:
    urgent = LogKey("jobs", 0, ".1")
    waiting = claim_log.append(KEY, _items("waiting", "stays"), now=NOW)
    scheduled = claim_log.append(KEY, _items("later", enqueue_at=NOW + timedelta(hours=1)), now=NOW)

    moved = claim_log.settle(
        KEY,
        [
            Settlement(id=waiting[0].id, to=urgent, item=waiting[0]),
            Settlement(id=scheduled[0].id, to=urgent, item=scheduled[0]),
        ],
        guard=Guard.ANY,
        now=NOW,
    )

    assert sorted(moved.applied) == sorted([waiting[0].id, scheduled[0].id])
    assert claim_log.head(KEY).waiting == 1
    assert _payloads(_claim(claim_log, 10).items) == [b"stays"]
    assert claim_log.head(KEY).scheduled == 0
    assert claim_log.head(urgent).scheduled == 1
    assert _payloads(_claim(claim_log, 10, key=urgent).items) == [b"waiting"]
    assert claim_log.settle(KEY, [Settlement(id=waiting[0].id)], guard=Guard.ANY, now=NOW).rejected == [
        waiting[0].id
    ]


def test_a_waiting_item_is_not_settled_by_a_consumer_guard(claim_log: ClaimLog) -> None:
    waiting = claim_log.append(KEY, _items("waiting"), now=NOW)

    assert _complete(claim_log, [waiting[0].id]).rejected == [waiting[0].id]
    assert _payloads(_claim(claim_log, 10).items) == [b"waiting"]


def test_max_leased_caps_a_claim(claim_log: ClaimLog) -> None:
    claim_log.append(KEY, _items(*"abcde"), now=NOW)

    first = claim_log.claim(KEY, count=2, deadline=NOW + LEASE, now=NOW, max_leased=3)
    second = claim_log.claim(KEY, count=2, deadline=NOW + LEASE, now=NOW, max_leased=3)
    third = claim_log.claim(KEY, count=2, deadline=NOW + LEASE, now=NOW, max_leased=3)

    assert _payloads(first.items) == [b"a", b"b"]
    assert _payloads(second.items) == [b"c"]
    assert third.items == [] and third.token == ""
    _complete(claim_log, [first.items[0].id])
    assert _payloads(claim_log.claim(KEY, count=5, deadline=NOW + LEASE, now=NOW, max_leased=3).items) == [
        b"d"
    ]
    assert claim_log.head(KEY).leased == 3


def test_a_scheduled_item_keeps_the_scheduled_id_it_was_given(claim_log: ClaimLog) -> None:
    due = NOW + timedelta(minutes=1)
    due_us = int(due.timestamp() * 1_000_000)
    given = [scheduled_id("", due_us, n) for n in (7, 8, 9)]
    produced = [
        replace(item, id=i) for item, i in zip(_items("a", "b", "c", enqueue_at=due), given, strict=True)
    ]

    stored = claim_log.append(KEY, produced, now=NOW)

    assert [i.id for i in stored] == given
    assert [i.id for i in claim_log.list_items(KEY, after="", limit=10, now=NOW)] == given
    assert claim_log.promote(KEY, now=due, limit=10) == 3
    assert _payloads(_claim(claim_log, 10, now=due).items) == [b"a", b"b", b"c"]


def test_not_validly_leased_takes_waiting_scheduled_and_expired_but_not_valid_leases(
    claim_log: ClaimLog,
) -> None:
    claim_log.append(KEY, _items("expired", "valid", "waiting"), now=NOW)
    scheduled = claim_log.append(KEY, _items("later", enqueue_at=NOW + timedelta(hours=1)), now=NOW)
    expired = claim_log.claim(KEY, count=1, deadline=NOW + timedelta(seconds=1), now=NOW).items[0]
    valid = _claim(claim_log, 1).items[0]
    waiting = claim_log.list_items(KEY, after=valid.id, limit=1, now=NOW)[0]
    later = NOW + timedelta(seconds=2)

    result = claim_log.settle(
        KEY,
        [Settlement(id=i) for i in (expired.id, valid.id, waiting.id, scheduled[0].id)],
        guard=Guard.NOT_VALIDLY_LEASED,
        now=later,
    )

    assert sorted(result.applied) == sorted([expired.id, waiting.id, scheduled[0].id])
    assert result.rejected == [valid.id]


def test_skip_waiting_drops_every_waiting_item_and_keeps_the_rest(claim_log: ClaimLog) -> None:
    claim_log.append(KEY, _items(*"abcdef"), now=NOW)
    claim_log.append(KEY, _items("later", enqueue_at=NOW + timedelta(hours=1)), now=NOW)
    held = _claim(claim_log, 2).items
    claim_log.delete(KEY, [claim_log.list_items(KEY, after=held[-1].id, limit=1, now=NOW)[0].id], now=NOW)

    assert claim_log.skip_waiting(KEY, now=NOW) == 3

    head = claim_log.head(KEY)
    assert head.waiting == 0 and head.leased == 2 and head.scheduled == 1
    assert _claim(claim_log, 10).items == []
    assert _complete(claim_log, [i.id for i in held]).applied == [i.id for i in held]
    claim_log.append(KEY, _items("new"), now=NOW)
    assert _payloads(_claim(claim_log, 10).items) == [b"new"]


def test_produced_and_completed_count_produce_and_complete_only(claim_log: ClaimLog) -> None:
    claim_log.append(KEY, _items("a", "b", "c"), now=NOW)
    taken = claim_log.take_positions(KEY, 1, now=NOW)
    claim_log.write_taken(KEY, taken, _items("d"), now=NOW)
    a, b, c, d = _claim(claim_log, 4).items

    claim_log.settle(
        KEY, [Settlement(id=a.id), Settlement(id=b.id)], guard=Guard.LEASE_VALID, now=NOW, completed=True
    )
    claim_log.settle(
        KEY, [Settlement(id=c.id, to=KEY, item=c)], guard=Guard.LEASE_VALID, now=NOW, completed=True
    )
    claim_log.settle(KEY, [Settlement(id=d.id)], guard=Guard.LEASE_VALID, now=NOW)

    head = claim_log.head(KEY)
    assert (head.produced, head.completed) == (4, 2)


def test_the_largest_item_size_is_raised_before_its_positions_exist(claim_log: ClaimLog) -> None:
    # A claim sizes its run by the head's largest item (the reply cap): one that reads the head
    # between a take and its write takes the positions as holes and collects the items later, so the
    # bound must cover them from the take on.
    big = _items(b"x" * 300_000)
    taken = claim_log.take_positions(KEY, 1, now=NOW, largest=big[0].reply_size())
    assert claim_log.head(KEY).largest >= 300_000
    claim_log.write_taken(KEY, taken, big, now=NOW)
    # A smaller item later never lowers it, nor does one under the threshold every item counts as.
    claim_log.take_positions(KEY, 1, now=NOW, largest=1_000)
    claim_log.append(KEY, _items("small"), now=NOW)
    assert claim_log.head(KEY).largest >= 300_000


def test_a_claim_sizes_its_run_by_the_head_it_reads_itself(claim_log: ClaimLog) -> None:
    # A caller read the head while only small items waited, and sized its count by it; large items
    # were appended before its claim. The claim's ``room`` keeps the run inside the reply cap.
    claim_log.append(KEY, _items("a", "b", "c"), now=NOW)
    seen = claim_log.head(KEY)
    claim_log.append(KEY, _items(*(bytes([n]) * 300_000 for n in range(20))), now=NOW)
    room = 5_000_000
    count = room // reply_bytes_at_most(seen.largest)

    claim = claim_log.claim(KEY, count=count, deadline=NOW + LEASE, now=NOW, room=room)

    assert 3 < len(claim.items) < 23
    assert sum(reply_bytes_at_most(item.reply_size()) for item in claim.items) <= room
    # What it could not carry waits, in order, for the next claim.
    rest = claim_log.claim(KEY, count=100, deadline=NOW + LEASE, now=NOW)
    assert len(claim.items) + len(rest.items) == 23


def test_the_largest_item_size_falls_once_no_large_item_waits(claim_log: ClaimLog) -> None:
    # A log given one large item sizes claims by it only while it may wait: once a claim took it
    # and whatever was behind it, small items are claimed a full batch at a time again.
    claim_log.append(KEY, _items(b"x" * 300_000, "a", "b"), now=NOW)
    assert claim_log.head(KEY).largest >= 300_000
    held = _claim(claim_log, 3).items
    assert len(held) == 3

    claim_log.append(KEY, _items(*(f"small-{n}" for n in range(10))), now=NOW)

    assert reply_bytes_at_most(claim_log.head(KEY).largest) * 1000 <= 5_000_000
    # A large item put back (a retry to the tail) bounds the log again.
    big = held[0]
    moved = claim_log.settle(KEY, [Settlement(id=big.id, to=KEY, item=big)], guard=Guard.LEASE_VALID, now=NOW)
    assert moved.applied == [big.id]
    assert claim_log.head(KEY).largest >= 300_000


# --- expiry and renewal ------------------------------------------------------------------------------


def _seconds(*times: datetime) -> int:
    return sum(int(t.timestamp()) for t in times)


def test_ages_sum_the_creation_times_of_waiting_and_leased_items(claim_log: ClaimLog) -> None:
    early, late = NOW - timedelta(seconds=40), NOW - timedelta(seconds=10)
    claim_log.append(KEY, _items("a", "b", "c", at=early), now=NOW)
    claim_log.append(KEY, _items("d", "e", at=late), now=NOW)
    claim_log.append(KEY, _items("later", at=late, enqueue_at=NOW + timedelta(hours=1)), now=NOW)
    assert claim_log.ages(KEY) == LogAges(waiting_created=_seconds(*[early] * 3, late, late))

    # A claim of part of the first row, then of the rest of it and part of the second.
    a, b = _claim(claim_log, 2).items
    c, d = _claim(claim_log, 2).items
    assert claim_log.ages(KEY) == LogAges(
        waiting_created=_seconds(late), leased_created=_seconds(*[early] * 3, late)
    )

    # A subset completes; another goes to the tail (waiting again, as old as it was); one is deleted
    # while waiting; a renew splits a record, which moves nothing between the sums.
    assert _complete(claim_log, [a.id]).applied == [a.id]
    assert claim_log.settle(
        KEY, [Settlement(id=c.id, to=KEY, item=c)], guard=Guard.LEASE_VALID, now=NOW
    ).applied
    assert claim_log.renew(KEY, [d.id], deadline=NOW + timedelta(minutes=5), now=NOW).applied == [d.id]
    assert claim_log.ages(KEY) == LogAges(
        waiting_created=_seconds(late, early), leased_created=_seconds(early, late)
    )
    (e,) = [i for i in claim_log.list_items(KEY, after="", limit=10, now=NOW) if i.payload == b"e"]
    assert claim_log.delete(KEY, [e.id], now=NOW).applied == [e.id]
    assert claim_log.ages(KEY) == LogAges(
        waiting_created=_seconds(early), leased_created=_seconds(early, late)
    )

    # Everything settled: nothing left to age but the scheduled item, which counts in neither sum.
    assert _complete(claim_log, [b.id, d.id]).applied == [b.id, d.id]
    _drain(claim_log)
    assert claim_log.ages(KEY) == LogAges()


def test_ages_follow_an_expired_lease_to_the_tail_and_a_slow_writer_into_its_lease(
    claim_log: ClaimLog,
) -> None:
    created = NOW - timedelta(seconds=5)
    claim_log.append(KEY, _items("a", at=created), now=NOW)
    claim = _claim(claim_log, 1)
    for run in claim_log.expired(KEY, now=NOW + LEASE, limit=10):
        moves = [Settlement(id=i.id, to=KEY, item=i) for i in run.items]
        claim_log.settle(KEY, moves, guard=Guard.LEASE_EXPIRED, now=NOW + LEASE)
    assert claim_log.ages(KEY) == LogAges(waiting_created=_seconds(created))
    assert claim.items and _claim(claim_log, 1, now=NOW + LEASE).items

    # A writer between its two steps: its items count once they are written, leased by the claim
    # that waited for them.
    ids = claim_log.take_positions(KEY, 1, now=NOW, created=_seconds(created))
    holed = _claim(claim_log, 1, now=NOW + LEASE)
    assert holed.holes == ids
    claim_log.write_taken(KEY, ids, _items("slow", at=created), now=NOW + LEASE)
    found = claim_log.collect(KEY, holed.token, now=NOW + LEASE)
    assert _payloads(found.items) == [b"slow"]
    assert claim_log.ages(KEY) == LogAges(leased_created=_seconds(created, created))


def test_an_expired_lease_of_part_of_a_row_goes_back_to_the_tail(claim_log: ClaimLog) -> None:
    claim_log.append(KEY, _items("a", "b", "c", "d"), now=NOW)
    held = _claim(claim_log, 2)
    late = NOW + LEASE

    assert claim_log.expired(KEY, now=late - timedelta(microseconds=1), limit=10) == []
    runs = claim_log.expired(KEY, now=late, limit=10)

    assert [run.token for run in runs] == [held.token]
    assert _payloads(runs[0].items) == [b"a", b"b"]
    moved = claim_log.settle(
        KEY, [Settlement(id=i.id, to=KEY, item=i) for i in runs[0].items], guard=Guard.LEASE_EXPIRED, now=late
    )
    assert sorted(moved.applied) == sorted(i.id for i in held.items)
    after = _claim(claim_log, 10, now=late).items
    assert _payloads(after) == [b"c", b"d", b"a", b"b"]
    assert [i.attempts for i in after] == [1, 1, 2, 2]
    assert claim_log.expired(KEY, now=late, limit=10) == []


def test_expired_finds_oldest_deadlines_first_and_skips_valid_leases(claim_log: ClaimLog) -> None:
    claim_log.append(KEY, _items(*"abcd"), now=NOW)
    short = claim_log.claim(KEY, count=1, deadline=NOW + timedelta(seconds=5), now=NOW)
    shorter = claim_log.claim(KEY, count=1, deadline=NOW + timedelta(seconds=2), now=NOW)
    claim_log.claim(KEY, count=2, deadline=NOW + timedelta(hours=1), now=NOW)

    runs = claim_log.expired(KEY, now=NOW + timedelta(seconds=10), limit=10)

    assert [run.token for run in runs] == [shorter.token, short.token]
    assert [r.token for r in claim_log.expired(KEY, now=NOW + timedelta(seconds=10), limit=1)] == [
        shorter.token
    ]
    head = claim_log.head(KEY)
    assert head.next_expiry is not None and head.next_expiry <= NOW + timedelta(seconds=2)


def test_the_guards_keep_consumers_and_the_reaper_apart(claim_log: ClaimLog) -> None:
    claim_log.append(KEY, _items("a", "b"), now=NOW)
    a, b = _claim(claim_log, 2).items

    assert claim_log.settle(KEY, [Settlement(id=a.id)], guard=Guard.LEASE_EXPIRED, now=NOW).rejected == [a.id]
    late = NOW + LEASE
    assert claim_log.settle(KEY, [Settlement(id=a.id)], guard=Guard.LEASE_VALID, now=late).rejected == [a.id]
    assert claim_log.settle(KEY, [Settlement(id=a.id)], guard=Guard.LEASE_EXPIRED, now=late).applied == [a.id]
    assert claim_log.settle(KEY, [Settlement(id=b.id)], guard=Guard.ANY, now=late).applied == [b.id]


def test_renewing_a_whole_lease_moves_its_deadline(claim_log: ClaimLog) -> None:
    claim_log.append(KEY, _items("a", "b"), now=NOW)
    ids = [i.id for i in _claim(claim_log, 2).items]
    later = NOW + timedelta(minutes=10)

    assert claim_log.renew(KEY, ids, deadline=later, now=NOW).applied == ids

    assert claim_log.expired(KEY, now=NOW + LEASE, limit=10) == []
    assert [i.id for r in claim_log.expired(KEY, now=later, limit=10) for i in r.items] == ids
    assert _complete(claim_log, ids, now=NOW + LEASE).applied == ids


def test_renewing_part_of_a_lease_splits_it(claim_log: ClaimLog) -> None:
    claim_log.append(KEY, _items("a", "b", "c"), now=NOW)
    a, b, c = _claim(claim_log, 3).items
    later = NOW + timedelta(minutes=10)

    assert claim_log.renew(KEY, [b.id], deadline=later, now=NOW).applied == [b.id]

    at_old = claim_log.expired(KEY, now=NOW + LEASE, limit=10)
    assert sorted(i.id for r in at_old for i in r.items) == sorted([a.id, c.id])
    assert _complete(claim_log, [b.id], now=NOW + LEASE).applied == [b.id]
    assert claim_log.get(KEY, [a.id], now=NOW)[a.id].lease_deadline == NOW + LEASE


# --- what settle's moves got, a leased item's coming priority -----------------------------------------


def test_settle_names_the_id_each_moved_item_got(claim_log: ClaimLog) -> None:
    urgent = LogKey("jobs", 0, ".1")
    claim_log.append(KEY, _items("retried", "later", "done"), now=NOW)
    retried, later, done = _claim(claim_log, 3).items
    (waiting,) = claim_log.append(KEY, _items("waiting"), now=NOW)
    (scheduled,) = claim_log.append(KEY, _items("scheduled", enqueue_at=NOW + timedelta(hours=1)), now=NOW)
    due = NOW + timedelta(minutes=5)

    leased = claim_log.settle(
        KEY,
        [
            Settlement(id=retried.id, to=urgent, item=retried),
            Settlement(id=later.id, to=KEY, item=replace(later, enqueue_at=due)),
            Settlement(id=done.id),
        ],
        guard=Guard.LEASE_VALID,
        now=NOW,
    )
    unleased = claim_log.settle(
        KEY,
        [
            Settlement(id=waiting.id, to=urgent, item=waiting),
            Settlement(id=scheduled.id, to=urgent, item=scheduled),
            Settlement(id="nothing"),
        ],
        guard=Guard.ANY,
        now=NOW,
    )

    assert sorted(leased.applied) == sorted([retried.id, later.id, done.id])
    assert set(leased.moved) == {retried.id, later.id}  # a settlement without a move gets none
    assert set(unleased.moved) == {waiting.id, scheduled.id} and unleased.rejected == ["nothing"]
    # Each new id is where the item is now: read there by it, in the state the move gave it.
    at_urgent = claim_log.get(
        urgent, [leased.moved[retried.id], unleased.moved[waiting.id], unleased.moved[scheduled.id]], now=NOW
    )
    assert _payloads(at_urgent.values()) == [b"retried", b"waiting", b"scheduled"]
    assert parse_position_id(leased.moved[retried.id]) is not None
    assert parse_scheduled_id(unleased.moved[scheduled.id]) is not None  # still waiting for its time
    assert at_urgent[unleased.moved[scheduled.id]].enqueue_at == NOW + timedelta(hours=1)
    assert parse_scheduled_id(leased.moved[later.id]) is not None
    assert claim_log.get(KEY, [leased.moved[later.id]], now=NOW)[leased.moved[later.id]].payload == b"later"
    assert [i.id for i in _claim(claim_log, 10, key=urgent).items] == [
        leased.moved[retried.id],
        unleased.moved[waiting.id],
    ]


def test_a_leased_item_keeps_the_priority_it_goes_back_with_in_its_lease_record(claim_log: ClaimLog) -> None:
    claim_log.append(KEY, _items("a", "b", "c", "d"), now=NOW)
    a, b, c, d = _claim(claim_log, 4).items

    given = claim_log.set_next_priority(KEY, [b.id, c.id, d.id], priority=2, now=NOW)
    claim_log.set_next_priority(KEY, [d.id], priority=8, now=NOW)  # the last one given counts

    assert given.applied == [b.id, c.id, d.id] and given.rejected == []
    found = claim_log.get(KEY, [a.id, b.id, c.id, d.id], now=NOW)
    assert [found[i.id].next_priority for i in (a, b, c, d)] == [None, 2, 2, 8]
    # Its id, lease and attempts stay: the holder still completes, renews and retries it.
    assert {(found[i.id].lease_deadline, found[i.id].attempts) for i in (a, b, c, d)} == {(NOW + LEASE, 1)}
    listed = claim_log.list_items(KEY, after="", limit=10, now=NOW)
    assert [i.next_priority for i in listed] == [None, 2, 2, 8]
    # A settle of another position of the record, and a renew that splits it, keep it.
    assert _complete(claim_log, [a.id]).applied == [a.id]
    later = NOW + timedelta(minutes=10)
    assert claim_log.renew(KEY, [c.id], deadline=later, now=NOW).applied == [c.id]
    found = claim_log.get(KEY, [b.id, c.id, d.id], now=NOW)
    assert [found[i.id].next_priority for i in (b, c, d)] == [2, 2, 8]
    assert found[c.id].lease_deadline == later
    # Expiry returns it, so the run goes back to the priority given.
    (run,) = claim_log.expired(KEY, now=NOW + LEASE, limit=10)
    assert [(i.id, i.next_priority) for i in run.items] == [(b.id, 2), (d.id, 8)]
    (split,) = [r for r in claim_log.expired(KEY, now=later, limit=10) if r.token != run.token]
    assert [(i.id, i.next_priority) for i in split.items] == [(c.id, 2)]


def test_only_a_valid_lease_takes_a_coming_priority(claim_log: ClaimLog) -> None:
    claim_log.append(KEY, _items("held", "expires", "done"), now=NOW)
    (held,) = _claim(claim_log, 1).items
    (expires,) = _claim(claim_log, 1, now=NOW - LEASE).items  # its deadline is NOW
    (done,) = _claim(claim_log, 1).items
    _complete(claim_log, [done.id])
    (waiting,) = claim_log.append(KEY, _items("waiting"), now=NOW)
    (scheduled,) = claim_log.append(KEY, _items("later", enqueue_at=NOW + timedelta(hours=1)), now=NOW)
    other_lane = held.id.replace(POSITION_MARK, ".1" + POSITION_MARK, 1)
    asked = [waiting.id, expires.id, held.id, done.id, scheduled.id, other_lane, "not-an-id", held.id]

    result = claim_log.set_next_priority(KEY, asked, priority=0, now=NOW)

    assert result.applied == [held.id]
    assert sorted(result.rejected) == sorted(set(asked) - {held.id})
    found = claim_log.get(KEY, [waiting.id, scheduled.id, expires.id], now=NOW)
    assert [found[i].next_priority for i in (waiting.id, scheduled.id, expires.id)] == [None] * 3
    assert claim_log.head(KEY).leased == 2


# --- delete, get, list, purge ------------------------------------------------------------------------


def test_delete_removes_waiting_leased_and_scheduled_items(claim_log: ClaimLog) -> None:
    claim_log.append(KEY, _items("leased", "waiting", "next"), now=NOW)
    scheduled = claim_log.append(KEY, _items("later", enqueue_at=NOW + timedelta(hours=1)), now=NOW)
    leased = _claim(claim_log, 1).items[0]
    waiting = claim_log.list_items(KEY, after=leased.id, limit=1, now=NOW)[0]

    result = claim_log.delete(
        KEY, [leased.id, waiting.id, scheduled[0].id, POSITION_MARK + "0" * 16], now=NOW
    )

    assert sorted(result.applied) == sorted([leased.id, waiting.id, scheduled[0].id])
    assert result.rejected == [POSITION_MARK + "0" * 16]
    assert _payloads(_claim(claim_log, 10).items) == [b"next"]
    head = claim_log.head(KEY)
    assert head.scheduled == 0
    assert claim_log.promote(KEY, now=NOW + timedelta(hours=2), limit=10) == 0


def test_get_reads_items_in_every_state(claim_log: ClaimLog) -> None:
    claim_log.append(KEY, _items("leased", "waiting"), now=NOW)
    scheduled = claim_log.append(KEY, _items("later", enqueue_at=NOW + timedelta(hours=1)), now=NOW)
    leased = _claim(claim_log, 1).items[0]
    waiting = claim_log.list_items(KEY, after=leased.id, limit=1, now=NOW)[0]

    found = claim_log.get(KEY, [leased.id, waiting.id, scheduled[0].id, POSITION_MARK + "1" * 16], now=NOW)

    assert set(found) == {leased.id, waiting.id, scheduled[0].id}
    assert found[leased.id].lease_deadline == NOW + LEASE and found[leased.id].attempts == 1
    assert found[waiting.id].lease_deadline is None
    assert found[scheduled[0].id].payload == b"later"


def test_list_items_pages_in_id_order_and_skips_settled(claim_log: ClaimLog) -> None:
    claim_log.append(KEY, _items(*"abcdef"), now=NOW)
    claim_log.append(KEY, _items("s", enqueue_at=NOW + timedelta(hours=1)), now=NOW)
    done = _claim(claim_log, 2).items
    _complete(claim_log, [done[0].id])

    first = claim_log.list_items(KEY, after="", limit=3, now=NOW)
    rest = claim_log.list_items(KEY, after=first[-1].id, limit=10, now=NOW)

    listed = first + rest
    assert _payloads(listed) == [b"b", b"c", b"d", b"e", b"f", b"s"]
    assert [i.id for i in listed] == sorted(i.id for i in listed)
    assert listed[0].lease_deadline == NOW + LEASE
    # A leased item shows the attempt its lease counts, as the claim and ``get`` do.
    assert [i.attempts for i in listed] == [1, 0, 0, 0, 0, 0]


def test_purge_removes_the_log_in_pages(claim_log: ClaimLog) -> None:
    claim_log.append(KEY, _items(*[b"x" * 4000 for _ in range(20)]), now=NOW)
    claim_log.append(KEY, _items("s", enqueue_at=NOW + timedelta(hours=1)), now=NOW)
    _claim(claim_log, 3)

    removed = [claim_log.purge(KEY, limit=2) for _ in range(30)]

    assert removed[-1] == 0 and all(n <= 2 for n in removed)
    assert claim_log.head(KEY).tail == 0
    assert claim_log.list_items(KEY, after="", limit=10, now=NOW) == []


# --- a writer that dies between taking positions and writing them -----------------------------------


def _take(log: ClaimLog, count: int, now: datetime = NOW) -> list[str]:
    return log.take_positions(KEY, count, now=now)


def _write_taken(log: ClaimLog, ids: list[str], items: list[Item], now: datetime) -> list[Item]:
    return log.write_taken(KEY, ids, items, now=now)


def test_a_writer_that_is_only_slow_is_collected(claim_log: ClaimLog) -> None:
    taken = _take(claim_log, 2)
    claim_log.append(KEY, _items("after"), now=NOW)

    claim = _claim(claim_log, 10)
    assert claim.holes == taken and _payloads(claim.items) == [b"after"]
    _write_taken(claim_log, taken, _items("slow-1", "slow-2"), NOW + timedelta(milliseconds=50))

    found = claim_log.collect(KEY, claim.token, now=NOW + timedelta(milliseconds=60))

    assert _payloads(found.items) == [b"slow-1", b"slow-2"] and found.holes == []
    assert [i.id for i in found.items] == taken
    everything = [*taken, claim.items[0].id]
    assert _complete(claim_log, everything).applied == everything


def test_a_dead_writer_is_filled_and_a_late_one_lands_at_the_tail(claim_log: ClaimLog) -> None:
    taken = _take(claim_log, 3)
    claim_log.append(KEY, _items("after"), now=NOW)
    claim = _claim(claim_log, 10)

    early = claim_log.collect(KEY, claim.token, now=NOW + timedelta(seconds=HOLE_TIMEOUT_S / 2))
    assert early.items == [] and early.holes == taken
    filled = claim_log.collect(KEY, claim.token, now=NOW + timedelta(seconds=HOLE_TIMEOUT_S))
    assert filled.items == [] and filled.holes == []

    late = NOW + timedelta(seconds=HOLE_TIMEOUT_S + 1)
    stored = _write_taken(claim_log, taken, _items("late-1", "late-2", "late-3"), late)

    assert _payloads(stored) == [b"late-1", b"late-2", b"late-3"]
    assert not {i.id for i in stored} & set(taken)
    assert _complete(claim_log, taken, now=late).rejected == taken
    assert _complete(claim_log, [claim.items[0].id], now=late).applied == [claim.items[0].id]
    assert _payloads(_drain(claim_log, now=late)) == [b"late-1", b"late-2", b"late-3"]
    head = claim_log.head(KEY)
    assert head.leases == 0 and head.leased == 0 and head.waiting == 0


def test_an_expired_lease_with_a_hole_is_filled_on_the_way(claim_log: ClaimLog) -> None:
    claim_log.append(KEY, _items("before"), now=NOW)
    taken = _take(claim_log, 1)
    claim = _claim(claim_log, 10)
    assert _payloads(claim.items) == [b"before"] and claim.holes == taken

    late = NOW + LEASE
    runs = claim_log.expired(KEY, now=late, limit=10)

    assert [(r.token, _payloads(r.items)) for r in runs] == [(claim.token, [b"before"])]
    claim_log.settle(
        KEY, [Settlement(id=i.id, to=KEY, item=i) for i in runs[0].items], guard=Guard.LEASE_EXPIRED, now=late
    )
    assert claim_log.head(KEY).leases == 0
    assert _write_taken(claim_log, taken, _items("late"), late)[0].id not in taken
    assert _payloads(_drain(claim_log, now=late)) == [b"before", b"late"]


def test_a_retried_write_of_taken_positions_does_not_write_twice(claim_log: ClaimLog) -> None:
    taken = _take(claim_log, 2)
    first = _write_taken(claim_log, taken, _items("a", "b"), NOW)

    again = _write_taken(claim_log, taken, _items("a", "b"), NOW + timedelta(milliseconds=10))

    assert [i.id for i in first] == [i.id for i in again] == taken
    assert _payloads(_drain(claim_log)) == [b"a", b"b"]


# --- at depth: the work of a call is its own ---------------------------------------------------------


@pytest.mark.slow
def test_many_leases_in_flight_leave_claims_and_settles_working(claim_log: ClaimLog) -> None:
    claim_log.append(KEY, _items(*[f"{n:04}" for n in range(400)]), now=NOW)
    held = [_claim(claim_log, 5) for _ in range(60)]

    last = _claim(claim_log, 5)
    _complete(claim_log, [i.id for i in held[0].items])
    renewed = claim_log.renew(KEY, [i.id for i in held[1].items], deadline=NOW + timedelta(hours=1), now=NOW)

    assert _payloads(last.items) == [f"{n:04}".encode() for n in range(300, 305)]
    assert len(renewed.applied) == 5
    head = claim_log.head(KEY)
    assert head.leases == 60 and head.leased == 300
    expired = claim_log.expired(KEY, now=NOW + LEASE, limit=100)
    assert len(expired) == 59
    assert {r.token for r in expired} == {c.token for c in held[2:]} | {last.token}
