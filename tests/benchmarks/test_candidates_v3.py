"""The v3 candidates benchmark's own parts: row packing, prices, ceilings, targets, and the log's
fence and expiry on moto in-process (the metered run itself is ``python -m benchmarks.candidates_v3``)."""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from moto import mock_aws

from benchmarks.candidates_v3 import (
    ITEM_OVERHEAD,
    LEASE_US,
    ROW_OVERHEAD,
    TARGETS,
    WORKLOADS,
    ClaimLogAdd,
    ClaimLogOne,
    ClaimLogSpill,
    ClaimLogTx,
    Clock,
    Figures,
    PackedRows,
    Report,
    StaleLeaseError,
    Workload,
    all_services_per_million,
    dollars_per_million,
    drain,
    identity,
    pack_rows,
    partition_ceiling,
    tagged_payload,
)
from benchmarks.flavour import DOCUMENTS, generated_block, parse_inputs
from benchmarks.meter import item_size, write_units

if TYPE_CHECKING:
    from collections.abc import Iterator

    from benchmarks.candidates_v3 import Candidate


def test_rows_keep_the_items_in_order_and_within_the_row_size() -> None:
    sizes = [100] * 250
    rows = pack_rows(sizes, 4096)
    assert [i for row in rows for i in row] == list(range(250))
    for row in rows:
        assert ROW_OVERHEAD + sum(sizes[i] + ITEM_OVERHEAD for i in row) <= 4096
    # Full rows: each took items while the next one still fitted.
    per_row = (4096 - ROW_OVERHEAD) // (100 + ITEM_OVERHEAD)
    assert [len(r) for r in rows[:-1]] == [per_row] * (len(rows) - 1)


def test_an_item_larger_than_a_row_gets_a_row_alone() -> None:
    assert pack_rows([100, 2000, 100], 1024) == [range(0, 1), range(1, 2), range(2, 3)]
    assert pack_rows([], 1024) == []


def test_a_stored_row_stays_within_its_size_and_pays_per_started_kb() -> None:
    log = ClaimLogTx(client=None, table="t", clock=Clock())  # type: ignore[arg-type]  # rows_at only
    payloads = [tagged_payload(100) for _ in range(300)]
    rows = log.rows_at(0, payloads, now=1_700_000_000_000_000)
    assert sum(len(r["it"]["L"]) for r in rows) == 300
    assert all(item_size(r) <= 16 * 1024 for r in rows)
    # 300 items of 100 B: two rows (155 + 145 items), 16 + 15 write units; a row per item: 300.
    assert len(rows) == 2
    assert sum(write_units(item_size(r)) for r in rows) == 31


def test_dollars_are_units_at_on_demand_prices_plus_three_rest_calls_per_batch() -> None:
    assert dollars_per_million(1.0, 0.0, batch=10) == pytest.approx(0.625 + 1.05)
    assert dollars_per_million(0.0, 2.0, batch=100) == pytest.approx(0.25 + 0.105)
    # At batch 10 the REST calls alone pass issue 35's $1.00 target: no data model meets it there.
    assert dollars_per_million(0.0, 0.0, batch=10) > 1.0
    assert dollars_per_million(0.0, 0.0, batch=10, call_price=1.00) == pytest.approx(0.30)


def test_all_services_add_lambda_as_docs_capacity_measured_it_to_the_flavours_calls() -> None:
    measured = {
        r.batch: r.lambda_per_million for r in parse_inputs(generated_block(DOCUMENTS[0].read_text()))
    }
    assert all_services_per_million(1.0, 0.0, batch=10) == pytest.approx(0.625 + 0.30 + measured[10])
    rest = all_services_per_million(1.0, 0.0, batch=10, call_price=3.50)
    assert rest == pytest.approx(0.625 + 1.05 + measured[10])
    # A batch between two measured ones is priced at the smaller one's Lambda cost (an upper bound).
    assert all_services_per_million(0.0, 0.0, batch=50) == pytest.approx(0.06 + measured[10])


def test_the_ceiling_is_the_tighter_of_the_partitions_write_and_read_limits() -> None:
    assert partition_ceiling(0.5, 0.3) == pytest.approx(2000)
    assert partition_ceiling(0.1, 2.0) == pytest.approx(1500)
    assert partition_ceiling(0.0, 0.0) == math.inf


def figures(
    candidate: str, workload: Workload, write_units: float, read_units: float, failed: int = 0
) -> Figures:
    return Figures(
        candidate=candidate,
        workload=workload,
        produced=100,
        delivered=100,
        leased=100,
        duplicates=0,
        missing=0,
        requests=100,
        write_units=write_units,
        read_units=read_units,
        failed_conditional_writes=failed,
    )


