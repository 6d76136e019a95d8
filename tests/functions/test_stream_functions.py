"""The stream on a deployed stack: recorded WebSocket events into the stream function, DynamoDB Streams
records (read back from moto's stream of the items table) into the dispatcher, pushes through moto's
``apigatewaymanagementapi``. Waits for leases to run out poll with a deadline."""

from __future__ import annotations

import base64
import copy
import importlib
import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from moto import mock_aws
from moto.apigatewaymanagementapi.models import apigatewaymanagementapi_backends
from moto.core import DEFAULT_ACCOUNT_ID

from querator import bootstrap
from querator.client.stream import _Assembler
from querator.config import EnvVar, load_settings
from querator.domain.model import MAX_PAYLOAD_BYTES, NewItem, QueueInfo
from querator.localserver import LocalContext
from querator.storage.dynamodb.connections import DynamoDBConnections, connections_table_definition
from querator.stream import aws as stream_aws
from querator.stream import protocol
from querator.stream.dispatch import MAX_FRAME_BYTES, Dispatcher, lease_frames
from querator.testing import FakeClock, build_service, dynamodb_client
from tests.functions.conftest import EVENTS, payload_objects, scheduled_event

if TYPE_CHECKING:
    from tests.functions.conftest import Api

REGION = "us-east-1"
ENDPOINT = "https://a1b2c3d4e5.execute-api.us-east-1.amazonaws.com/prod"
DEADLINE = 10.0


def handler(name: str) -> Any:
    return importlib.import_module(f"functions.{name}.handler").lambda_handler


def ws_event(connection_id: str, route: str = "$default", body: Any = None) -> dict[str, Any]:
    """The recorded WebSocket API event, re-aimed at a connection and route."""
    event: dict[str, Any] = copy.deepcopy(json.loads((EVENTS / "apigw_websocket_message.json").read_text()))
    event["requestContext"]["connectionId"] = connection_id
    event["requestContext"]["routeKey"] = route
    event["requestContext"]["eventType"] = {"$connect": "CONNECT", "$disconnect": "DISCONNECT"}.get(
        route, "MESSAGE"
    )
    if body is None:
        event.pop("body", None)
    else:
        event["body"] = body if isinstance(body, str) else json.dumps(body)
    return event


