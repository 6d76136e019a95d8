"""Priorities and groups in the plan and the chunk's items, without a Spark session or a store: each
id is the item's band in front of the digits the chunk record fixes, so a resumed chunk regenerates
the same ids; each item keeps its group; a plan or job record staged before priorities or groups
existed reads as priority 5 without a group."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest
from pyspark.sql import Row

from querator.domain.ids import ID_LENGTH, is_item_id, time_key
from querator.domain.model import NewItem, QueueInfo
from querator.domain.priority import band, lane_of, priority_of, unbanded
from querator.spark.job import _columns_record, _from_plan, _RowPreparer, plan_schema
from querator.spark.mapping import ColumnMap, RowError
from querator.storage.dynamodb.bulk import ChunkPlan

#: ``datetime.UTC`` is Python 3.11+; the package supports 3.10 (docs/adr/0021-python-and-spark-versions.md).
UTC = timezone.utc

pytestmark = pytest.mark.spark

MINTED = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
QUEUE = QueueInfo(
    name="q",
    lease_timeout=timedelta(minutes=1),
    expire_timeout=timedelta(days=1),
    partitions=2,
    created_at=MINTED,
    updated_at=MINTED,
)
PLAN = ChunkPlan(partition=1, minted_at=MINTED, seq=0xFFFFFFF0, node=0xABCDEF, count=12)
PRIORITIES = [5, 0, 9, 5, 3, 0, 7, 5, 9, 1, 4, 6]


def new_items(priorities: list[int]) -> list[NewItem]:
    return [NewItem(payload=f"row {i}".encode(), priority=p) for i, p in enumerate(priorities)]


def test_each_id_is_its_priority_band_then_the_digits_the_record_fixes():
    items = PLAN.items(QUEUE, new_items(PRIORITIES))

    assert [item.priority for item in items] == PRIORITIES
    for index, (item, priority) in enumerate(zip(items, PRIORITIES, strict=True)):
        assert is_item_id(item.id)
        assert item.id.startswith(band(priority))
        assert priority_of(item.id) == priority
        digits = unbanded(item.id)
        assert len(digits) == ID_LENGTH
        assert digits == f"{time_key(MINTED)}{PLAN.seq + index:010x}abcdef"
    # Priority 5's ids are the 30 hex digits they always were.
    assert all(len(item.id) == ID_LENGTH for item in items if item.priority == 5)


def test_ids_sort_by_priority_then_by_the_chunks_order():
    items = PLAN.items(QUEUE, new_items(PRIORITIES))

    by_id = [item.payload for item in sorted(items, key=lambda item: item.id)]

    expected = sorted(range(len(PRIORITIES)), key=lambda index: (PRIORITIES[index], index))
    assert by_id == [f"row {index}".encode() for index in expected]


def test_a_resumed_chunk_regenerates_the_same_ids_with_their_bands():
    # The record gives a later attempt the same plan; the staged plan the same rows and priorities.
    first = PLAN.items(QUEUE, new_items(PRIORITIES))
    resumed = ChunkPlan(
        partition=PLAN.partition, minted_at=PLAN.minted_at, seq=PLAN.seq, node=PLAN.node, count=PLAN.count
    ).items(QUEUE, new_items(PRIORITIES))

    assert [item.id for item in resumed] == [item.id for item in first]
    assert len({item.id for item in first}) == len(first)


def test_a_scheduled_item_keeps_its_band_and_sorts_at_its_time():
    later = MINTED + timedelta(hours=1)
    (now_item, scheduled) = PLAN.items(
        QUEUE, [NewItem(payload=b"now", priority=2), NewItem(payload=b"later", priority=2, enqueue_at=later)]
    )

    assert scheduled.id.startswith(".2")
    assert unbanded(scheduled.id).startswith(time_key(later))
    assert scheduled.enqueue_at == later
    assert now_item.id < scheduled.id


# -- the staged plan and the job record -------------------------------------------------------------


#: A staged plan row as Spark reads it back: a ``Row`` with ``plan_schema``'s fields, in its order.
PlanRow = Row(*(field.name for field in plan_schema().fields))


def plan_row(priority: int | None, group: str | None = None) -> Row:
    """A staged plan row as Spark reads it back (a plan staged before priorities or groups: ``None``;
    Spark reads a column the plan's files lack as null)."""
    return PlanRow(
        0,  # bucket
        "k",  # row_key
        "d",  # digest
        bytearray(b"x"),  # payload
        None,  # reference
        None,  # encoding
        None,  # kind
        None,  # enqueue_at
        priority,
        group,
        None,  # error_row
        None,  # error_column
        None,  # error_reason
    )


def test_a_plan_row_without_a_priority_is_an_item_of_priority_five():
    assert _from_plan(plan_row(None))[1] == NewItem(payload=b"x")
    assert _from_plan(plan_row(2))[1] == NewItem(payload=b"x", priority=2)


def test_a_job_without_a_priority_column_keeps_the_job_record_it_had_before_priorities():
    # A re-run compares its mapping with the first run's record: one without a priority column
    # must still match a record written before the column existed.
    plain = _columns_record(ColumnMap(payload=("body",), key="id"))
    assert "priority" not in plain
    assert _columns_record(ColumnMap(payload=("body",), key="id", priority="p")) == {**plain, "priority": "p"}


# -- groups ------------------------------------------------------------------------------------------

GROUPS = ["acme", "", "globex", "acme", "é" * 64, "", "initech", "globex", "", "acme", "x", "y"]


def grouped_items() -> list[NewItem]:
    return [
        NewItem(payload=f"row {i}".encode(), priority=p, group=g)
        for i, (p, g) in enumerate(zip(PRIORITIES, GROUPS, strict=True))
    ]


def test_each_item_of_a_chunk_keeps_its_group():
    items = PLAN.items(QUEUE, grouped_items())

    assert [item.group for item in items] == GROUPS
    assert [item.priority for item in items] == PRIORITIES
    assert [item.payload for item in items] == [f"row {i}".encode() for i in range(len(GROUPS))]


def test_a_resumed_chunk_regenerates_identical_items_with_their_groups():
    first = PLAN.items(QUEUE, grouped_items())
    resumed = ChunkPlan(
        partition=PLAN.partition, minted_at=PLAN.minted_at, seq=PLAN.seq, node=PLAN.node, count=PLAN.count
    ).items(QUEUE, grouped_items())

    # Every field: the id (band and digits), the group, the deadlines.
    assert resumed == first
    assert {item.group for item in resumed} == set(GROUPS)


def test_a_plan_row_without_a_group_is_an_item_without_one():
    assert _from_plan(plan_row(None, None))[1] == NewItem(payload=b"x")
    assert _from_plan(plan_row(3, "acme"))[1] == NewItem(payload=b"x", priority=3, group="acme")


def test_a_prepared_plan_row_reads_back_as_the_same_item_with_its_group():
    # The staged row is positional (``plan_schema``'s order), and so is reading it back.
    columns = ColumnMap(payload=("body",), key="id", kind="kind", priority="prio", group="grp")
    preparer = _RowPreparer(columns=columns, job_id="j", buckets=4)
    for grp in ("tenant-7", None):
        source = Row(body="x", id=1, kind="k", prio=2, grp=grp)
        staged = PlanRow(*preparer(source))

        assert staged.group == grp
        assert _from_plan(staged)[1] == NewItem(payload=b"x", kind="k", priority=2, group=grp or "")


def test_a_bad_group_is_staged_as_an_invalid_row_naming_its_column():
    columns = ColumnMap(payload=("body",), key="id", group="grp")
    preparer = _RowPreparer(columns=columns, job_id="j", buckets=4)

    for grp, reason in (("g" * 129, "longer than 128 bytes"), ("two\nlines", "control characters")):
        staged = PlanRow(*preparer(Row(body="x", id=1, grp=grp)))
        _, error = _from_plan(staged)

        assert isinstance(error, RowError)
        assert (error.row, error.column) == ("id=1", "grp")
        assert reason in error.reason


def test_a_job_without_a_group_column_keeps_the_job_record_it_had_before_groups():
    plain = _columns_record(ColumnMap(payload=("body",), key="id", priority="p"))
    assert "group" not in plain
    assert _columns_record(ColumnMap(payload=("body",), key="id", priority="p", group="g")) == {
        **plain,
        "group": "g",
    }


def test_in_a_fair_queue_each_grouped_item_gets_its_groups_lane_and_a_resumed_chunk_the_same_ids():
    fair = replace(QUEUE, delivery="fair")
    first = PLAN.items(fair, grouped_items())
    again = PLAN.items(fair, grouped_items())

    assert [item.id for item in first] == [item.id for item in again]
    for item in first:
        assert is_item_id(item.id)
        assert priority_of(item.id) == item.priority
        assert lane_of(item.id) == band(item.priority) + fair.lane_for(item.group)
        assert len(unbanded(item.id)) == ID_LENGTH
    # Items without a group stay in their band: a group of their own.
    assert all(lane_of(i.id) == band(i.priority) for i in first if not i.group)
