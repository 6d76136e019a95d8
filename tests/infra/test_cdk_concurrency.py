"""Reserved and provisioned concurrency are stage settings; provisioned functions are served by an alias."""

from __future__ import annotations

from typing import Any

import pytest
from aws_cdk import App, Stack
from aws_cdk.assertions import Template

from infra.config import StageConfig
from infra.constructs.api import QueueApi
from infra.constructs.core_layer import CoreLayer
from infra.constructs.functions import QueueFunctions
from infra.constructs.payloads import PayloadBucket
from infra.constructs.reaper import Reaper
from infra.constructs.table import QueueTables
from querator.api.routes import for_function
from tests.infra.synth import fake_assets

pytestmark = pytest.mark.infra


@pytest.fixture(scope="module")
def prod_like(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Stack, QueueFunctions, Reaper, dict[str, Any]]:
    assets = fake_assets(tmp_path_factory.mktemp("concurrency"))
    config = StageConfig.from_mapping(
        {
            "stage": "prod",
            "alarmEmail": "alarms@example.com",
            **assets,
            "reservedConcurrency": {"reaper": 1, "produce": 50, "lease": 200},
            "provisionedConcurrency": {"lease": 2},
        }
    )
    stack = Stack(App(), "Concurrency")
    tables = QueueTables(stack, "Tables", config=config)
    payloads = PayloadBucket(stack, "Payloads", config=config)
    layer = CoreLayer(stack, "Layer", config=config)
    functions = QueueFunctions(
        stack, "Functions", config=config, layer=layer, tables=tables, payloads=payloads
    )
    reaper = Reaper(stack, "Reaper", config=config, layer=layer, tables=tables, payloads=payloads)
    QueueApi(stack, "Api", config=config, functions=functions.by_name)
    return stack, functions, reaper, Template.from_stack(stack).to_json()["Resources"]


def _props(stack: Stack, construct: Any, resources: dict[str, Any]) -> dict[str, Any]:
    props: dict[str, Any] = resources[stack.get_logical_id(construct.node.default_child)]["Properties"]
    return props


def test_reserved_concurrency_applies_to_the_named_functions_only(prod_like: Any) -> None:
    stack, functions, reaper, resources = prod_like
    assert _props(stack, reaper.function.function, resources)["ReservedConcurrentExecutions"] == 1
    assert (
        _props(stack, functions.by_name["produce"].function, resources)["ReservedConcurrentExecutions"] == 50
    )
    assert "ReservedConcurrentExecutions" not in _props(stack, functions.by_name["items"].function, resources)


def test_waiting_leases_can_be_capped_per_stage_so_they_cannot_starve_produce_and_complete(
    prod_like: Any,
) -> None:
    stack, functions, _, resources = prod_like
    assert (
        _props(stack, functions.by_name["lease"].function, resources)["ReservedConcurrentExecutions"] == 200
    )


def test_a_provisioned_function_is_served_by_its_live_alias(prod_like: Any) -> None:
    stack, functions, _, resources = prod_like
    lease = functions.by_name["lease"]
    alias = _props(stack, lease.target, resources)
    assert alias["Name"] == "live"
    assert alias["ProvisionedConcurrencyConfig"] == {"ProvisionedConcurrentExecutions": 2}
    alias_id = stack.get_logical_id(lease.target.node.default_child)
    lease_methods = [
        r["Properties"]["Integration"]["Uri"]
        for r in resources.values()
        if r["Type"] == "AWS::ApiGateway::Method" and f'"Ref": "{alias_id}"' in str(r).replace("'", '"')
    ]
    # every route of the lease function (queue.lease, stream.ticket), plain and scoped
    assert len(lease_methods) == len(for_function("lease"))
    assert not [r for r in resources.values() if r["Type"] == "AWS::Lambda::Alias"][1:]


def test_unprovisioned_functions_have_no_alias(prod_like: Any) -> None:
    _, functions, _, _ = prod_like
    for name, fn in functions.by_name.items():
        assert (fn.target is fn.function) == (name != "lease")
