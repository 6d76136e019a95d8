"""Storage layer, engine v3's claim log on DynamoDB, the leasing role: the claim's fetch-and-add on
the head, spilling records beyond ``HEAD_RECORDS``, collecting holes, settling (one transaction
per record, with the appends it carries), renewing and reprioritizing."""

from __future__ import annotations

import secrets
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from querator.domain.errors import QueratorError, StoreThrottledError
from querator.domain.model import reply_bytes_at_most, timestamp_us, utc_from_timestamp_us
from querator.domain.positions import HOLE_TIMEOUT_S, parse_position_id, parse_scheduled_id, position_id
from querator.ports import BatchResult, Guard
from querator.ports.log import Claim, ClaimReadError, LogKey, Settled, Settlement
from querator.storage.dynamodb import codec, schema
from querator.storage.dynamodb.errors import translate
from querator.storage.dynamodb.log.base import (
    _RETRIES,
    _US,
    AttributeMap,
    DynamoDBLogBase,
    _add_created,
    _Change,
    _ConflictError,
    _decode_head,
    _entry,
    _entry_object,
    _entry_seconds,
    _Found,
    _Head,
    _item,
    _key,
    _num,
    _numbers,
    _ordered,
    _Record,
    _record_sk,
    _schedule_sk,
    _value_size,
    log,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from datetime import datetime

    from querator.domain.model import Item


#: Records the head keeps; the claim that reaches this many moves the ``SPILL`` oldest out.
HEAD_RECORDS = 32
SPILL = 16
#: DynamoDB's limits for one ``TransactWriteItems``: 100 items, 4 MB (kept well below).
_TRANSACTION_ITEMS = 100
_TRANSACTION_BYTES = 3_500_000
_HOLE_TIMEOUT_US = int(HOLE_TIMEOUT_S * _US)


def _leased(
    key: LogKey, rows: dict[int, dict[str, Any]], positions: Iterable[int], deadline: datetime
) -> list[Item]:
    """The items at ``positions`` (those read) as a claim hands them out: this lease's deadline,
    and its attempt counted (the row keeps the attempts before it)."""
    return [
        replace(
            _item(rows[p], position_id(key.lane, p)),
            attempts=int(rows[p].get(schema.ATTEMPTS, {"N": "0"})["N"]) + 1,
            lease_deadline=deadline,
        )
        for p in positions
        if p in rows
    ]


def _record_moves(
    moved: dict[str, str], settlements: Sequence[Settlement], assigned: dict[LogKey, list[str]]
) -> None:
    """Put in ``moved`` the id each moving settlement's item got (``assigned``: by target, in the
    order of the settlements moving there), once their step is committed."""
    by_target: dict[LogKey, list[str]] = {}
    for settlement in settlements:
        if settlement.to is not None and settlement.item is not None:
            by_target.setdefault(settlement.to, []).append(settlement.id)
    for target, ids in by_target.items():
        moved.update(zip(ids, assigned.get(target, []), strict=True))


def _admits(guard: Guard, record: _Record, now_us: int) -> bool:
    if guard is Guard.LEASE_VALID:
        return record.deadline > now_us
    if guard in (Guard.LEASE_EXPIRED, Guard.NOT_VALIDLY_LEASED):
        return record.deadline <= now_us
    return guard is Guard.ANY


class DynamoDBLogLeasing(DynamoDBLogBase):
    """``LogLeasingPort`` on the items table."""

    def claim(
        self,
        key: LogKey,
        *,
        count: int,
        deadline: datetime,
        now: datetime,
        max_leased: int | None = None,
        room: int | None = None,
    ) -> Claim:
        empty = Claim(token="", deadline=deadline)
        if count <= 0:
            return empty
        now_us, deadline_us = timestamp_us(now), timestamp_us(deadline)
        asked = count
        for attempt in range(_RETRIES * 4):
            head = self._head(key, "lease")
            waiting = head.tail - head.cursor
            count = asked if max_leased is None else min(asked, max_leased - head.leased)
            if room is not None:
                count = min(count, room // reply_bytes_at_most(head.largest))
            if not head.exists or waiting <= 0 or count <= 0:
                return empty
            token = secrets.token_hex(6)
            taken = min(count, waiting)
            # The rows this claim will take unless another claim comes first, read before it: their
            # ages go into the claim's own write (LogAges), so a claim that meets no competitor
            # writes once, and reads no more than after it would have.
            before, guess = self._guess(key, head, taken)
            record = _Record(
                token=token, start=0, count=taken, deadline=deadline_us, claimed_at=now_us, created=guess
            )
            change = _Change(_key(key, schema.LOG_HEAD_SK))
            _add_created(change, waiting=-guess, leased=guess)
            cur = change.name(schema.LOG_CURSOR)
            start_path = change.name(schema.LOG_STARTS, token)
            change.sets.append(
                f"{change.name(schema.LOG_RECORDS, token)} = {change.value({'M': record.fields()})}"
            )
            leased = change.name(schema.LOG_LEASED)
            change.adds.append(f"{leased} {change.value(_num(taken))}")
            if max_leased is not None:
                # The cap holds in the write itself: of two claims that both saw room, one fails.
                cap = change.value(_num(max_leased - taken))
                change.conditions.append(f"attribute_not_exists({leased}) OR {leased} <= {cap}")
            k = change.value(_num(taken))
            if taken == count:
                # Fetch-and-add: whoever moved the cursor since the read, this claim takes the next
                # ``count`` positions while the backlog holds them (the tail only grows).
                change.sets += [f"{start_path} = {cur}", f"{cur} = {cur} + {k}"]
                change.conditions.append(f"{cur} <= {change.value(_num(head.tail - count))}")
            else:
                # Fewer waiting than asked: exactly those, if nobody moved the cursor.
                change.sets += [
                    f"{start_path} = {change.value(_num(head.cursor))}",
                    f"{cur} = {change.value(_num(head.cursor + taken))}",
                ]
                change.conditions.append(f"{cur} = {change.value(_num(head.cursor))}")
            # A claim whose reply was lost and that botocore sent again must not move the cursor a
            # second time (the first run would belong to nobody): the retry fails on its own record.
            change.conditions.append(f"attribute_not_exists({change.name(schema.LOG_RECORDS, token)})")
            reply = self._update(change, "lease", returns="ALL_NEW")
            retried: _Record | None = None
            if reply is None:
                again = self._head(key, "lease")
                retried = again.records.get(token)
                if retried is None:
                    self._backoff(attempt)
                    continue
                # Its own first try applied: the run is the one its record names.
                after, start = again, retried.start
            else:
                after = _decode_head(reply)
                # The run's start from the cursor this write left, not from ``la``: the record's
                # start was written as ``la.#tok = cur`` in the same SET as ``cur = cur + :k``, and
                # DynamoDB documents no order among one SET's actions (moto reads the item as it
                # was before). Should the stored start differ, it is written again before anyone
                # learns the token.
                start = after.cursor - taken
            record = replace(record, start=start)
            try:
                mine = after.records.get(token)
                if retried is None and (mine is None or mine.start != start):
                    fix = _Change(_key(key, schema.LOG_HEAD_SK))
                    fix.sets.append(f"{fix.name(schema.LOG_STARTS, token)} = {fix.value(_num(start))}")
                    self._update(fix, "lease")
                self._spill(key, after, now_us, keep=token)
                claim = self._finish_claim(
                    key,
                    record,
                    after.tombstones,
                    deadline,
                    now,
                    read=before if start == head.cursor else None,
                )
            except QueratorError as exc:
                # The run is this caller's now: say which, so it can be given back at once rather
                # than wait for its deadline (a failed lease holds nothing it did not return).
                ids = [position_id(key.lane, p) for p in record.positions()]
                raise ClaimReadError(token, ids, exc) from exc
            if claim is not None:
                if not any(item.payload_object for item in claim.items):
                    # A run holding payload objects is settled the long way, which reads its rows
                    # to find the objects of what it ends.
                    self._remember(key, record)
                return claim
        return empty

    def _guess(self, key: LogKey, head: _Head, taken: int) -> tuple[_Found, int]:
        """The rows of the ``taken`` positions after the cursor ``head`` read, and their items'
        ``created`` seconds (tombstoned ones already left the waiting sum)."""
        found = self._read_positions(key, range(head.cursor, head.cursor + taken), "lease", consistent=False)
        return found, _entry_seconds(v for p, v in found.items.items() if p not in head.tombstones)

    def _finish_claim(
        self,
        key: LogKey,
        record: _Record,
        tombstones: set[int],
        deadline: datetime,
        now: datetime,
        *,
        read: _Found | None = None,
    ) -> Claim | None:
        """Read the run's rows (``read``: read before the claim, when its run is the one guessed);
        skip what was filled or deleted while waiting (settled in the record with one more write,
        only then); ``None`` when nothing of it was left to hand out."""
        positions = record.positions()
        # Rows are written once: an eventually consistent read (half the units) is right unless it
        # misses a row written a moment ago, so a run that seems to have a hole is read again, strongly.
        found = read if read is not None else self._read_positions(key, positions, "lease", consistent=False)
        if any(p not in found.items and p not in found.filled for p in positions):
            found = self._read_positions(key, positions, "lease")
        done = found.filled | (tombstones & set(positions))
        for position in done:
            found.items.pop(position, None)
        holes = {p for p in positions if p not in found.items and p not in done}
        # The claim's write moved the ages of the items it guessed from the waiting sum to the record
        # and the leased sum; another claim in between (or a row written since the guess) makes the
        # run's own differ: the difference goes in the write that settles what it skipped when there
        # is one, else in one of its own (a stats figure: its failure fails nothing).
        guessed, record.created = record.created, _entry_seconds(found.items.values())
        if done or holes:
            record.settled |= done
            record.holes = holes
            self._rewrite_claimed(key, record, len(done), done & tombstones, guessed=guessed)
        elif record.created != guessed:
            self._note_claimed(key, record, guessed=guessed)
        if not found.items and not holes:
            return None
        items = self._with_payloads(_leased(key, found.items, positions, deadline))
        return Claim(
            token=record.token,
            deadline=deadline,
            items=items,
            holes=[position_id(key.lane, p) for p in sorted(holes)],
        )

    def _note_claimed(self, key: LogKey, record: _Record, *, guessed: int) -> None:
        change = _Change(_key(key, schema.LOG_HEAD_SK))
        path = change.name(schema.LOG_RECORDS, record.token)
        change.sets.append(
            f"{change.name(schema.LOG_RECORDS, record.token, schema.LOG_RECORD_CREATED)}"
            f" = {change.value(_num(record.created))}"
        )
        change.conditions.append(f"attribute_exists({path})")
        delta = record.created - guessed
        _add_created(change, waiting=-delta, leased=delta)
        if self._update(change, "lease") is None:
            self._left_waiting(key, record, guessed=guessed)

    def _left_waiting(self, key: LogKey, record: _Record, *, guessed: int) -> None:
        """A claim's record that moved out of the head before its ages were corrected in it
        (spilled by a concurrent claim, which is rare): the waiting sum is corrected; the record
        keeps the guess the leased sum holds for it."""
        claimed, record.created = record.created, guessed
        if claimed != guessed:
            left = _Change(_key(key, schema.LOG_HEAD_SK))
            _add_created(left, waiting=guessed - claimed)
            self._update(left, "lease")

    def _rewrite_claimed(
        self, key: LogKey, record: _Record, settled: int, tombstones: set[int], *, guessed: int
    ) -> None:
        change = _Change(_key(key, schema.LOG_HEAD_SK))
        path = change.name(schema.LOG_RECORDS, record.token)
        if record.open():
            change.sets.append(f"{path} = {change.value({'M': record.fields()})}")
        else:
            change.removes += [path, change.name(schema.LOG_STARTS, record.token)]
        change.conditions.append(f"attribute_exists({path})")
        if settled:
            change.adds.append(f"{change.name(schema.LOG_LEASED)} {change.value(_num(-settled))}")
        if tombstones:
            change.deletes.append(
                f"{change.name(schema.LOG_TOMBSTONES)} {change.value(_numbers(tombstones))}"
            )
        delta = record.created - guessed
        _add_created(change, waiting=-delta, leased=delta)
        if self._update(change, "lease") is None:
            # Spilled in between (only the oldest are, so this is rare): the next settle or expiry
            # reads the rows again and finds the same.
            log.info("claim %s of %s moved out of the head before its rows were read", record.token, key)
            self._left_waiting(key, record, guessed=guessed)

    def _spill(self, key: LogKey, head: _Head, now_us: int, *, keep: str) -> None:
        """At ``HEAD_RECORDS`` records, move the ``SPILL`` oldest to ``P``/``L`` rows in one transaction,
        conditional on each being as read (a concurrent settle cancels it: a later claim retries)."""
        if len(head.records) < HEAD_RECORDS:
            return
        candidates = [r for r in head.records.values() if r.token != keep and not r.holes]
        oldest = sorted(candidates, key=lambda r: (r.deadline, r.token))[:SPILL]
        if not oldest:
            return
        change = _Change(_key(key, schema.LOG_HEAD_SK))
        actions: list[AttributeMap] = []
        for record in oldest:
            path = change.name(schema.LOG_RECORDS, record.token)
            change.removes += [path, change.name(schema.LOG_STARTS, record.token)]
            version = change.name(schema.LOG_RECORDS, record.token, schema.LOG_VERSION)
            change.conditions.append(f"{version} = {change.value(_num(record.version))}")
            sk = _record_sk(record.start, record.token)
            actions.append({"Put": {"TableName": self._table, "Item": self._spilled_row(key, record, sk)}})
            actions.append({"Put": {"TableName": self._table, "Item": self._expiry_row(key, record, sk)}})
        change.adds.append(f"{change.name(schema.LOG_SPILLED)} {change.value(_num(len(oldest)))}")
        lowest = min(r.deadline for r in oldest)
        if head.spilled and head.spilled_expiry is not None:
            lowest = min(lowest, head.spilled_expiry)
        change.sets.append(f"{change.name(schema.LOG_SPILLED_EXPIRY)} = {change.value(_num(lowest))}")
        # One spill at a time: the spilled deadlines' lower bound is computed from this read.
        sp = change.name(schema.LOG_SPILLED)
        if head.spilled:
            change.conditions.append(f"{sp} = {change.value(_num(head.spilled))}")
        else:
            change.conditions.append(f"attribute_not_exists({sp}) OR {sp} = {change.value(_num(0))}")
        try:
            self._transact([{"Update": change.kwargs(self._table)}, *actions], "lease")
        except _ConflictError:
            log.debug("spill of %s lost to a concurrent write; a later claim moves them", key)

    def collect(self, key: LogKey, token: str, *, now: datetime) -> Claim:
        now_us = timestamp_us(now)
        for attempt in range(_RETRIES + 1):
            head = self._head(key, "collect")
            record = head.records.get(token) or self._spilled_by_token(key, token)
            if record is None or not record.holes:
                deadline = utc_from_timestamp_us(record.deadline) if record else now
                return Claim(token=token, deadline=deadline)
            deadline = utc_from_timestamp_us(record.deadline)
            holes = sorted(record.holes - record.settled)
            found = self._read_positions(key, holes, "collect")
            still = [p for p in holes if p not in found.items and p not in found.filled]
            if still and now_us - record.claimed_at >= _HOLE_TIMEOUT_US:
                filled = self._fill(key, still, now, first=head.first)
                found.items.update(filled.items)
                found.filled |= filled.filled
                still = [p for p in still if p not in found.items and p not in found.filled]
            if len(still) == len(holes):
                return Claim(token=token, deadline=deadline, holes=[position_id(key.lane, p) for p in still])
            head_change = _Change(_key(key, schema.LOG_HEAD_SK))
            actions: list[AttributeMap] = []
            # Filled positions are done; the written ones are delivered now and leave the holes, and
            # their ages the waiting sum for the record's and the leased one.
            arrived = _entry_seconds(found.items.values())
            updated = replace(record, holes=set(still), created=record.created + arrived)
            _add_created(head_change, waiting=-arrived, leased=arrived)
            self._record_change(key, updated, head_change, actions, settled=set(found.filled))
            self._forget(key, record)
            try:
                self._commit([head_change], actions, "collect")
            except _ConflictError:
                self._backoff(attempt)
                continue
            items = self._with_payloads(_leased(key, found.items, holes, deadline))
            return Claim(
                token=token, deadline=deadline, items=items, holes=[position_id(key.lane, p) for p in still]
            )
        raise StoreThrottledError("collect kept losing to concurrent writes; retry")

    def _spilled_by_token(self, key: LogKey, token: str) -> _Record | None:
        """A spilled record by its token alone: reads every spilled record (only ``collect`` of a
        record spilled before its holes were known comes here)."""
        return next((r for r in self._every_spilled(key, "collect") if r.token == token), None)

    def settle(
        self,
        key: LogKey,
        settlements: Sequence[Settlement],
        *,
        guard: Guard,
        now: datetime,
        completed: bool = False,
    ) -> Settled:
        if self._objects is None or not any(s.item is not None and s.to is not None for s in settlements):
            return self._settle(key, settlements, guard=guard, now=now, completed=completed)
        # Moving items' objects are stored once for the call, not once a retried step: a move that
        # gives an item a later expiry copies its object to a key kept as long (``_stored``).
        stored: list[Settlement] = []
        copies: dict[str, tuple[str, str]] = {}
        for settlement in settlements:
            if settlement.item is None or settlement.to is None:
                stored.append(settlement)
                continue
            (item,), made, replaced = self._stored([settlement.item])
            if made and replaced:
                copies[settlement.id] = (made[0], replaced[0])
            stored.append(replace(settlement, item=item))
        result = self._settle(key, stored, guard=guard, now=now, completed=completed)
        applied = set(result.applied)
        # The copy of a move that happened replaces its object; one that did not is dropped.
        self._release(
            (old if item_id in applied else copy for item_id, (copy, old) in copies.items()), "settle"
        )
        return result

    def _settle(
        self,
        key: LogKey,
        settlements: Sequence[Settlement],
        *,
        guard: Guard,
        now: datetime,
        completed: bool,
    ) -> Settled:
        result = Settled()
        pending: dict[int, Settlement] = {}
        scheduled: dict[str, Settlement] = {}
        # ANY and NOT_VALIDLY_LEASED also take waiting and scheduled items (a move, a redrive).
        broad = guard in (Guard.ANY, Guard.NOT_VALIDLY_LEASED)
        for settlement in settlements:
            parsed = parse_position_id(settlement.id)
            due = parse_scheduled_id(settlement.id)
            if broad and due is not None and due[0] == key.lane and settlement.id not in scheduled:
                scheduled[settlement.id] = settlement
                continue
            if parsed is None or parsed[0] != key.lane or parsed[1] in pending or guard is Guard.NEVER_LEASED:
                result.rejected.append(settlement.id)
                continue
            pending[parsed[1]] = settlement
        now_us = timestamp_us(now)
        if guard is Guard.LEASE_VALID and all(s.to is None for s in pending.values()):
            self._settle_mine(key, pending, result, now_us, completed=completed)
        # A waiting or scheduled item is settled one a turn: the turns are the retries after a
        # lost race plus one per settlement, so a clear or redrive of many is not cut at _RETRIES.
        for attempt in range(_RETRIES + 1 + len(pending) + len(scheduled)):
            if not pending and not scheduled:
                return _ordered(result, [s.id for s in settlements])
            head = self._head(key, "settle")
            if scheduled:
                item_id, settlement = next(iter(scheduled.items()))
                try:
                    applied = self._settle_scheduled(key, head, settlement, now, result.moved)
                except _ConflictError:
                    self._backoff(attempt)
                    continue
                (result.applied if applied else result.rejected).append(scheduled.pop(item_id).id)
                continue
            waiting = [p for p in sorted(pending) if p >= head.cursor]
            if waiting:
                if not broad:
                    for position in waiting:
                        result.rejected.append(pending.pop(position).id)
                    continue
                position = waiting[0]
                try:
                    applied = self._settle_waiting(
                        key, head, position, pending[position], now, completed, result.moved
                    )
                except _ConflictError:
                    self._backoff(attempt)
                    continue
                (result.applied if applied else result.rejected).append(pending.pop(position).id)
                continue
            located = self._locate(key, head, sorted(pending), "settle")
            by_record: dict[str, tuple[_Record, list[int]]] = {}
            for position in sorted(pending):
                record = located.get(position)
                if record is None or not _admits(guard, record, now_us):
                    result.rejected.append(pending.pop(position).id)
                    continue
                by_record.setdefault(record.token, (record, []))[1].append(position)
            for record, positions in by_record.values():
                chunk = self._fitting(positions, pending)
                try:
                    moved_tail = self._settle_record(
                        key, head, record, [pending[p] for p in chunk], now, result.moved, completed=completed
                    )
                except _ConflictError:
                    self._backoff(attempt)
                    break  # read again
                for position in chunk:
                    result.applied.append(pending.pop(position).id)
                if moved_tail or len(chunk) < len(positions):
                    break  # the head's tail (or this record) moved on: read again
        if pending or scheduled:
            raise StoreThrottledError(f"settle kept losing to concurrent writes ({len(pending)} left); retry")
        return _ordered(result, [s.id for s in settlements])

    def _settle_waiting(
        self,
        key: LogKey,
        head: _Head,
        position: int,
        settlement: Settlement,
        now: datetime,
        completed: bool,
        moved: dict[str, str],
    ) -> bool:
        """A waiting position settled (and its item moved) in one step: a tombstone, which every
        later claim skips, written only while the position still waits. False: nothing stored there."""
        if position >= head.tail or position in head.tombstones:
            return False
        there = self._read_positions(key, [position], "settle").items.get(position)
        if there is None:
            return False
        change = _Change(_key(key, schema.LOG_HEAD_SK))
        tb, p = change.name(schema.LOG_TOMBSTONES), change.value(_numbers([position]))
        change.adds.append(f"{tb} {p}")
        _add_created(change, waiting=-_entry_seconds([there]))
        single = change.value(_num(position))
        change.conditions.append(f"{change.name(schema.LOG_CURSOR)} <= {single}")
        change.conditions.append(f"NOT contains({tb}, {single})")
        actions: list[AttributeMap] = []
        targets = (
            {settlement.to: [replace(settlement.item, lease_deadline=None)]}
            if settlement.to and settlement.item
            else {}
        )
        if completed and not targets:
            change.adds.append(f"{change.name(schema.LOG_COMPLETED)} {change.value(_num(1))}")
        assigned: dict[LogKey, list[str]] = {}
        others = self._appends(key, head, change, targets, now, actions, assigned)
        self._commit([change, *others], actions, "settle")
        _record_moves(moved, [settlement], assigned)
        if not targets and (ended := _entry_object(there)) is not None:
            self._release([ended], "settle")
        return True

    def _settle_scheduled(
        self, key: LogKey, head: _Head, settlement: Settlement, now: datetime, moved: dict[str, str]
    ) -> bool:
        """A scheduled item leaves the schedule (and moves) in one step. False: no such item."""
        sort_key = _schedule_sk(settlement.id, key.lane)
        try:
            reply = self._client.get_item(TableName=self._table, Key=_key(key, sort_key), ConsistentRead=True)
        except ClientError as exc:
            raise translate(exc, "settle") from exc
        row = codec.returned(reply, "Item")
        if row is None:
            return False
        change = _Change(_key(key, schema.LOG_HEAD_SK))
        change.adds.append(f"{change.name(schema.LOG_SCHEDULED)} {change.value(_num(-1))}")
        actions: list[AttributeMap] = [
            {
                "Delete": {
                    "TableName": self._table,
                    "Key": _key(key, sort_key),
                    "ConditionExpression": "attribute_exists(#sk)",
                    "ExpressionAttributeNames": {"#sk": schema.SK},
                }
            }
        ]
        targets = (
            {settlement.to: [replace(settlement.item, lease_deadline=None)]}
            if settlement.to and settlement.item
            else {}
        )
        assigned: dict[LogKey, list[str]] = {}
        others = self._appends(key, head, change, targets, now, actions, assigned)
        self._commit([change, *others], actions, "settle")
        _record_moves(moved, [settlement], assigned)
        if not targets and (ended := _entry_object(row)) is not None:
            self._release([ended], "settle")
        return True

    def _settle_mine(
        self,
        key: LogKey,
        pending: dict[int, Settlement],
        result: BatchResult[str],
        now_us: int,
        *,
        completed: bool,
    ) -> None:
        """Complete positions of records this instance claimed with one conditional write each,
        unread: the record's version in the condition makes a stale memory fail (then the caller
        reads the head as usual)."""
        with self._pool_lock:
            tokens = {self._mine_at.get((key, p)) for p in pending}
            if None in tokens:
                return
            records = [self._mine.get((key, t)) for t in tokens if t is not None]
        for record in records:
            if record is None or record.deadline <= now_us:
                continue
            positions = {p for p in pending if record.holds(p)}
            if not positions <= set(record.open()):
                continue
            change = _Change(_key(key, schema.LOG_HEAD_SK))
            dropped = self._record_change(key, record, change, [], settled=positions)
            if completed:
                change.adds.append(
                    f"{change.name(schema.LOG_COMPLETED)} {change.value(_num(len(positions)))}"
                )
            try:
                self._commit([change], [], "settle")
            except _ConflictError:
                self._forget(key, record)  # read below
                continue
            updated = replace(
                record,
                settled=record.settled | positions,
                version=record.version + 1,
                created=record.created - dropped,
            )
            self._forget(key, record)
            if updated.open():
                self._remember(key, updated)
            for position in sorted(positions):
                result.applied.append(pending.pop(position).id)

    @staticmethod
    def _fitting(positions: list[int], pending: dict[int, Settlement]) -> list[int]:
        """The leading settlements of one record that fit one transaction (rows, bytes)."""
        chunk: list[int] = []
        items, size = 4, 0
        for position in positions:
            item = pending[position].item
            extra = 0 if item is None else _value_size({"M": _entry(item)}) + 64
            if chunk and (items + 2 > _TRANSACTION_ITEMS or size + extra > _TRANSACTION_BYTES):
                break
            chunk.append(position)
            items += 0 if item is None else 2
            size += extra
        return chunk

    def _settle_record(
        self,
        key: LogKey,
        head: _Head,
        record: _Record,
        settlements: Sequence[Settlement],
        now: datetime,
        moved: dict[str, str],
        *,
        completed: bool = False,
    ) -> bool:
        """One atomic step for ``settlements`` of ``record``; True when it moved this log's tail.
        ``moved`` takes the ids the moved items got."""
        head_change = _Change(_key(key, schema.LOG_HEAD_SK))
        actions: list[AttributeMap] = []
        positions = {self._position(key, s.id) for s in settlements}
        self._record_change(key, record, head_change, actions, settled=positions)
        targets: dict[LogKey, list[Item]] = {}
        for settlement in settlements:
            if settlement.to is not None and settlement.item is not None:
                targets.setdefault(settlement.to, []).append(replace(settlement.item, lease_deadline=None))
        done = sum(1 for s in settlements if s.to is None or s.item is None)
        if completed and done:
            head_change.adds.append(
                f"{head_change.name(schema.LOG_COMPLETED)} {head_change.value(_num(done))}"
            )
        assigned: dict[LogKey, list[str]] = {}
        others = self._appends(key, head, head_change, targets, now, actions, assigned)
        self._commit([head_change, *others], actions, "settle")
        self._forget(key, record)
        _record_moves(moved, settlements, assigned)
        ended = [self._position(key, s.id) for s in settlements if s.to is None or s.item is None]
        self._release_positions(key, head, ended, "settle")
        return key in targets

    def renew(
        self, key: LogKey, ids: Sequence[str], *, deadline: datetime, now: datetime
    ) -> BatchResult[str]:
        deadline_us = timestamp_us(deadline)
        return self._per_valid_record(
            key,
            ids,
            now,
            "renew",
            lambda record, positions: self._renew_record(key, record, set(positions), deadline_us),
            holes=True,
            repeats_rejected=True,
        )

    def set_next_priority(
        self, key: LogKey, ids: Sequence[str], *, priority: int, now: datetime
    ) -> BatchResult[str]:
        # A hole is not the holder's yet (``get`` does not return it): nothing to give; a repeated
        # id is given its priority once.
        return self._per_valid_record(
            key,
            ids,
            now,
            "reprioritize",
            lambda record, positions: self._prioritize_record(key, record, positions, priority),
            holes=False,
            repeats_rejected=False,
        )

    def _per_valid_record(
        self,
        key: LogKey,
        ids: Sequence[str],
        now: datetime,
        operation: str,
        apply: Callable[[_Record, list[int]], None],
        *,
        holes: bool,
        repeats_rejected: bool,
    ) -> BatchResult[str]:
        """``apply`` to the validly leased positions of ``ids``, one call per lease record holding
        them (a write that lost to a concurrent one reads the head again; ``_RETRIES`` times).
        ``holes``: a hole of a record counts as held; ``repeats_rejected``: a repeated id is
        rejected, else it counts once."""
        result: BatchResult[str] = BatchResult()
        pending: dict[int, str] = {}
        for item_id in ids if repeats_rejected else dict.fromkeys(ids):
            parsed = parse_position_id(item_id)
            if parsed is None or parsed[0] != key.lane or parsed[1] in pending:
                result.rejected.append(item_id)
                continue
            pending[parsed[1]] = item_id
        now_us = timestamp_us(now)
        for attempt in range(_RETRIES + 1):
            if not pending:
                return _ordered(result, ids)
            head = self._head(key, operation)
            located = self._locate(key, head, sorted(pending), operation)
            groups: dict[str, tuple[_Record, list[int]]] = {}
            for position in sorted(pending):
                record = located.get(position)
                if (
                    record is None
                    or not _admits(Guard.LEASE_VALID, record, now_us)
                    or (not holes and position in record.holes)
                ):
                    result.rejected.append(pending.pop(position))
                    continue
                groups.setdefault(record.token, (record, []))[1].append(position)
            for record, positions in groups.values():
                try:
                    apply(record, positions)
                except _ConflictError:
                    self._backoff(attempt)
                    break  # read again
                for position in positions:
                    result.applied.append(pending.pop(position))
        if pending:
            raise StoreThrottledError(
                f"{operation} kept losing to concurrent writes ({len(pending)} left); retry"
            )
        return _ordered(result, ids)

    def _prioritize_record(self, key: LogKey, record: _Record, positions: list[int], priority: int) -> None:
        """One write of ``record`` with ``positions``' coming priority, conditional on its version:
        the head row's record (one ``UpdateItem``), or the spilled ``P`` row (one ``PutItem``)."""
        given = replace(record, priorities={**record.priorities, **dict.fromkeys(positions, priority)})
        head_change = _Change(_key(key, schema.LOG_HEAD_SK))
        actions: list[AttributeMap] = []
        self._record_change(key, given, head_change, actions, settled=set())
        self._commit([head_change], actions, "reprioritize")
        self._forget(key, record)

    def _renew_record(self, key: LogKey, record: _Record, positions: set[int], deadline_us: int) -> None:
        head_change = _Change(_key(key, schema.LOG_HEAD_SK))
        actions: list[AttributeMap] = []
        if positions >= set(record.open()):
            self._record_change(key, record, head_change, actions, settled=set(), deadline=deadline_us)
        else:
            # Part of a run: those positions move to a record of their own (in the head), the rest
            # keep their deadline. Moved is not settled: the leased count stays.
            moved = self._record_change(key, record, head_change, actions, settled=positions, count=False)
            split = _Record(
                token=secrets.token_hex(6),
                start=min(positions),
                count=len(positions),
                deadline=deadline_us,
                claimed_at=record.claimed_at,
                explicit=set(positions),
                holes=record.holes & positions,
                created=moved,
                priorities={p: n for p, n in record.priorities.items() if p in positions},
            )
            split_path = head_change.name(schema.LOG_RECORDS, split.token)
            split_start = head_change.name(schema.LOG_STARTS, split.token)
            head_change.sets += [
                f"{split_path} = {head_change.value({'M': split.fields()})}",
                f"{split_start} = {head_change.value(_num(split.start))}",
            ]
        self._commit([head_change], actions, "renew")
        self._forget(key, record)
