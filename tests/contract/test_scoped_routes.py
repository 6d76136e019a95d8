"""Scoped routes (``POST /v1/queues/{queue}/<route>``) through the Lambda handlers, on every store.

The events are what API Gateway sends for a resource with a ``{queue}`` path parameter: the path as
asked, the resource template, and ``pathParameters.queue`` decoded. The queue of the call is the
path's; a body naming another queue is refused (400) before anything is done.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import pytest

from querator.api import routes
from querator.api.gateway import FunctionApp, build_app
from querator.config import settings_from
from querator.domain.errors import InvalidRequestError
from querator.service import QueueService
from querator.service.tickets import TicketSigner

if TYPE_CHECKING:
    from querator.testing import FakeClock


#: What the functions read of their settings here (the lease wait cap); the service is given.
SETTINGS = settings_from({"QUERATOR_ITEMS_TABLE": "items", "QUERATOR_CATALOG_TABLE": "catalog"})


class Handlers:
    """The REST functions over one service, called with API Gateway's events."""

    def __init__(self, service: QueueService) -> None:
        functions = {route.function for route in routes.ROUTES}
        self._apps: dict[str, FunctionApp] = {
            function: build_app(function, service=lambda: service, settings=lambda: SETTINGS)
            for function in functions
        }

    def call(
        self, name: str, body: dict[str, Any], *, queue: str | None = None, segment: str | None = None
    ) -> tuple[int, dict[str, Any]]:
        """``name`` on its plain path, or on its scoped path for ``queue`` (``segment``: the path's
        text when it is not the name as is)."""
        if queue is None:
            route, path, parameters = routes.resolve("POST", f"/v1/{name}"), f"/v1/{name}", None
        else:
            twin = routes.scoped(name)
            assert twin is not None, name
            route, path = twin, f"/v1/queues/{segment or queue}/{name}"
            parameters = {"queue": queue}
        event = {
            "resource": route.path,
            "path": path,
            "httpMethod": "POST",
            "headers": {"Content-Type": "application/json"},
            "pathParameters": parameters,
            "body": json.dumps(body),
            "isBase64Encoded": False,
            "requestContext": {"requestId": uuid.uuid4().hex, "resourcePath": route.path},
        }
        reply = self._apps[route.function].resolve(event, None)
        return reply["statusCode"], json.loads(reply["body"])

    def ok(self, name: str, body: dict[str, Any], **where: Any) -> dict[str, Any]:
        status, reply = self.call(name, body, **where)
        assert status == 200, (name, reply)
        return reply


@pytest.fixture
def api(service: QueueService) -> Handlers:
    return Handlers(service)


def _items(api: Handlers, queue: str) -> int:
    stats = api.ok("queue.stats", {}, queue=queue)
    return sum(p["total"] for q in stats["logicalQueues"] for p in q["partitions"])


def test_a_queue_is_run_through_its_scoped_paths_alone(api: Handlers) -> None:
    # No body names the queue: the path does, for every single-queue route.
    api.ok("queues.create", {"lease_timeout": "1m", "expire_timeout": "1h"}, queue="orders")
    assert api.ok("queues.info", {}, queue="orders")["queue_name"] == "orders"
    api.ok("queues.update", {"max_attempts": 3}, queue="orders")
    assert api.ok("queues.info", {}, queue="orders")["max_attempts"] == 3
    api.ok(
        "queue.produce",
        {"items": [{"utf8": "a", "reference": "a"}, {"utf8": "b", "reference": "b"}]},
        queue="orders",
    )
    leased = api.ok("queue.lease", {"batch_size": 1, "client_id": "w1"}, queue="orders")
    assert leased["queue_name"] == "orders" and len(leased["items"]) == 1
    ids, partition = [leased["items"][0]["id"]], leased["partition"]
    api.ok("queue.renew", {"partition": partition, "ids": ids, "lease_timeout": "1m"}, queue="orders")
    api.ok("queue.complete", {"partition": partition, "ids": ids}, queue="orders")
    assert _items(api, "orders") == 1
    listed = api.ok("storage/items.list", {"partition": partition}, queue="orders")
    assert [item["reference"] for item in listed["items"]] == ["b"]
    api.ok("queue.clear", {"queue": True}, queue="orders")
    assert _items(api, "orders") == 0
    # The same call with the path's queue also in the body is the same call.
    api.ok("queue.produce", {"queue_name": "orders", "items": [{"utf8": "c"}]}, queue="orders")
    api.ok("queue.produce", {"queueName": "orders", "items": [{"utf8": "d"}]}, queue="orders")
    assert _items(api, "orders") == 2
    api.ok("queues.delete", {}, queue="orders")
    status, _ = api.call("queues.info", {}, queue="orders")
    assert status == 400


