"""Grants of producers, consumers and admins: the whole-API managed policies, the scoped examples the
stack outputs and ``infra.permissions.invoke_paths``: each invokes exactly its routes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from infra.permissions import Caller, QueueGrantError, caller_routes, iam_path, invoke_paths
from infra.stack import EXAMPLE_POLICIES
from querator.api.routes import ROUTES

if TYPE_CHECKING:
    from tests.infra.synth import Synth

pytestmark = pytest.mark.infra


def _paths(synth: Synth, caller: Caller) -> set[str]:
    """``METHOD /path`` of every resource in the caller's whole-API policy (the tail of each ARN)."""
    return set(_tails(synth, synth.stack.callers.policies[caller], caller))


def _tails(synth: Synth, policy: Any, caller: Caller) -> list[str]:
    """``METHOD /path`` of every REST API resource in a managed policy, in order, after checking its
    one statement and that a consumer's, and only a consumer's, also opens the stream."""
    document = synth.resources[synth.logical_id(policy)]["Properties"]["PolicyDocument"]
    (statement,) = document["Statement"]
    stream_api = {"Ref": synth.logical_id(synth.stack.stream.api)}
    stream = [r for r in statement["Resource"] if r["Fn::Join"][1][-2] == stream_api]
    # Consumers may also open the stream: $connect of the WebSocket API, this stage, nothing else.
    assert [r["Fn::Join"][1][-1] for r in stream] == (
        [f"/{synth.stack.config.stage}/$connect"] if caller is Caller.CONSUMER else []
    )
    assert statement["Effect"] == "Allow"
    assert statement["Action"] == "execute-api:Invoke"
    tails = []
    for resource in (r for r in statement["Resource"] if r not in stream):
        parts: list[Any] = resource["Fn::Join"][1]
        # ..., {"Ref": <the RestApi>}, "/<stage>/<METHOD>/<path>"
        assert parts[-2] == {"Ref": synth.logical_id(synth.stack.api.api)}
        stage, method, path = parts[-1].split("/", 3)[1:]
        assert stage == synth.stack.config.stage
        tails.append(f"{method} /{path}")
    return tails


META = {"GET /health", "GET /openapi.json", "GET /docs"}


def _with_twins(plain: set[str]) -> set[str]:
    """The whole-API grant of each route on both paths: the scoped twin's for every queue (``*``)."""
    return plain | {
        p.replace("/v1/", "/v1/queues/*/", 1)
        for p in plain
        if p.startswith("POST /v1/") and p != "POST /v1/queues.list"
    }


EXPECTED = {
    Caller.PRODUCER: {*_with_twins({"POST /v1/queue.produce", "POST /v1/queues.info"}), *META},
    Caller.CONSUMER: {*_with_twins({"POST /v1/queue.lease", "POST /v1/queue.complete", "POST /v1/queue.retry",
                                    "POST /v1/queue.renew", "POST /v1/queues.info",
                                    "POST /v1/stream.ticket"}), *META},
    Caller.ADMIN: {f"{r.method} {r.path.replace('{queue}', '*')}" for r in ROUTES
                   if r.function in {"queues", "admin"}} | META,
}  # fmt: skip


@pytest.mark.parametrize("caller", list(Caller))
def test_each_caller_policy_invokes_exactly_its_routes(synth: Synth, caller: Caller) -> None:
    assert _paths(synth, caller) == EXPECTED[caller]
    assert {f"{r.method} {iam_path(r)}" for r in caller_routes(caller)} == EXPECTED[caller]
    # The one wildcard of a whole-API policy is a scoped route's queue segment: every queue.
    assert not [p for p in _paths(synth, caller) if "*" in p.replace("/v1/queues/*/", "/v1/queues/q/")]


def test_producers_and_consumers_may_read_a_queues_settings_which_their_clients_need(synth: Synth) -> None:
    # querator.client's worker reads the lease timeout, the Spark HTTP producer the partition count.
    assert "POST /v1/queues.info" in _paths(synth, Caller.PRODUCER) & _paths(synth, Caller.CONSUMER)