def test_targets_mark_met_and_not_met_from_the_figures() -> None:
    rows = [figures("v2", w, 300.0, 50.0, failed=131) for w in WORKLOADS]
    rows += [figures("X", w, 30.0, 40.0, failed=5) for w in WORKLOADS]
    report = Report(figures=rows, episodes=[], count=100, contention_count=100)
    verdicts = {t.label: t.check(report, "X") for t in TARGETS}
    assert verdicts["WCU/item 100 B x100 <= 0.5"] == (pytest.approx(0.3), True)
    assert verdicts["RCU/item other rows <= v2's (worst ratio)"] == (pytest.approx(0.8), True)
    assert verdicts["failed CW/leased, 16 consumers < 0.1"] == (pytest.approx(0.05), True)
    assert verdicts["ceiling 100 B x10 >= 3,000 items/s"] == (pytest.approx(3333.33, rel=1e-3), True)
    assert {t.label: t.check(report, "v2")[1] for t in TARGETS}["WCU/item 100 B x10 <= 1.0"] is False


# -- the candidates' semantics on moto in-process -----------------------------------------------


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        yield boto3.client("dynamodb", region_name="us-east-1")


KINDS = [ClaimLogTx, ClaimLogOne, ClaimLogAdd, ClaimLogSpill, PackedRows.sized(1)]


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_an_expired_lease_is_fenced_and_its_items_delivered_once_more(
    client: Any, kind: type[Candidate]
) -> None:
    clock = Clock()
    model = kind(client, "v3-test", clock)
    model.create_table()
    payloads = [tagged_payload(100) for _ in range(20)]
    model.produce(payloads[:10])
    model.produce(payloads[10:])
    abandoned = model.lease(10)
    assert abandoned is not None
    assert len(abandoned.identities) == 10
    clock.advance(LEASE_US + 1)
    with pytest.raises(StaleLeaseError):
        model.complete(abandoned)
    delivered = drain(model, consumers=1, batch=10, limit=20)
    assert delivered == Counter(identity(p) for p in payloads)


@pytest.mark.parametrize("kind", [ClaimLogTx, ClaimLogOne, ClaimLogAdd, ClaimLogSpill], ids=lambda k: k.name)
def test_the_log_delivers_in_produce_order_and_a_late_writer_loses_its_positions(
    client: Any, kind: type[ClaimLogTx]
) -> None:
    clock = Clock()
    model = kind(client, "v3-test", clock)
    model.hole_timeout_us = 0  # a hole is dead at its second sighting (L-add: at once)
    model.create_table()
    stalled = [tagged_payload(100) for _ in range(5)]
    first = model.take_positions(len(stalled))  # a writer that stalls before writing
    later = [tagged_payload(100) for _ in range(10)]
    model.produce(later)
    order: list[str] = []
    for _ in range(3):
        lease = model.lease(5)
        if lease is not None:
            model.complete(lease)
            order += lease.identities
    # The stalled writer comes back: its position is filled, so it produces again at the tail.
    late = model.write_rows(model.rows_at(first, stalled, clock.now()))
    assert len(late) == 1
    model.produce(stalled)
    order += drain(model, consumers=1, batch=5, limit=10).keys()
    assert order == [identity(p) for p in later + stalled]


def test_the_bounded_head_spills_records_that_still_complete_and_expire(client: Any) -> None:
    clock = Clock()
    model = ClaimLogSpill(client, "v3-test", clock)
    model.HEAD_BOUND, model.SPILL = 4, 2
    model.create_table()
    payloads = [tagged_payload(100) for _ in range(100)]
    model.produce(payloads)
    leases = [model.lease(10) for _ in range(8)]
    head = client.get_item(TableName="v3-test", Key=model.key(model.HEAD), ConsistentRead=True)["Item"]
    assert len(head["ls"]["M"]) < 4  # the rest were moved to record rows
    spilled = client.query(
        TableName="v3-test",
        KeyConditionExpression="pk = :pk AND begins_with(sk, :l)",
        ExpressionAttributeValues={":pk": {"S": "bench~0"}, ":l": {"S": "L"}},
    )["Items"]
    assert len(spilled) + len(head["ls"]["M"]) == 8
    for lease in leases[:4]:  # the oldest: spilled, completed through their rows
        assert lease is not None
        model.complete(lease)
    clock.advance(LEASE_US + 1)  # the other four run out, wherever their records are
    delivered = drain(model, consumers=1, batch=10, limit=20)
    done = [i for lease in leases[:4] if lease is not None for i in lease.identities]
    assert delivered + Counter(done) == Counter(identity(p) for p in payloads)
