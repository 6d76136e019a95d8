"""The REST-against-HTTP cost model, and the tables of docs/capacity.md and ADR 0094 re-derived."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING
from unittest import mock

import pytest

from benchmarks import flavour
from benchmarks.flavour import Inputs
from infra.config import StageConfig
from infra.timeouts import limits
from querator import bootstrap
from querator.api.routes import Function

if TYPE_CHECKING:
    from collections.abc import Iterator

#: Engine v2's batch 10 as benchmarks.idle priced it on 2026-11-25 (docs/capacity.md keeps it beside
#: v3's): Lambda $0.21, 3.40 write units. The model's arithmetic, not today's figures.
BATCH_10 = Inputs(batch=10, lambda_per_million=0.21, write_units=3.40, read_units=0.38)


def test_a_million_items_at_batch_10_cost_what_docs_capacity_said_on_rest() -> None:
    rest = flavour.cost(BATCH_10, flavour.PRICE_REST_CALL)
    assert rest.calls == pytest.approx(300_000)
    assert rest.api == pytest.approx(1.05)
    assert rest.dynamodb == pytest.approx(2.17, abs=0.01)
    assert rest.total == pytest.approx(3.43, abs=0.01)


@pytest.mark.parametrize("batch", flavour.BATCHES)
def test_the_http_api_saves_exactly_its_call_price_difference_on_three_calls_per_batch(batch: int) -> None:
    inputs = Inputs(batch, lambda_per_million=1.0, write_units=3.0, read_units=0.5)
    rest = flavour.cost(inputs, flavour.PRICE_REST_CALL)
    http = flavour.cost(inputs, flavour.PRICE_HTTP_CALL)
    # Lambda and DynamoDB are the same functions and requests behind either flavour.
    assert (http.lambda_, http.dynamodb) == (rest.lambda_, rest.dynamodb)
    assert rest.total - http.total == pytest.approx(3 / batch * 2.50)


def test_the_priced_memory_is_the_deployed_functions() -> None:
    deployed = limits(StageConfig(stage="dev"))
    functions = {"produce": Function.PRODUCE, "lease": Function.LEASE, "complete": Function.ITEMS}
    priced = flavour.MEMORY_MB
    assert priced == {phase: deployed[function].memory_mb for phase, function in functions.items()}


def test_a_rendered_block_parses_back_to_its_inputs() -> None:
    rows = [Inputs(1, 1.31, 7.64, 6.88), BATCH_10, Inputs(100, 0.14, 3.08, 0.11)]
    assert flavour.parse_inputs(flavour.render(rows)) == rows


@pytest.mark.parametrize("doc", flavour.DOCUMENTS, ids=lambda p: p.name)
def test_the_docs_cost_tables_follow_from_the_inputs_they_print(doc) -> None:
    block = flavour.generated_block(doc.read_text(encoding="utf-8"))
    inputs = flavour.parse_inputs(block)
    assert [row.batch for row in inputs] == list(flavour.BATCHES)
    assert block == flavour.render(inputs)


def test_capacity_md_and_the_adr_print_the_same_measurement() -> None:
    first, second = (flavour.generated_block(doc.read_text(encoding="utf-8")) for doc in flavour.DOCUMENTS)
    assert first == second


def test_update_document_replaces_only_the_generated_block() -> None:
    document = f"head\n{flavour.START}\nold\n{flavour.END}\ntail\n"
    updated = flavour.update_document(document, [BATCH_10])
    assert updated.startswith("head\n") and updated.endswith("\ntail\n")
    assert flavour.generated_block(updated) == flavour.render([BATCH_10])


@pytest.fixture
def environment_restored() -> Iterator[None]:
    """The measurement points the functions' environment at its moto server (``benchmarks.idle``);
    later tests in this process must not inherit that endpoint, or their in-process moto clients
    would call a server that is gone."""
    with mock.patch.dict(os.environ):
        yield
    bootstrap.reset()


@pytest.mark.slow
@pytest.mark.usefixtures("environment_restored")
def test_a_short_measurement_runs_and_prices_every_batch() -> None:
    rows = flavour.measure(rounds=1, count=100)
    assert [row.batch for row in rows] == list(flavour.BATCHES)
    # Batching cuts both the Lambda time and the per-call writes of an item; on engine v3 a batch's
    # items share packed rows and one claim, so a large batch costs well under a write per item but
    # never nothing.
    assert rows[0].lambda_per_million > rows[-1].lambda_per_million > 0
    assert rows[0].write_units > rows[-1].write_units > 0