def test_a_producer_can_neither_clear_nor_delete_queues_and_only_admins_can(synth: Synth) -> None:
    assert not {"POST /v1/queue.clear", "POST /v1/queues.delete"} & _paths(synth, Caller.PRODUCER)
    assert not {"POST /v1/queue.clear", "POST /v1/queues.delete"} & _paths(synth, Caller.CONSUMER)
    assert {"POST /v1/queue.clear", "POST /v1/queues.delete"} <= _paths(synth, Caller.ADMIN)


def test_every_route_belongs_to_some_caller(synth: Synth) -> None:
    covered = set().union(*(_paths(synth, c) for c in Caller))
    assert covered == {f"{r.method} {iam_path(r)}" for r in ROUTES}


def test_the_stacks_scoped_examples_grant_orders_prefix_produce_and_emails_consume(synth: Synth) -> None:
    produce, consume = (synth.stack.node.find_child(name) for name in EXAMPLE_POLICIES)
    # (sorted: cdk.json's @aws-cdk/aws-iam:minimizePolicies sorts a statement's resources)
    assert sorted(_tails(synth, produce, Caller.PRODUCER)) == sorted([
        *META_IN_ORDER, "POST /v1/queues/orders-*/queues.info", "POST /v1/queues/orders-*/queue.produce",
    ])  # fmt: skip
    assert sorted(_tails(synth, consume, Caller.CONSUMER)) == sorted([
        *META_IN_ORDER, "POST /v1/queues/emails/queues.info", "POST /v1/queues/emails/queue.lease",
        "POST /v1/queues/emails/queue.complete", "POST /v1/queues/emails/queue.retry",
        "POST /v1/queues/emails/queue.renew", "POST /v1/queues/emails/stream.ticket",
    ])  # fmt: skip
    for name in EXAMPLE_POLICIES:
        assert synth.outputs[f"{name}PolicyArn"]["Value"] == {
            "Ref": synth.logical_id(synth.stack.node.find_child(name))
        }


META_IN_ORDER = ["GET /health", "GET /openapi.json", "GET /docs"]


@pytest.mark.parametrize("caller", list(Caller))
def test_a_scoped_grant_names_its_queues_in_every_path_but_the_meta_routes(caller: Caller) -> None:
    scoped = invoke_paths(caller, ["orders-*", "emails"])
    whole = {f"{m} {p}" for m, p in invoke_paths(caller)}
    assert [f"{m} {p}" for m, p in scoped[:3]] == META_IN_ORDER
    queued = [p for _, p in scoped[3:]]
    assert queued and all(p.startswith(("/v1/queues/orders-*/", "/v1/queues/emails/")) for p in queued)
    # The same routes as the whole-API grant's twins, once per name or prefix ...
    twins = {p for p in whole if "/v1/queues/*/" in p}
    for pattern in ("orders-*", "emails"):
        assert {f"POST {p}" for p in queued if p.startswith(f"/v1/queues/{pattern}/")} == {
            t.replace("/v1/queues/*/", f"/v1/queues/{pattern}/") for t in twins
        }
    # ... and never a plain route, whose body names the queue: listing queues needs the whole API.
    assert "POST /v1/queues.list" not in {f"{m} {p}" for m, p in scoped}
    assert ("POST /v1/queues.list" in whole) == (caller is Caller.ADMIN)


@pytest.mark.parametrize(
    "queues", [["orders*x"], ["*"], ["ord?rs"], ["orders/eu"], ["orders**"], [], "orders"]
)
def test_a_grant_refuses_anything_but_queue_names_and_prefixes(queues: Any) -> None:
    with pytest.raises(QueueGrantError):
        invoke_paths(Caller.PRODUCER, queues)


@pytest.mark.parametrize("caller", list(Caller))
def test_the_stack_outputs_each_policy_arn(synth: Synth, caller: Caller) -> None:
    output = synth.outputs[f"{caller.value.capitalize()}PolicyArn"]
    assert output["Value"] == {"Ref": synth.logical_id(synth.stack.callers.policies[caller])}
