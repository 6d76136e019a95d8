"""The capacity model's arithmetic, and docs/capacity.md's numbers re-derived from the inputs it prints."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks import capacity
from benchmarks.capacity import Inputs
from querator.domain.model import MAX_PARTITIONS

DOC = Path(__file__).resolve().parents[2] / "docs" / "capacity.md"

#: The floor of the product's data model for items under 1 KB (DESIGN.md point 5): produce, lease
#: and complete each write the item once; batch 10 reads the catalog 0.3 times per item.
SMALL = Inputs("100B x10", wcu_per_item=3.0, rcu_per_item=0.05, catalog_rcu_per_item=0.3)


def test_a_partition_carries_its_write_limit_divided_by_the_units_per_item() -> None:
    assert capacity.per_partition(SMALL) == pytest.approx(1000 / 3)
    # Reads bind only when they are heavier than writes against their 3x larger limit.
    read_bound = Inputs("reads", wcu_per_item=1.0, rcu_per_item=6.0, catalog_rcu_per_item=0.0)
    assert capacity.per_partition(read_bound) == pytest.approx(500)


def test_a_partition_over_two_keys_carries_what_its_hottest_key_takes() -> None:
    # Engine v3 at 100 B x 10: 0.50 write units an item in all, 0.30 on the log head's key (its
    # take, claim and complete), the rest on the rows' key.
    split = Inputs(
        "100B x10", wcu_per_item=0.5, rcu_per_item=0.36, catalog_rcu_per_item=0.01, hottest_wcu_per_item=0.3
    )
    assert capacity.per_partition(split) == pytest.approx(1000 / 0.3)
    # A table's quota counts every key's units.
    assert capacity.per_table(split) == pytest.approx(40_000 / 0.5)


def test_a_table_carries_its_default_quota_divided_by_the_units_per_item() -> None:
    assert capacity.per_table(SMALL) == pytest.approx(40_000 / 3)


def test_one_queue_is_bound_by_reads_of_its_one_catalog_record() -> None:
    assert capacity.per_queue(SMALL) == pytest.approx(10_000)
    batch_one = Inputs("100B x1", wcu_per_item=3.0, rcu_per_item=0.5, catalog_rcu_per_item=3.0)
    assert capacity.per_queue(batch_one) == pytest.approx(1_000)
    assert math.isinf(capacity.per_queue(Inputs("none", 3.0, 0.1, 0.0)))


def test_partitions_queues_and_tables_for_the_two_targets() -> None:
    ten = capacity.plan(10_000, SMALL)
    assert (ten.partitions, ten.queues, ten.tables_at_default_quota) == (30, 1, 1)
    assert ten.table_wcu_needed == 30_000
    hundred = capacity.plan(100_000, SMALL)
    # 300 partitions need two queues under the 256 cap, but the catalog bound asks for ten.
    assert hundred.partitions == 300
    assert math.ceil(300 / MAX_PARTITIONS) == 2
    assert hundred.queues == 10
    assert hundred.tables_at_default_quota == 8  # 300,000 WCU/s over 40,000 per table
    assert hundred.table_wcu_needed == 300_000


def test_the_model_uses_the_products_partition_cap() -> None:
    assert capacity.MAX_PARTITIONS == MAX_PARTITIONS


def test_a_rendered_block_parses_back_to_its_inputs() -> None:
    cases = capacity.as_printed([SMALL, Inputs("1024B x10", 6.004, 0.233, 0.3)])
    block = capacity.render(cases)
    assert capacity.parse_inputs(block) == cases


def test_the_docs_numbers_follow_from_the_model() -> None:
    document = DOC.read_text()
    block = capacity.generated_block(document)
    inputs = capacity.parse_inputs(block)
    assert inputs, "docs/capacity.md has no measured inputs: run `uv run python -m benchmarks`"
    assert block == capacity.render(inputs)


def test_the_docs_worked_example_matches_the_model() -> None:
    document = DOC.read_text()
    plan = capacity.plan(10_000, SMALL)
    assert f"= {plan.partitions}\npartitions" in document or f"= {plan.partitions} partitions" in document
    assert f"{capacity.per_partition(SMALL):.0f} items/s per partition" in document


def test_update_document_replaces_only_the_generated_block() -> None:
    document = f"intro\n{capacity.START}\nold\n{capacity.END}\noutro\n"
    updated = capacity.update_document(document, [SMALL])
    assert updated.startswith("intro\n") and updated.endswith("outro\n")
    assert capacity.generated_block(updated) == capacity.render([SMALL])