class Streams:
    """The stack's stream half over moto: connections, messages, frames received, stream records."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.dynamodb = boto3.client("dynamodb", region_name=REGION)
        self.streams = boto3.client("dynamodbstreams", region_name=REGION)
        self.backend = apigatewaymanagementapi_backends[DEFAULT_ACCOUNT_ID][REGION]
        self._read: dict[str, int] = {}
        self._seen: set[tuple[str, str]] = set()
        self.records()  # what is stored now was "written" before the test's stream position

    def connect(self, **subscribe: Any) -> str:
        connection_id = uuid.uuid4().hex[:16]
        self.backend.connections[connection_id]  # API Gateway holds it open from now on
        assert handler("stream")(ws_event(connection_id, "$connect"), context())["statusCode"] == 200
        if subscribe:
            self.send(connection_id, {"type": "subscribe", **subscribe})
        return connection_id

    def send(self, connection_id: str, message: Any) -> None:
        reply = handler("stream")(ws_event(connection_id, body=message), context())
        assert reply["statusCode"] == 200

    def frames(self, connection_id: str) -> list[dict[str, Any]]:
        """Frames posted to the connection since the last call (moto keeps one byte string)."""
        data = self.backend.connections[connection_id].data.decode()
        start = self._read.get(connection_id, 0)
        decoder, found = json.JSONDecoder(), []
        position = start
        while position < len(data):
            frame, position = decoder.raw_decode(data, position)
            found.append(frame)
        self._read[connection_id] = position
        return found

    def leased(self, connection_id: str) -> list[dict[str, Any]]:
        assembler = _Assembler()
        items = []
        for frame in self.frames(connection_id):
            for lease in assembler.feed(frame) if frame["type"] in ("lease", "part") else []:
                items += [
                    {"id": item.id, "payload": item.payload, "partition": lease.partition}
                    for item in lease.items
                ]
        return items

    def records(self) -> list[dict[str, Any]]:
        """INSERT records, in the recorded DynamoDB Streams shape, of every item row written since the
        last call (moto's ``dynamodbstreams`` does not answer this botocore's requests, so the keys
        are read from the table and put into the recorded event)."""
        recorded = json.loads((EVENTS / "dynamodb_stream_insert.json").read_text())["Records"][0]
        found = []
        for page in self.dynamodb.get_paginator("scan").paginate(TableName="items"):
            for row in page["Items"]:
                key = (row["pk"]["S"], row["sk"]["S"])
                if key in self._seen:
                    continue
                self._seen.add(key)
                record = copy.deepcopy(recorded)
                record["dynamodb"]["Keys"] = {"pk": {"S": key[0]}, "sk": {"S": key[1]}}
                found.append(record)
        return found

    def dispatch(self) -> dict[str, Any]:
        result: dict[str, Any] = handler("dispatcher")({"Records": self.records()}, context("dispatcher"))
        return result


def context(name: str = "stream") -> LocalContext:
    return LocalContext(function_name=name, timeout_seconds=29)


@pytest.fixture
def streams(api: Api, monkeypatch: pytest.MonkeyPatch) -> Streams:
    monkeypatch.setenv(EnvVar.CONNECTIONS_TABLE, "connections")
    monkeypatch.setenv(EnvVar.STREAM_ENDPOINT, ENDPOINT)
    bootstrap.reset()
    stream_aws._management_client.cache_clear()  # a client per moto context
    client = bootstrap.get_client()
    client.create_table(**connections_table_definition("connections"))
    client.update_table(
        TableName="items", StreamSpecification={"StreamEnabled": True, "StreamViewType": "KEYS_ONLY"}
    )
    return Streams(api)


def new_queue(api: Api, **options: Any) -> str:
    name = f"q{uuid.uuid4().hex[:8]}"
    api.ok(
        "/v1/queues.create", {"queue_name": name, "lease_timeout": "30s", "expire_timeout": "1h", **options}
    )
    return name


def produce(api: Api, queue: str, payloads: list[str], **item: Any) -> None:
    api.ok("/v1/queue.produce", {"queue_name": queue, "items": [{"utf8": p, **item} for p in payloads]})


def test_subscribing_pushes_what_is_there_within_the_credit_and_completing_returns_it(
    api: Api, streams: Streams
) -> None:
    queue = new_queue(api)
    produce(api, queue, ["a", "b", "c", "d", "e"])

    connection = streams.connect(queue_name=queue, credit=3)

    frames = streams.frames(connection)
    assert frames[0] == {"type": "subscribed", "queue_name": queue, "credit": 3}
    first = [item for frame in frames[1:] for item in frame["items"]]
    assert [base64.b64decode(item["bytes"]) for item in first] == [b"a", b"b", b"c"]
    assert (
        api.ok("/v1/queue.stats", {"queue_name": queue})["logicalQueues"][0]["partitions"][0]["total_leased"]
        == 3
    )

    # Completing two over the stream answers ok and gives two credits back: two more are pushed.
    streams.send(
        connection,
        {"type": "complete", "request_id": "r1", "partition": 0, "ids": [i["id"] for i in first[:2]]},
    )
    frames = streams.frames(connection)
    assert frames[0]["type"] == "ok" and frames[0]["request_id"] == "r1"
    assert [base64.b64decode(i["bytes"]) for f in frames[1:] for i in f["items"]] == [b"d", b"e"]


def test_items_written_later_reach_subscribers_through_the_dispatcher_one_consumer_each_within_credit(
    api: Api, streams: Streams
) -> None:
    # GIVEN: eight consumers subscribed to an empty queue, credit 2 each
    queue = new_queue(api)
    consumers = [streams.connect(queue_name=queue, credit=2) for _ in range(8)]
    for connection in consumers:
        assert [f["type"] for f in streams.frames(connection)] == ["subscribed"]
    streams.records()  # the subscriptions' own writes are not items

    # WHEN: 30 items are produced and the items table's stream records reach the dispatcher
    produce(api, queue, [f"job {n}" for n in range(30)])
    result = streams.dispatch()

    # THEN: 16 items pushed, each to one consumer, none beyond a consumer's credit
    assert result == {"queues": 1, "pushed": 16}
    held = {connection: streams.leased(connection) for connection in consumers}
    assert all(len(items) == 2 for items in held.values())
    ids = [item["id"] for items in held.values() for item in items]
    assert len(set(ids)) == 16
    # A second batch of records with nothing new pushes nothing: every credit is in use.
    assert streams.dispatch() == {"queues": 0, "pushed": 0}


def test_a_disconnect_mid_lease_loses_nothing_and_the_old_ids_stay_fenced(api: Api, streams: Streams) -> None:
    queue = new_queue(api, lease_timeout="1s")
    produce(api, queue, ["precious"])
    first = streams.connect(queue_name=queue, credit=1)
    [held] = streams.leased(first)

    assert handler("stream")(ws_event(first, "$disconnect"), context())["statusCode"] == 200
    assert DynamoDBConnections(bootstrap.get_client(), "connections").get(first) is None

    # The lease runs out and the reaper puts the item back at the tail: that write is an insert the
    # dispatcher sees, so a new subscriber gets the item again, with a new id. (The sweep does not
    # pump it before then: the queue's counters still show the item leased.)
    second = streams.connect(queue_name=queue, credit=1)
    assert streams.leased(second) == []
    handler("dispatcher")(scheduled_event(), context("dispatcher"))
    assert streams.leased(second) == []
    deadline = time.monotonic() + DEADLINE
    again: list[dict[str, Any]] = []
    while not again and time.monotonic() < deadline:
        time.sleep(0.2)
        handler("reaper")(scheduled_event(), context("reaper"))
        streams.dispatch()
        again = streams.leased(second)
    assert [item["payload"] for item in again] == [b"precious"]
    assert again[0]["id"] != held["id"]
    stale = api.call("/v1/queue.complete", {"queue_name": queue, "partition": 0, "ids": [held["id"]]})
    assert stale.status == 400


def test_an_item_scheduled_for_later_is_left_to_the_sweep(api: Api, streams: Streams) -> None:
    queue = new_queue(api)
    connection = streams.connect(queue_name=queue, credit=5)
    streams.frames(connection)
    streams.records()
    soon = (datetime.now(UTC) + timedelta(seconds=1)).isoformat().replace("+00:00", "Z")
    produce(api, queue, ["later"], enqueue_at=soon)

    assert streams.dispatch() == {"queues": 0, "pushed": 0}
    deadline = time.monotonic() + DEADLINE
    pushed: list[dict[str, Any]] = []
    while not pushed and time.monotonic() < deadline:
        time.sleep(0.2)
        handler("dispatcher")(scheduled_event(), context("dispatcher"))
        pushed = streams.leased(connection)
    assert [item["payload"] for item in pushed] == [b"later"]


def test_an_item_too_large_for_one_message_arrives_in_parts(api: Api, streams: Streams) -> None:
    queue = new_queue(api)
    big = "x" * 250_000
    produce(api, queue, ["small", big, "after"])

    connection = streams.connect(queue_name=queue, credit=3)

    frames = streams.frames(connection)
    assert all(len(json.dumps(frame).encode()) <= MAX_FRAME_BYTES for frame in frames)
    assert [f["type"] for f in frames].count("part") >= 3
    streams._read[connection] = 0  # the same frames again, assembled
    assert [item["payload"] for item in streams.leased(connection)] == [b"small", big.encode(), b"after"]


def test_a_1_mib_item_from_the_payload_bucket_arrives_in_parts_and_leaves_no_object(
    api: Api, streams: Streams
) -> None:
    queue = new_queue(api)
    big = "b" * MAX_PAYLOAD_BYTES
    produce(api, queue, [big])
    assert len(payload_objects()) == 1

    connection = streams.connect(queue_name=queue, credit=1)

    frames = streams.frames(connection)
    assert all(len(json.dumps(frame).encode()) <= MAX_FRAME_BYTES for frame in frames)
    assert [f["type"] for f in frames].count("part") >= 10
    streams._read[connection] = 0
    (item,) = streams.leased(connection)
    assert item["payload"] == big.encode()
    api.ok("/v1/queue.complete", {"queue_name": queue, "partition": 0, "ids": [item["id"]]})
    assert payload_objects() == []


def test_lease_frames_keep_every_frame_under_the_limit_and_in_order() -> None:
    items = [
        {"id": f"{n:030x}", "bytes": base64.b64encode(b"y" * size).decode()}
        for n, size in enumerate([10, 90_000, 10, 200_000, 40_000, 40_000])
    ]
    frames = [json.loads(f) for f in lease_frames({"queue_name": "q", "partition": 2, "items": items})]

    assert all(len(json.dumps(frame).encode()) <= MAX_FRAME_BYTES for frame in frames)
    assembler = _Assembler()
    leases = [lease for frame in frames for lease in assembler.feed(frame)]
    assert [item.payload for lease in leases for item in lease.items] == [
        base64.b64decode(i["bytes"]) for i in items
    ]
    assert {lease.partition for lease in leases} == {2}


def test_a_subscription_to_an_unknown_queue_is_refused_and_forgotten(api: Api, streams: Streams) -> None:
    connection = streams.connect(queue_name="nowhere", credit=1)

    # Refused before "subscribed" (one queues.info), not answered "subscribed" and then failed.
    [refused] = streams.frames(connection)
    assert refused["type"] == "error" and refused["code"] == 400
    assert refused["message"].startswith("Queue does not exist")
    assert DynamoDBConnections(bootstrap.get_client(), "connections").get(connection) is None


def test_bad_messages_are_answered_and_the_subscription_stays(api: Api, streams: Streams) -> None:
    queue = new_queue(api)
    connection = streams.connect()
    streams.send(connection, {"type": "credit", "credit": 1})
    streams.send(connection, "not json")
    streams.send(connection, {"type": "subscribe", "queue_name": queue, "credit": 1})
    streams.send(connection, {"type": "subscribe", "queue_name": queue, "credit": 1})
    streams.send(connection, {"type": "ping"})

    frames = streams.frames(connection)
    assert [f["type"] for f in frames] == ["error", "error", "subscribed", "error", "pong"]
    assert "subscribe first" in frames[0]["message"]
    assert "already subscribed" in frames[3]["message"]


def test_a_gone_connection_is_forgotten_and_its_items_come_back_by_their_leases(
    api: Api, streams: Streams
) -> None:
    queue = new_queue(api)
    connections = DynamoDBConnections(bootstrap.get_client(), "connections")
    connections.subscribe("gone", queue, "c", 2)
    produce(api, queue, ["a"])
    dispatcher = Dispatcher(connections, stream_aws.InProcessApi(context()), lambda cid, frame: False)

    assert dispatcher.pump("gone") == 0
    assert connections.get("gone") is None
    stats = api.ok("/v1/queue.stats", {"queue_name": queue})["logicalQueues"][0]["partitions"][0]
    assert stats["total_leased"] == 1  # leased to the gone connection until its lease runs out


def test_the_sweep_reads_an_idle_queues_counters_once_and_leases_only_where_something_is_ready(
    api: Api, streams: Streams
) -> None:
    idle, busy = new_queue(api), new_queue(api)
    connections = DynamoDBConnections(bootstrap.get_client(), "connections")
    for connection_id, queue in (("idle-1", idle), ("idle-2", idle), ("busy", busy)):
        connections.subscribe(connection_id, queue, connection_id, 2)
    produce(api, busy, ["ready"])
    calls: list[tuple[str, str]] = []
    in_process = stream_aws.InProcessApi(context())

    def counted(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        calls.append((path, body["queue_name"]))
        return in_process(path, body)

    dispatcher = Dispatcher(connections, counted, lambda cid, frame: True)

    assert dispatcher.sweep() == 1
    assert sorted(call for call in calls if call[1] == idle) == [("/v1/queue.stats", idle)]
    assert ("/v1/queue.lease", busy) in calls


def test_only_inserted_ready_item_rows_name_a_queue() -> None:
    now = datetime.now(UTC)
    ready = "0" * 30
    later = "f" * 30

    def record(event: str, pk: str, sk: str) -> dict[str, Any]:
        return {"eventName": event, "dynamodb": {"Keys": {"pk": {"S": pk}, "sk": {"S": sk}}}}

    records = [
        record("INSERT", "jobs~0", ready),
        record("INSERT", "mail~3", ready),
        record("MODIFY", "other~0", ready),  # a claim or a renewal
        record("REMOVE", "other~0", ready),  # a complete
        record("INSERT", "other~0", "~A"),  # a head row
        record("INSERT", "other~0", "~L0000000000000001abc"),  # a lease record
        record("INSERT", "other~idem~abcdef", "~"),  # an idempotency record
        record("INSERT", "scheduled~0", later),  # visible far in the future
    ]
    assert stream_aws.written_queues(records, now) == {"jobs", "mail"}


def test_a_refused_settle_returns_no_credit_and_pushes_nothing(api: Api, streams: Streams) -> None:
    queue = new_queue(api)
    produce(api, queue, ["a", "b", "c", "d"])
    connection = streams.connect(queue_name=queue, credit=2)
    ids = [item["id"] for item in streams.leased(connection)]
    assert len(ids) == 2

    # A partition the queue does not have: refused whole, nothing applied.
    streams.send(connection, {"type": "complete", "request_id": "r1", "partition": 5, "ids": ids})
    [refused] = streams.frames(connection)
    assert (refused["type"], refused["code"], refused["request_id"]) == ("error", 400, "r1")
    # Half applied: the applied id's credit comes back (one push of one item), not the other's.
    streams.send(
        connection, {"type": "complete", "request_id": "r2", "partition": 0, "ids": [ids[0], "0" * 30]}
    )
    frames = streams.frames(connection)
    assert frames[0]["type"] == "error" and frames[0]["request_id"] == "r2"
    assert sum(len(f["items"]) for f in frames[1:]) == 1
    row = DynamoDBConnections(bootstrap.get_client(), "connections").get(connection)
    assert row is not None and (row.credit, len(row.held)) == (0, 2)


def test_a_deeply_nested_message_is_answered_400_on_the_stack(api: Api, streams: Streams) -> None:
    connection = streams.connect()
    streams.send(connection, '{"type":"ping","x":' + "[" * 50_000 + "]" * 50_000 + "}")
    [answer] = streams.frames(connection)
    assert (answer["type"], answer["code"]) == ("error", 400)
    assert "nested too deeply" in answer["message"]


def test_a_message_over_the_protocols_limit_is_answered_413_on_the_stack(api: Api, streams: Streams) -> None:
    # API Gateway closes the connection on a message over 128 KB before the function sees it; the
    # function checks the protocol's own limit all the same.
    connection = streams.connect()
    streams.send(connection, json.dumps({"type": "ping", "x": "y" * protocol.MAX_MESSAGE_BYTES}))
    [answer] = streams.frames(connection)
    assert (answer["type"], answer["code"]) == ("error", 413)


def test_with_tickets_required_a_subscribe_needs_a_ticket_of_its_queue(
    api: Api, streams: Streams, monkeypatch: pytest.MonkeyPatch
) -> None:
    # $connect's IAM grant names no queue: the ticket from the queue's (IAM-scoped) REST path does.
    monkeypatch.setenv(EnvVar.STREAM_TICKETS, "required")
    load_settings.cache_clear()
    orders, emails = new_queue(api), new_queue(api)
    produce(api, orders, ["o"])
    ticket = api.ok(f"/v1/queues/{orders}/stream.ticket", {})["ticket"]

    refused = {
        "none": streams.connect(queue_name=orders, credit=1),
        "other queue": streams.connect(queue_name=emails, credit=1, ticket=ticket),
        "forged": streams.connect(queue_name=orders, credit=1, ticket=ticket[:-4] + "AAAA"),
    }
    for why, connection in refused.items():
        [frame] = streams.frames(connection)
        assert (frame["type"], frame["code"]) == ("error", 403), (why, frame)
        if why == "none":
            assert "needs a ticket" in frame["message"]

    granted = streams.connect(queue_name=orders, credit=1, ticket=ticket)
    frames = streams.frames(granted)
    assert frames[0] == {"type": "subscribed", "queue_name": orders, "credit": 1}
    assert [base64.b64decode(i["bytes"]) for f in frames[1:] for i in f["items"]] == [b"o"]


def test_without_the_requirement_a_ticket_sent_is_still_checked(api: Api, streams: Streams) -> None:
    orders, emails = new_queue(api), new_queue(api)
    ticket = api.ok("/v1/stream.ticket", {"queue_name": orders})["ticket"]
    assert streams.frames(streams.connect(queue_name=emails, credit=1))[0]["type"] == "subscribed"
    [frame] = streams.frames(streams.connect(queue_name=emails, credit=1, ticket=ticket))
    assert (frame["type"], frame["code"]) == ("error", 403)
    assert f"for queue '{orders}', not '{emails}'" in frame["message"]


def _inserts(keys: set[tuple[str, str]]) -> list[dict[str, Any]]:
    """DynamoDB Streams records (``KEYS_ONLY``) of rows inserted under ``keys``."""
    return [
        {"eventName": "INSERT", "dynamodb": {"Keys": {"pk": {"S": pk}, "sk": {"S": sk}}}} for pk, sk in keys
    ]


def test_engine_v3_packed_rows_name_their_queue_and_no_other_row_of_a_log_does() -> None:
    with mock_aws():
        client = dynamodb_client()
        clock = FakeClock()
        service = build_service(client, clock=clock, prefix="v3stream", engine=3)
        service.create_queue(
            QueueInfo(
                name="jobs",
                lease_timeout=timedelta(seconds=30),
                expire_timeout=timedelta(days=1),
                partitions=1,
                created_at=clock.now(),
                updated_at=clock.now(),
            )
        )
        seen: set[tuple[str, str]] = set()

        def written() -> set[tuple[str, str]]:
            pages = client.get_paginator("scan").paginate(TableName="v3stream-items")
            keys = {(row["pk"]["S"], row["sk"]["S"]) for page in pages for row in page["Items"]}
            fresh = keys - seen
            seen.update(keys)
            return fresh

        def log_rows(keys: set[tuple[str, str]]) -> set[tuple[str, str]]:
            return {(pk, sk) for pk, sk in keys if "~v" in pk and sk.startswith("D")}

        now = clock.now()
        # A scheduled item (of another band): its schedule row, the log's head, the band's
        # registration; nothing ready, so nothing to wake (the sweep finds it when due)
        service.produce("jobs", [NewItem(payload=b"later", priority=2, enqueue_in=timedelta(hours=1))])
        scheduled = written()
        assert scheduled and not log_rows(scheduled)
        assert stream_aws.written_queues(_inserts(scheduled), now) == set()

        # A produce: a packed row (and a head) -> the queue, by the packed row alone
        service.produce("jobs", [NewItem(payload=b"a"), NewItem(payload=b"b")])
        produced = written()
        assert len(log_rows(produced)) == 1
        assert stream_aws.written_queues(_inserts(produced), now) == {"jobs"}
        assert stream_aws.written_queues(_inserts(produced - log_rows(produced)), now) == set()

        # A lease writes its record in the head: nothing inserted that wakes anyone
        assert len(service.lease("jobs", batch_size=10, client_id="c").items) == 2
        assert stream_aws.written_queues(_inserts(written()), now) == set()

        # The lease runs out: the next lease appends its items at the tail, a packed row again
        clock.advance(timedelta(minutes=1))
        service.lease("jobs", batch_size=10, client_id="c")
        returned = written()
        assert len(log_rows(returned)) == 1
        assert stream_aws.written_queues(_inserts(returned), clock.now()) == {"jobs"}


def test_a_filler_row_names_no_queue_when_its_image_says_so() -> None:
    now = datetime.now(UTC)
    row = {"pk": {"S": "jobs~0~vp3~r"}, "sk": {"S": "D00062b1c3e5f1a20"}}

    def record(image: dict[str, Any] | None) -> dict[str, Any]:
        change: dict[str, Any] = {"Keys": row}
        if image is not None:
            change["NewImage"] = {**row, **image}
        return {"eventName": "INSERT", "dynamodb": change}

    assert stream_aws.written_queues([record({"f": {"BOOL": True}})], now) == set()
    assert stream_aws.written_queues([record({"it": {"L": []}})], now) == {"jobs"}
    # Keys only (the stack's stream view): a packed row's key, which a filler's also is
    assert stream_aws.written_queues([record(None)], now) == {"jobs"}
    # Not a log's row: a head, a spilled record, its deadline index, a schedule row, a bad position
    others = ["H", "P00062b1c3e5f1a20tok", "L0000000000000100062b1c3e5f1a20tok", "S0123456789abcd0123456789"]
    others += ["D00062b1c3e5f1a2", "D00062b1c3e5f1a2z"]
    records = [{"eventName": "INSERT", "dynamodb": {"Keys": {**row, "sk": {"S": sk}}}} for sk in others]
    assert stream_aws.written_queues(records, now) == set()
    # Nor an update or a removal of a packed row
    changed = [{**record(None), "eventName": event} for event in ("MODIFY", "REMOVE")]
    assert stream_aws.written_queues(changed, now) == set()