@pytest.mark.parametrize("key", ["queue_name", "queueName"])
def test_a_body_naming_another_queue_is_refused_and_nothing_changes(api: Handlers, key: str) -> None:
    for name in ("orders", "emails"):
        api.ok("queues.create", {"queue_name": name, "lease_timeout": "1m", "expire_timeout": "1h"})
    api.ok("queue.produce", {"queue_name": "emails", "items": [{"utf8": "e"}]})
    refused = [
        ("queue.produce", {key: "emails", "items": [{"utf8": "x"}]}),
        ("queue.lease", {key: "emails", "batch_size": 1, "client_id": "w1"}),
        ("queue.clear", {key: "emails", "queue": True}),
        ("queues.delete", {key: "emails"}),
        ("queues.update", {key: "emails", "max_attempts": 9}),
        ("queues.create", {key: "other", "lease_timeout": "1m", "expire_timeout": "1h"}),
    ]
    for name, body in refused:
        status, reply = api.call(name, body, queue="orders")
        assert status == 400, (name, reply)
        assert "the body names queue" in reply["message"] and "'orders'" in reply["message"], reply
    # Nothing was done on either queue, and no queue was made.
    assert _items(api, "emails") == 1 and _items(api, "orders") == 0
    assert api.ok("queues.info", {"queue_name": "emails"})["max_attempts"] != 9
    assert [q["queue_name"] for q in api.ok("queues.list", {})["items"]] == ["emails", "orders"]


@pytest.mark.parametrize("name", ["a*b", "a?b", "orders/x", "..", ".", "caf\u00e9", "a%41", "{queue}"])
def test_a_queue_name_that_is_not_addressable_is_refused_in_a_path(api: Handlers, name: str) -> None:
    # Such a name cannot be granted precisely in IAM (wildcards) or would mean another path: the
    # scoped route refuses it; the plain route still serves the queue (a whole-API grant).
    body = {"lease_timeout": "1m", "expire_timeout": "1h"}
    status, reply = api.call("queues.create", body, queue=name, segment=quote(name, safe=""))
    assert status == 400 and "scoped route" in reply["message"], reply
    assert api.ok("queues.list", {})["items"] == []


def test_without_path_parameters_the_segment_is_decoded_once(api: Handlers, service: QueueService) -> None:
    # A hand-made event (no pathParameters): the path's segment is decoded once, then checked.
    body = {"lease_timeout": "1m", "expire_timeout": "1h"}
    event = {
        "path": "/v1/queues/or%64ers/queues.create",
        "httpMethod": "POST",
        "headers": {"Content-Type": "application/json"},
        "body": json.dumps(body),
    }
    app = build_app(routes.Function.QUEUES, service=lambda: service, settings=lambda: SETTINGS)
    assert app.resolve(event, None)["statusCode"] == 200
    assert api.ok("queues.info", {}, queue="orders")["queue_name"] == "orders"
    event["path"] = "/v1/queues/a%252Ab/queues.create"  # "a%2Ab" once decoded: not addressable
    assert app.resolve(event, None)["statusCode"] == 400


QUEUE = {"lease_timeout": "1m", "expire_timeout": "1h"}


def test_on_a_scoped_path_a_dead_letter_queue_is_in_the_queues_namespace(api: Handlers) -> None:
    api.ok("queues.create", {"queue_name": "emails", **QUEUE})
    api.ok("queues.create", {"queue_name": "orders-dead", **QUEUE})
    # A caller granted "orders" alone cannot make orders' items land in "emails".
    status, reply = api.call("queues.create", {**QUEUE, "dead_queue": "emails"}, queue="orders")
    assert status == 400 and "namespace of 'orders'" in reply["message"], reply
    assert [q["queue_name"] for q in api.ok("queues.list", {})["items"]] == ["emails", "orders-dead"]
    api.ok("queues.create", {**QUEUE, "dead_queue": "orders-dead"}, queue="orders")
    status, _ = api.call("queues.update", {"dead_queue": "emails"}, queue="orders")
    assert status == 400
    assert api.ok("queues.info", {}, queue="orders")["dead_queue"] == "orders-dead"
    # The plain route (a whole-API grant) names any queue.
    api.ok("queues.update", {"queue_name": "orders", "dead_queue": "emails"})
    assert api.ok("queues.info", {}, queue="orders")["dead_queue"] == "emails"


