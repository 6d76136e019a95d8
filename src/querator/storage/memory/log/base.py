"""Storage layer, engine v3's claim log in memory: one log's rows (``_Log``), and the base of the
rows' role mixins."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from querator.ports.log import LogKey
    from querator.storage.embedded.log.base import HeadRow, PackedRow, RunRecord


@dataclass(slots=True)
class _Log:
    """One claim log's rows: the head, packed rows by first position, lease records by token (which
    sorts by run) and by deadline, schedule rows by id (which sorts by due time)."""

    head: HeadRow
    firsts: list[int] = field(default_factory=list)
    rows: dict[int, PackedRow] = field(default_factory=dict)
    tokens: list[str] = field(default_factory=list)
    records: dict[str, RunRecord] = field(default_factory=dict)
    deadlines: list[tuple[int, str]] = field(default_factory=list)
    schedule_ids: list[str] = field(default_factory=list)
    schedule: dict[str, bytes] = field(default_factory=dict)


class MemoryLogRowsBase:
    """What the log rows' role mixins share: the logs, the undo list, the head, reading rows, and
    keeping records and schedule rows in their sorted lists."""

    def __init__(self) -> None:
        self._logs: dict[LogKey, _Log] = {}
        self.undo: list[Callable[[], None]] = []

    def _log(self, key: LogKey) -> _Log | None:
        return self._logs.get(key)

    def head(self, key: LogKey) -> HeadRow | None:
        log = self._logs.get(key)
        return None if log is None else replace(log.head)

    def put_head(self, key: LogKey, head: HeadRow) -> None:
        log = self._logs[key]
        old = log.head
        log.head = replace(head)
        self.undo.append(lambda: setattr(log, "head", old))

    def add_counts(
        self, key: LogKey, *, leases: int = 0, leased: int = 0, scheduled: int = 0, completed: int = 0
    ) -> None:
        head = replace(self._logs[key].head)
        head.leases += leases
        head.leased += leased
        head.scheduled += scheduled
        head.completed += completed
        self.put_head(key, head)

    def rows(self, key: LogKey, start: int, end: int, limit: int) -> list[PackedRow]:
        log = self._logs.get(key)
        if log is None:
            return []
        first = max(bisect.bisect_right(log.firsts, start) - 1, 0)
        last = min(bisect.bisect_left(log.firsts, end, first), first + limit)
        return [log.rows[f] for f in log.firsts[first:last]]

    @staticmethod
    def _record(log: _Log, record: RunRecord) -> None:
        log.records[record.token] = record
        bisect.insort(log.tokens, record.token)
        bisect.insort(log.deadlines, (record.deadline_us, record.token))

    @staticmethod
    def _unrecord(log: _Log, record: RunRecord) -> None:
        del log.records[record.token]
        del log.tokens[bisect.bisect_left(log.tokens, record.token)]
        del log.deadlines[bisect.bisect_left(log.deadlines, (record.deadline_us, record.token))]

    @staticmethod
    def _unschedule(log: _Log, item_id: str) -> None:
        del log.schedule[item_id]
        log.schedule_ids.remove(item_id)
