"""The managed policies for producers, consumers and admins: each invokes exactly its routes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from infra.permissions import Caller, caller_routes, iam_path
from querator.api.routes import ROUTES

if TYPE_CHECKING:
    from tests.infra.synth import Synth

pytestmark = pytest.mark.infra


def _paths(synth: Synth, caller: Caller) -> set[str]:
    """``METHOD /path`` of every resource in the caller's policy (the tail of each ARN)."""
    policy = synth.resources[synth.logical_id(synth.stack.callers.policies[caller])]
    (statement,) = policy["Properties"]["PolicyDocument"]["Statement"]
    stream_api = {"Ref": synth.logical_id(synth.stack.stream.api)}
    stream = [r for r in statement["Resource"] if r["Fn::Join"][1][-2] == stream_api]
    # Consumers may also open the stream: $connect of the WebSocket API, this stage, nothing else.
    assert [r["Fn::Join"][1][-1] for r in stream] == (
        [f"/{synth.stack.config.stage}/$connect"] if caller is Caller.CONSUMER else []
    )
    statement = {**statement, "Resource": [r for r in statement["Resource"] if r not in stream]}
    assert statement["Effect"] == "Allow"
    assert statement["Action"] == "execute-api:Invoke"
    paths = set()
    for resource in statement["Resource"]:
        parts: list[Any] = resource["Fn::Join"][1]
        # ..., {"Ref": <the RestApi>}, "/<stage>/<METHOD>/<path>"
        assert parts[-2] == {"Ref": synth.logical_id(synth.stack.api.api)}
        stage, method, path = parts[-1].split("/", 3)[1:]
        assert stage == synth.stack.config.stage
        paths.add(f"{method} /{path}")
    return paths


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


@pytest.mark.parametrize("caller", list(Caller))
def test_the_stack_outputs_each_policy_arn(synth: Synth, caller: Caller) -> None:
    output = synth.outputs[f"{caller.value.capitalize()}PolicyArn"]
    assert output["Value"] == {"Ref": synth.logical_id(synth.stack.callers.policies[caller])}