def test_a_scoped_redrive_moves_items_only_back_to_the_queues_that_dead_letter_there(
    api: Handlers,
) -> None:
    api.ok("queues.create", {"queue_name": "orders-dead", **QUEUE})
    api.ok("queues.create", {"queue_name": "orders", "dead_queue": "orders-dead", **QUEUE})
    api.ok("queues.create", {"queue_name": "emails", **QUEUE})
    api.ok("queue.produce", {"items": [{"utf8": "failed"}]}, queue="orders")
    leased = api.ok("queue.lease", {"batch_size": 1, "client_id": "w"}, queue="orders")
    item = {"id": leased["items"][0]["id"], "dead": True}
    api.ok("queue.retry", {"partition": leased["partition"], "items": [item]}, queue="orders")
    # Produced straight into the dead-letter queue: not known to come from "orders".
    api.ok("queue.produce", {"items": [{"utf8": "planted"}]}, queue="orders-dead")
    assert (_items(api, "orders"), _items(api, "orders-dead")) == (0, 2)

    status, reply = api.call("queue.redrive", {"to": "emails"}, queue="orders-dead")
    assert status == 400 and "does not name 'orders-dead'" in reply["message"], reply
    assert (_items(api, "emails"), _items(api, "orders-dead")) == (0, 2)

    moved = api.ok("queue.redrive", {}, queue="orders-dead")
    assert (moved["moved"], moved["stranded"]) == (1, 1), moved
    assert (_items(api, "orders"), _items(api, "orders-dead")) == (1, 1)
    # The plain route (a whole-API grant) moves the rest where it is told.
    api.ok("queue.redrive", {"queue_name": "orders-dead", "to": "emails"})
    assert (_items(api, "emails"), _items(api, "orders-dead")) == (1, 0)


def test_a_stream_ticket_names_its_queue_and_is_checked_on_every_store(
    api: Handlers, service: QueueService, clock: FakeClock
) -> None:
    api.ok("queues.create", {"queue_name": "orders", **QUEUE})
    api.ok("queues.create", {"queue_name": "emails", **QUEUE})
    issued = api.ok("stream.ticket", {}, queue="orders")
    ticket = issued["ticket"]
    service.check_stream_ticket(ticket, "orders")
    with pytest.raises(InvalidRequestError, match="for queue 'orders', not 'emails'"):
        service.check_stream_ticket(ticket, "emails")
    forged = ticket.rsplit(".", 1)[0] + ".AAAA"
    with pytest.raises(InvalidRequestError, match="not one this service issued"):
        service.check_stream_ticket(forged, "orders")
    # Another service over the same store signs with the same key (made once, kept in the catalog).
    again = QueueService(catalog=service.catalog, store=service.store, clock=clock)
    again.check_stream_ticket(ticket, "orders")
    clock.advance(timedelta(minutes=6))
    with pytest.raises(InvalidRequestError, match="expired"):
        service.check_stream_ticket(ticket, "orders")
    status, reply = api.call("stream.ticket", {}, queue="nope")
    assert status == 400 and "does not exist" in reply["message"], reply


def test_a_ticket_checked_before_any_was_issued_is_refused_without_making_a_key(
    service: QueueService, clock: FakeClock
) -> None:
    # The stream function checks tickets and may not write the catalog: a check must only read.
    forged = "9999999999.b3JkZXJz.AAAA"
    with pytest.raises(InvalidRequestError, match="not one this service issued"):
        service.check_stream_ticket(forged, "orders")
    assert service.catalog.stream_key(None) is None
    # The first ticket issued makes the key; checks from then on use it.
    issued = TicketSigner(service.catalog).issue("orders", clock.now())
    service.check_stream_ticket(issued.ticket, "orders")
    assert service.catalog.stream_key(None) is not None
