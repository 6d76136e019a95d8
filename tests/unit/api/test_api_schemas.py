"""Request and response models of the wire (querator.api.schemas)."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from querator.api import schemas
from querator.api.errors import UNSUPPORTED_CONTENT, WireError, status_for
from querator.api.schemas import parse_request
from querator.domain.errors import InvalidRequestError, PayloadTooLargeError
from querator.domain.model import (
    ClearScope,
    Item,
    Lease,
    PartitionStats,
    QueueInfo,
    Renewal,
    RenewOutcome,
    Reprioritized,
    RetryRequest,
)

NOW = datetime(2026, 11, 22, 5, 33, 11, 123456, tzinfo=UTC)
ITEM_ID = "0006442f1a2b3c4d00000000010a1b2c"


def parse(model: type[schemas.ModelT], body: object) -> schemas.ModelT:
    return parse_request(model, json.dumps(body), content_type="application/json")


def invalid(model: type[schemas.WireRequest], body: object) -> str:
    """The 400 message a body gets."""
    with pytest.raises(InvalidRequestError) as caught:
        parse(model, body)
    assert status_for(caught.value) == 400
    return str(caught.value)


def unsupported(model: type[schemas.WireRequest], body: str | bytes, content_type: str | None = None) -> str:
    """The 455 message a body gets."""
    with pytest.raises(WireError) as caught:
        parse_request(model, body, content_type=content_type)
    assert caught.value.status == UNSUPPORTED_CONTENT
    return str(caught.value)


# -- keys -------------------------------------------------------------------------------------------


def test_camel_case_keys_are_accepted() -> None:
    request = parse(
        schemas.LeaseRequest,
        {"queueName": "orders", "batchSize": 10, "clientId": "worker-1", "requestTimeout": "15s"},
    )
    assert request.queue_name == "orders"
    assert request.batch_size == 10
    assert request.client_id == "worker-1"
    assert request.request_timeout == timedelta(seconds=15)


def test_snake_and_camel_case_can_mix() -> None:
    request = parse(schemas.CompleteRequest, {"queue_name": "orders", "partition": 1, "ids": [ITEM_ID]})
    assert request.partition == 1
    nested = parse(
        schemas.ProduceRequest,
        {"queueName": "orders", "items": [{"utf8": "x", "enqueueAt": "2026-11-22T05:33:11Z"}]},
    )
    assert nested.items[0].enqueue_at == datetime(2026, 11, 22, 5, 33, 11, tzinfo=UTC)


def test_unknown_key_is_455_and_named() -> None:
    message = unsupported(schemas.QueueInfoRequest, '{"queue_name": "orders", "colour": "blue"}')
    assert message.startswith("Unsupported content; ")
    assert "colour: unknown key" in message


def test_unknown_nested_key_is_455() -> None:
    body = json.dumps({"queue_name": "orders", "items": [{"utf8": "x", "payload": "y"}]})
    assert "items[0].payload: unknown key" in unsupported(schemas.ProduceRequest, body)


def test_unknown_key_is_455_naming_it() -> None:
    message = unsupported(schemas.StatsRequest, json.dumps({"queue_name": "orders", "extra": 1}))
    assert message == "Unsupported content; extra: unknown key"


@pytest.mark.parametrize("body", ["{", "not json", "[]", '"orders"', "null", "42", b"\xff\xfe"])
def test_body_that_is_not_a_json_object_is_455(body: str | bytes) -> None:
    unsupported(schemas.StatsRequest, body)


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
)
def test_non_json_content_type_is_455(content_type: str) -> None:
    assert "Content-Type" in unsupported(schemas.StatsRequest, '{"queue_name": "q"}', content_type)


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON",
        "application/vnd.x+json",
    ],
)
def test_json_content_types_are_accepted(content_type: str | None) -> None:
    request = parse_request(schemas.StatsRequest, '{"queue_name": "q"}', content_type=content_type)
    assert request.queue_name == "q"


@pytest.mark.parametrize("body", [None, "", b"", "  \n"])
def test_an_empty_body_is_not_json_so_455(body: str | bytes | None) -> None:
    # The contract: a body that is not JSON is a 455; "all defaults" is spelled {}.
    assert "the body is empty" in unsupported(schemas.ListQueuesRequest, body)
    assert "the body is empty" in unsupported(schemas.ProduceRequest, body)


def test_an_empty_object_means_all_defaults() -> None:
    request = parse_request(schemas.ListQueuesRequest, "{}")
    assert (request.pivot, request.limit) == ("", schemas.DEFAULT_QUEUES_LIMIT)


# -- keys given twice -------------------------------------------------------------------------------


def test_a_key_given_twice_at_the_top_level_is_400_naming_it() -> None:
    # json.loads would keep the last value: this produce would have gone to queue "b".
    body = '{"queue_name": "a", "queue_name": "b", "items": [{"utf8": "x"}]}'
    with pytest.raises(InvalidRequestError) as caught:
        parse_request(schemas.ProduceRequest, body)
    assert status_for(caught.value) == 400
    assert str(caught.value) == "queue_name: key given more than once"


def test_a_key_given_twice_inside_an_item_is_400_naming_its_place() -> None:
    body = '{"queue_name": "q", "items": [{"utf8": "x"}, {"utf8": "x", "priority": 1, "priority": 9}]}'
    with pytest.raises(InvalidRequestError) as caught:
        parse_request(schemas.ProduceRequest, body)
    assert str(caught.value) == "items[1].priority: key given more than once"


def test_each_key_given_twice_is_named_once() -> None:
    body = '{"queue_name": "q", "ids": ["a"], "ids": ["b"], "ids": ["c"], "partition": 0, "partition": 1}'
    with pytest.raises(InvalidRequestError) as caught:
        parse_request(schemas.CompleteRequest, body)
    assert str(caught.value) == "ids: key given more than once; partition: key given more than once"


def test_a_key_given_twice_deeper_than_a_message_is_still_refused() -> None:
    # A retry item's keys are a message too; an object where a string belongs is a wrong value.
    body = '{"queue_name": "q", "items": [{"id": "x", "dead": true, "dead": false}]}'
    with pytest.raises(InvalidRequestError) as caught:
        parse_request(schemas.RetryRequest, body)
    assert "items[0].dead: key given more than once" in str(caught.value)


def test_an_unknown_key_given_twice_is_still_455() -> None:
    # Not understanding the body comes first, as for any unknown key.
    assert "x: unknown key" in unsupported(schemas.StatsRequest, '{"queue_name": "q", "x": 1, "x": 2}')


def test_the_same_value_twice_is_refused_too() -> None:
    # Which one was meant cannot matter to the rule: a body with a repeated key is ambiguous.
    with pytest.raises(InvalidRequestError, match="queue_name: key given more than once"):
        parse_request(schemas.StatsRequest, '{"queue_name": "q", "queue_name": "q"}')


def test_body_over_the_limit_is_413() -> None:
    body = json.dumps({"queue_name": "q", "items": [{"utf8": "x" * 100}]})
    with pytest.raises(PayloadTooLargeError) as caught:
        parse_request(schemas.ProduceRequest, body, limit=50)
    assert status_for(caught.value) == 413
    parse_request(schemas.ProduceRequest, body, limit=len(body))


def test_missing_required_field_is_400_naming_it() -> None:
    message = invalid(schemas.LeaseRequest, {"queue_name": "orders", "client_id": "w"})
    assert message.startswith("batch_size: ")


def test_errors_name_snake_case_fields_even_for_camel_case_input() -> None:
    message = invalid(schemas.LeaseRequest, {"queueName": "orders", "clientId": "w", "batchSize": 0})
    assert "batch_size:" in message
    assert "batchSize" not in message


def test_a_400_names_every_wrong_field() -> None:
    message = invalid(
        schemas.ProduceRequest,
        {"queue_name": "", "items": [{"utf8": "ok"}, {"bytes": "%%%"}], "request_timeout": "soon"},
    )
    assert "queue_name:" in message
    assert "items[1].bytes:" in message
    assert "request_timeout:" in message


def test_bad_queue_name_is_400() -> None:
    assert "whitespace" in invalid(schemas.StatsRequest, {"queue_name": "my queue"})
    assert "'~'" in invalid(schemas.StatsRequest, {"queue_name": "a~b"})


# -- produce ----------------------------------------------------------------------------------------


def test_produce_refuses_an_item_without_a_payload_naming_it() -> None:
    # An empty payload is {"utf8": ""}; an item with neither key is a client bug (a misspelt key is
    # 455, so this is a body whose only keys are reference, kind, ...).
    with pytest.raises(InvalidRequestError) as raised:
        parse(schemas.ProduceRequest, {"queue_name": "q", "items": [{"utf8": "a"}, {"reference": "r"}]})
    assert str(raised.value).startswith("items[1]: no payload: give 'bytes' (base64) or 'utf8'")


def test_produce_decodes_bytes_and_encodes_utf8() -> None:
    request = parse(
        schemas.ProduceRequest,
        {
            "queue_name": "orders",
            "request_timeout": "1m",
            "items": [
                {
                    "bytes": base64.b64encode(b"\x00\xff").decode(),
                    "reference": "r",
                    "encoding": "e",
                    "kind": "k",
                },
                {"utf8": "héllo"},
                {"bytes": "aGk"},  # protojson accepts unpadded base64
                {"utf8": ""},
                {"bytes": ""},
            ],
        },
    )
    items = request.to_domain()
    assert [i.payload for i in items] == [b"\x00\xff", "héllo".encode(), b"hi", b"", b""]
    assert (items[0].reference, items[0].encoding, items[0].kind) == ("r", "e", "k")
    assert request.request_timeout == timedelta(minutes=1)


def test_produce_item_with_both_bytes_and_utf8_is_rejected() -> None:
    message = invalid(schemas.ProduceRequest, {"queue_name": "q", "items": [{"bytes": "aGk=", "utf8": "hi"}]})
    assert "items[0]: give either 'bytes' or 'utf8', not both" in message


@pytest.mark.parametrize("text", ["%%%", "aGk=aGk=", "a", "aGk-", "aG k="])
def test_invalid_base64_is_rejected(text: str) -> None:
    message = invalid(schemas.ProduceRequest, {"queue_name": "q", "items": [{"bytes": text}]})
    assert "items[0].bytes: invalid standard base64" in message


def test_base64_must_be_a_string() -> None:
    assert "items[0].bytes" in invalid(
        schemas.ProduceRequest, {"queue_name": "q", "items": [{"bytes": [1, 2]}]}
    )


@pytest.mark.parametrize("key", ["utf8", "reference", "kind", "group"])
def test_a_lone_surrogate_in_any_string_is_455(key: str) -> None:
    # Valid JSON grammar ("\\ud800"), but such a string has no UTF-8 form: nothing could store it
    # or send it back, so the body is not understood, whichever field holds it.
    body = json.dumps({"queue_name": "q", "items": [{"utf8": "x", key: "a\ud800"}]})
    assert "\\ud800" in body
    assert "lone UTF-16 surrogate" in unsupported(schemas.ProduceRequest, body)


def test_a_surrogate_pair_is_one_character() -> None:
    body = json.dumps({"queue_name": "q", "items": [{"utf8": "\U0001f600"}]})
    assert "\\ud83d\\ude00" in body
    assert parse_request(schemas.ProduceRequest, body).to_domain()[0].payload == "\U0001f600".encode()


def test_produce_takes_1_to_1000_items() -> None:
    assert "items:" in invalid(schemas.ProduceRequest, {"queue_name": "q", "items": []})
    assert "items:" in invalid(schemas.ProduceRequest, {"queue_name": "q", "items": [{"utf8": "x"}] * 1001})
    assert (
        len(parse(schemas.ProduceRequest, {"queue_name": "q", "items": [{"utf8": "x"}] * 1000}).items) == 1000
    )


def test_enqueue_at_must_have_an_offset() -> None:
    body = {"queue_name": "q", "items": [{"utf8": "x", "enqueue_at": "2026-11-22T05:33:11"}]}
    assert "items[0].enqueue_at: invalid timestamp" in invalid(schemas.ProduceRequest, body)


def test_payload_over_the_item_limit_is_400_from_the_domain() -> None:
    request = parse(
        schemas.ProduceRequest,
        {"queue_name": "q", "items": [{"bytes": base64.b64encode(b"x" * 1_048_577).decode()}]},
    )
    with pytest.raises(InvalidRequestError, match="larger than 1048576 bytes"):
        request.to_domain()


# -- lease, complete, retry, renew ------------------------------------------------------------------


@pytest.mark.parametrize("batch_size", [0, -1, 1001])
def test_lease_batch_size_is_1_to_1000(batch_size: int) -> None:
    assert "batch_size" in invalid(
        schemas.LeaseRequest, {"queue_name": "q", "batch_size": batch_size, "client_id": "w"}
    )


def test_lease_request_timeout_is_optional() -> None:
    request = parse(schemas.LeaseRequest, {"queue_name": "q", "batch_size": 1000, "client_id": "w"})
    assert request.request_timeout is None


@pytest.mark.parametrize("timeout", [30, "30", "thirty seconds", None])
def test_durations_must_be_go_strings(timeout: object) -> None:
    body = {"queue_name": "q", "batch_size": 1, "client_id": "w", "request_timeout": timeout}
    if timeout is None:
        assert parse(schemas.LeaseRequest, body).request_timeout is None
    else:
        assert "request_timeout:" in invalid(schemas.LeaseRequest, body)


@pytest.mark.parametrize("model", [schemas.CompleteRequest, schemas.RenewRequest, schemas.DeleteItemsRequest])
def test_ids_are_1_to_1000(model: type[schemas.WireRequest]) -> None:
    assert "ids:" in invalid(model, {"queue_name": "q", "ids": []})
    assert "ids:" in invalid(model, {"queue_name": "q", "ids": [ITEM_ID] * 1001})
    assert "partition:" in invalid(model, {"queue_name": "q", "ids": [ITEM_ID], "partition": -1})


def test_retry_items_become_retry_requests() -> None:
    request = parse(
        schemas.RetryRequest,
        {
            "queue_name": "q",
            "partition": 2,
            "items": [
                {"id": "a"},
                {"id": "b", "retry_at": "2026-11-22T06:00:00+01:00"},
                {"id": "c", "dead": True},
            ],
        },
    )
    assert request.partition == 2
    assert request.to_domain() == [
        RetryRequest(id="a"),
        RetryRequest(id="b", retry_at=datetime(2026, 11, 22, 5, 0, tzinfo=UTC)),
        RetryRequest(id="c", dead=True),
    ]
    assert "items:" in invalid(schemas.RetryRequest, {"queue_name": "q", "items": [{"id": "a"}] * 1001})


def test_renew_lease_timeout_is_optional() -> None:
    assert parse(schemas.RenewRequest, {"queue_name": "q", "ids": ["a"]}).lease_timeout is None
    renew = parse(schemas.RenewRequest, {"queue_name": "q", "ids": ["a"], "leaseTimeout": "2m"})
    assert renew.lease_timeout == timedelta(minutes=2)


# -- queues -----------------------------------------------------------------------------------------


def test_create_queue_to_domain() -> None:
    request = parse(
        schemas.CreateQueueRequest,
        {
            "queue_name": "orders",
            "lease_timeout": "1m",
            "expire_timeout": "24h",
            "max_attempts": 5,
            "dead_queue": "orders-dead",
            "reference": "team-a",
            "requested_partitions": 4,
        },
    )
    assert request.to_domain(NOW) == QueueInfo(
        name="orders",
        lease_timeout=timedelta(minutes=1),
        expire_timeout=timedelta(hours=24),
        max_attempts=5,
        dead_queue="orders-dead",
        reference="team-a",
        partitions=4,
        created_at=NOW,
        updated_at=NOW,
    )


def test_create_queue_requires_both_timeouts() -> None:
    message = invalid(schemas.CreateQueueRequest, {"queue_name": "orders", "lease_timeout": "1m"})
    assert "expire_timeout: Field required" in message
    assert "lease_timeout" not in message.replace("expire_timeout", "")


def test_create_queue_domain_rules_apply_in_to_domain() -> None:
    request = parse(
        schemas.CreateQueueRequest, {"queue_name": "q", "lease_timeout": "1h", "expire_timeout": "1m"}
    )
    with pytest.raises(InvalidRequestError, match="lease_timeout"):
        request.to_domain(NOW)


def test_queue_info_output_fields_are_accepted_and_ignored_on_input() -> None:
    info = QueueInfo(
        name="q",
        lease_timeout=timedelta(minutes=1),
        expire_timeout=timedelta(hours=1),
        created_at=NOW,
        updated_at=NOW,
    )
    echoed = schemas.QueueInfoResponse.from_domain(info).to_wire()
    request = parse(schemas.UpdateQueueRequest, echoed)
    assert request.to_domain().lease_timeout == timedelta(minutes=1)


def test_update_absent_fields_are_none() -> None:
    update = parse(
        schemas.UpdateQueueRequest, {"queue_name": "orders", "maxAttempts": 3, "dead_queue": ""}
    ).to_domain()
    assert update.name == "orders"
    assert update.max_attempts == 3
    assert update.dead_queue == ""  # present and empty: remove the dead-letter queue
    assert update.lease_timeout is None
    assert update.expire_timeout is None
    assert update.reference is None
    assert update.partitions is None


def test_update_with_every_field() -> None:
    update = parse(
        schemas.UpdateQueueRequest,
        {
            "queue_name": "q",
            "lease_timeout": "30s",
            "expire_timeout": "1h",
            "max_attempts": 0,
            "dead_queue": "d",
            "reference": "",
            "requested_partitions": 8,
        },
    ).to_domain()
    assert update.lease_timeout == timedelta(seconds=30)
    assert update.expire_timeout == timedelta(hours=1)
    assert update.max_attempts == 0
    assert update.reference == ""
    assert update.partitions == 8


def test_list_queues_limit_bounds() -> None:
    assert parse(schemas.ListQueuesRequest, {"pivot": "b", "limit": 7}).limit == 7
    assert "limit:" in invalid(schemas.ListQueuesRequest, {"limit": 0})
    assert "limit:" in invalid(schemas.ListQueuesRequest, {"limit": 1001})


def test_queue_info_response_shape() -> None:
    info = QueueInfo(
        name="orders",
        lease_timeout=timedelta(minutes=1),
        expire_timeout=timedelta(hours=24),
        max_attempts=5,
        dead_queue="orders-dead",
        reference="r",
        partitions=4,
        created_at=NOW,
        updated_at=NOW + timedelta(seconds=1),
    )
    assert schemas.ListQueuesResponse.from_domain([info]).to_wire() == {
        "items": [
            {
                "queue_name": "orders",
                "lease_timeout": "1m0s",
                "expire_timeout": "24h0m0s",
                "max_attempts": 5,
                "dead_queue": "orders-dead",
                "reference": "r",
                "requested_partitions": 4,
                "delivery": "fifo",
                "max_leased_per_group": 0,
                "rate_limit": 0.0,
                "rate_limit_per_group": 0.0,
                "created_at": "2026-11-22T05:33:11.123456Z",
                "updated_at": "2026-11-22T05:33:12.123456Z",
            }
        ]
    }


# -- rate limits ------------------------------------------------------------------------------------


def test_rate_limits_are_numbers_of_leases_a_second() -> None:
    body = _create_body(rate_limit=2.5, delivery="fair", rate_limit_per_group=1)
    info = parse(schemas.CreateQueueRequest, body).to_domain(NOW)
    assert (info.rate_limit, info.rate_limit_per_group) == (2.5, 1.0)
    assert parse(schemas.CreateQueueRequest, _create_body()).to_domain(NOW).rate_limit == 0
    for bad in ("20", True, -1, 100_001, None):
        assert "rate_limit:" in invalid(schemas.CreateQueueRequest, _create_body(rate_limit=bad))
    update = parse(schemas.UpdateQueueRequest, {"queue_name": "q", "rate_limit": 7}).to_domain()
    assert (update.rate_limit, update.rate_limit_per_group) == (7.0, None)


# -- delivery ---------------------------------------------------------------------------------------


def _create_body(**fields: object) -> dict[str, object]:
    return {"queue_name": "q", "lease_timeout": "1m", "expire_timeout": "1h", **fields}


def test_create_queue_defaults_to_fifo_without_a_group_limit() -> None:
    info = parse(schemas.CreateQueueRequest, _create_body()).to_domain(NOW)
    assert (info.delivery, info.max_leased_per_group) == ("fifo", 0)


@pytest.mark.parametrize("spelling", ["snake", "camel"])
def test_create_queue_takes_delivery_and_max_leased_per_group(spelling: str) -> None:
    key = "max_leased_per_group" if spelling == "snake" else "maxLeasedPerGroup"
    info = parse(schemas.CreateQueueRequest, _create_body(delivery="fair", **{key: 3})).to_domain(NOW)
    assert (info.delivery, info.max_leased_per_group) == ("fair", 3)
    assert info.fair
    limit = parse(schemas.CreateQueueRequest, _create_body(max_leased_per_group=1_000_000))
    assert limit.to_domain(NOW).max_leased_per_group == 1_000_000


def test_update_queue_carries_delivery_and_max_leased_per_group_only_when_present() -> None:
    update = parse(
        schemas.UpdateQueueRequest, {"queue_name": "q", "delivery": "fair", "max_leased_per_group": 0}
    ).to_domain()
    assert (update.delivery, update.max_leased_per_group) == ("fair", 0)
    absent = parse(schemas.UpdateQueueRequest, {"queue_name": "q", "max_attempts": 2}).to_domain()
    assert (absent.delivery, absent.max_leased_per_group) == (None, None)
    nulls = parse(
        schemas.UpdateQueueRequest, {"queue_name": "q", "delivery": None, "max_leased_per_group": None}
    ).to_domain()
    assert (nulls.delivery, nulls.max_leased_per_group) == (None, None)


@pytest.mark.parametrize("value", ["lifo", "FIFO", "Fair", "", " fair", 1, True, ["fair"]])
def test_delivery_refuses_anything_but_fifo_or_fair_naming_the_field(value: object) -> None:
    message = invalid(schemas.CreateQueueRequest, _create_body(delivery=value))
    assert message.startswith("delivery: ")
    assert "delivery: " in invalid(schemas.UpdateQueueRequest, {"queue_name": "q", "delivery": value})


def test_a_bad_delivery_string_is_told_the_two_values() -> None:
    assert invalid(schemas.CreateQueueRequest, _create_body(delivery="lifo")) == (
        "delivery: must be 'fifo' or 'fair'"
    )


def test_create_queue_refuses_a_null_delivery() -> None:
    assert invalid(schemas.CreateQueueRequest, _create_body(delivery=None)).startswith("delivery: ")
    assert invalid(schemas.CreateQueueRequest, _create_body(max_leased_per_group=None)).startswith(
        "max_leased_per_group: "
    )


@pytest.mark.parametrize("value", [-1, 1_000_001, 2.5, 3.0, "3", True, [3]])
def test_max_leased_per_group_refuses_anything_but_an_integer_0_to_1000000_naming_the_field(
    value: object,
) -> None:
    message = invalid(schemas.CreateQueueRequest, _create_body(max_leased_per_group=value))
    assert message.startswith("max_leased_per_group: ")
    update = invalid(schemas.UpdateQueueRequest, {"queue_name": "q", "maxLeasedPerGroup": value})
    assert update.startswith("max_leased_per_group: ")


def test_queue_info_reply_carries_delivery_and_max_leased_per_group() -> None:
    info = QueueInfo(
        name="q",
        lease_timeout=timedelta(minutes=1),
        expire_timeout=timedelta(hours=1),
        delivery="fair",
        max_leased_per_group=7,
        created_at=NOW,
        updated_at=NOW,
    )
    wire = schemas.QueueInfoResponse.from_domain(info).to_wire()
    assert (wire["delivery"], wire["max_leased_per_group"]) == ("fair", 7)
    # A queues.info reply sent back as an update keeps them.
    echoed = parse(schemas.UpdateQueueRequest, wire).to_domain()
    assert (echoed.delivery, echoed.max_leased_per_group) == ("fair", 7)


# -- clear, stats, storage --------------------------------------------------------------------------


def test_clear_needs_queue_or_scheduled() -> None:
    assert "'queue' or 'scheduled'" in invalid(schemas.ClearRequest, {"queue_name": "q", "destructive": True})
    assert parse(schemas.ClearRequest, {"queue_name": "q", "queue": True}).to_domain() == ClearScope.QUEUE
    scope = parse(
        schemas.ClearRequest, {"queue_name": "q", "queue": True, "scheduled": True, "destructive": True}
    )
    assert scope.to_domain() == ClearScope.QUEUE | ClearScope.SCHEDULED | ClearScope.DESTRUCTIVE


def test_stats_response_has_querator_shape() -> None:
    stats = [
        PartitionStats(
            partition=0,
            total=3,
            total_leased=1,
            scheduled=2,
            average_age=timedelta(seconds=90),
            average_leased_age=timedelta(milliseconds=300),
            produced=1042,
            completed=1037,
        ),
        PartitionStats(partition=1),
    ]
    assert schemas.StatsResponse.from_domain("orders", stats).to_wire() == {
        "queue_name": "orders",
        "logicalQueues": [
            {
                "partitions": [
                    {
                        "partition": 0,
                        "total": 3,
                        "total_leased": 1,
                        "scheduled": 2,
                        "average_age": "1m30s",
                        "average_leased_age": "300ms",
                        "produced": 1042,
                        "completed": 1037,
                    },
                    {
                        "partition": 1,
                        "total": 0,
                        "total_leased": 0,
                        "scheduled": 0,
                        "average_age": "0s",
                        "average_leased_age": "0s",
                        "produced": 0,
                        "completed": 0,
                    },
                ]
            }
        ],
    }


def test_storage_list_defaults() -> None:
    request = parse(schemas.ListItemsRequest, {"queue_name": "q"})
    assert (request.partition, request.pivot, request.limit) == (0, "", 1000)
    assert "limit:" in invalid(schemas.ListScheduledRequest, {"queue_name": "q", "limit": 1001})


def _item(**changes: object) -> Item:
    values: dict[str, object] = {
        "id": ITEM_ID,
        "payload": b"\x01\x02",
        "reference": "r",
        "encoding": "e",
        "kind": "k",
        "attempts": 2,
        "lease_deadline": NOW + timedelta(minutes=1),
        "expire_deadline": NOW + timedelta(hours=1),
        "created_at": NOW - timedelta(minutes=5),
        "source_id": "src",
    }
    values.update(changes)
    return Item(**values)  # type: ignore[arg-type]


def test_storage_item_response_shape() -> None:
    body = schemas.ListItemsResponse.from_domain([_item(), _item(lease_deadline=None)], NOW).to_wire()
    assert body["items"][0] == {
        "id": ITEM_ID,
        "source_id": "src",
        "is_leased": True,
        "lease_deadline": "2026-11-22T05:34:11.123456Z",
        "expire_deadline": "2026-11-22T06:33:11.123456Z",
        "created_at": "2026-11-22T05:28:11.123456Z",
        "attempts": 2,
        "priority": 5,
        "group": "",
        "reference": "r",
        "encoding": "e",
        "kind": "k",
        "payload": "AQI=",
    }
    assert body["items"][1]["is_leased"] is False
    assert "lease_deadline" not in body["items"][1]


def test_a_listed_page_can_be_imported_as_is() -> None:
    page = schemas.ListItemsResponse.from_domain([_item()], NOW).to_wire()
    request = parse(schemas.ImportItemsRequest, {"queue_name": "q", "partition": 0, **page})
    (stored,) = request.to_domain()
    assert stored.payload == b"\x01\x02"
    assert stored.source_id == "src"
    assert stored.attempts == 2
    assert stored.lease_deadline == NOW + timedelta(minutes=1)
    assert stored.created_at == NOW - timedelta(minutes=5)
    assert stored.priority == 5
    assert "items:" in invalid(schemas.ImportItemsRequest, {"queue_name": "q", "items": []})


def test_import_response_lists_new_ids() -> None:
    assert schemas.ImportItemsResponse.from_domain(["a", "b"]).to_wire() == {
        "items": [{"id": "a"}, {"id": "b"}]
    }


# -- lease and renew replies ------------------------------------------------------------------------


def test_lease_response_shape() -> None:
    lease = Lease(queue_name="orders", partition=3, items=[_item()])
    assert schemas.LeaseResponse.from_domain(lease).to_wire() == {
        "queue_name": "orders",
        "partition": 3,
        "items": [
            {
                "id": ITEM_ID,
                "attempts": 2,
                "priority": 5,
                "group": "",
                "lease_deadline": "2026-11-22T05:34:11.123456Z",
                "reference": "r",
                "encoding": "e",
                "kind": "k",
                "bytes": "AQI=",
            }
        ],
    }


def test_renew_response_shape() -> None:
    outcome = RenewOutcome(queue_name="orders", partition=1, items=[Renewal(id="a", lease_deadline=NOW)])
    assert schemas.RenewResponse.from_domain(outcome).to_wire() == {
        "queue_name": "orders",
        "partition": 1,
        "items": [{"id": "a", "lease_deadline": "2026-11-22T05:33:11.123456Z"}],
    }


def test_ok_and_health_responses() -> None:
    assert schemas.OkResponse().to_wire() == {"code": 200}
    assert schemas.HealthResponse().to_wire() == {"status": "pass"}


# -- priority --------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 9])
def test_priority_takes_json_integers_0_to_9(value: int) -> None:
    request = parse(schemas.ProduceRequest, {"queue_name": "q", "items": [{"utf8": "x", "priority": value}]})
    assert request.to_domain()[0].priority == value
    retry = parse(schemas.RetryRequest, {"queue_name": "q", "items": [{"id": "a", "priority": value}]})
    assert retry.to_domain()[0].priority == value


@pytest.mark.parametrize("value", [-1, 10, 2.5, 5.0, "5", True, None])
def test_priority_refuses_anything_but_an_integer_0_to_9_naming_the_field(value: object) -> None:
    message = invalid(
        schemas.ProduceRequest, {"queue_name": "q", "items": [{"utf8": "x", "priority": value}]}
    )
    assert "items[0].priority" in message
    assert "priority" in invalid(
        schemas.ReprioritizeRequest, {"queue_name": "q", "ids": ["a"], "priority": value}
    )


def test_produce_and_retry_default_to_no_change_of_priority() -> None:
    request = parse(schemas.ProduceRequest, {"queue_name": "q", "items": [{"utf8": "x"}]})
    assert request.to_domain()[0].priority == 5
    retry = parse(schemas.RetryRequest, {"queue_name": "q", "items": [{"id": "a"}]})
    assert retry.to_domain()[0].priority is None


def test_reprioritize_response_lists_every_id_with_its_new_id() -> None:
    outcome = Reprioritized(ids={"a": ".1a", "b": "b"})
    assert schemas.ReprioritizeResponse.from_domain("q", 2, outcome).to_wire() == {
        "queue_name": "q",
        "partition": 2,
        "items": [{"id": "a", "new_id": ".1a"}, {"id": "b", "new_id": "b"}],
    }


# -- group ------------------------------------------------------------------------------------------


def test_group_travels_from_produce_and_import_to_the_domain_and_back() -> None:
    request = parse(schemas.ProduceRequest, {"queue_name": "q", "items": [{"utf8": "x", "group": "acme"}]})
    assert request.to_domain()[0].group == "acme"
    imported = parse(schemas.ImportItemsRequest, {"queue_name": "q", "items": [{"group": "acme"}]})
    assert imported.to_domain()[0].group == "acme"
    grouped = replace(_item(), group="acme")
    lease = Lease(queue_name="q", partition=0, items=[grouped])
    assert schemas.LeaseResponse.from_domain(lease).to_wire()["items"][0]["group"] == "acme"
    assert schemas.ListItemsResponse.from_domain([grouped], NOW).to_wire()["items"][0]["group"] == "acme"


@pytest.mark.parametrize("value", ["x" * 129, "a\nb", "\u0007", 5, None])
def test_group_refuses_long_control_or_non_string_values_naming_the_field(value: object) -> None:
    message = invalid(schemas.ProduceRequest, {"queue_name": "q", "items": [{"utf8": "x", "group": value}]})
    assert "items[0].group" in message
    assert "group" in invalid(schemas.ImportItemsRequest, {"queue_name": "q", "items": [{"group": value}]})


# -- what the fuzzers found -------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["é", "aGk=é", "\u00ff\u00ff\u00ff\u00ff"])
def test_base64_with_a_character_outside_ascii_is_400(text: str) -> None:
    message = invalid(schemas.ProduceRequest, {"queue_name": "q", "items": [{"bytes": text}]})
    assert message.startswith("items[0].bytes: invalid standard base64")


@pytest.mark.parametrize(
    "body", ["[" * 100_000 + "]" * 100_000, '{"queue_name":' + "[" * 5000 + "]" * 5000 + "}"]
)
def test_a_body_nested_too_deeply_is_455(body: str) -> None:
    assert "invalid JSON" in unsupported(schemas.ProduceRequest, body)


def test_a_lone_surrogate_deep_in_a_body_is_found_without_recursion() -> None:
    body = '{"queue_name":' + "[" * 900 + '"\\ud800"' + "]" * 900 + "}"
    assert "lone UTF-16 surrogate" in unsupported(schemas.ProduceRequest, body)


def test_both_spellings_of_one_key_is_400() -> None:
    message = invalid(schemas.StatsRequest, {"queue_name": "a", "queueName": "b"})
    assert message == "queue_name: given twice, as 'queue_name' and 'queueName'"
    # In the order given: the camelCase one first says so.
    message = invalid(schemas.StatsRequest, {"queueName": "b", "queue_name": "a"})
    assert message == "queue_name: given twice, as 'queueName' and 'queue_name'"


@pytest.mark.parametrize("value", [True, False, 2.5, "ten", "1e2", [], {}])
def test_an_integer_field_refuses_booleans_fractions_and_words(value: object) -> None:
    assert invalid(schemas.ListQueuesRequest, {"limit": value}).startswith("limit: ")


@pytest.mark.parametrize(("value", "expected"), [(7, 7), (7.0, 7), ("7", 7), (" 7 ", 7), ("7.0", 7)])
def test_an_integer_field_takes_whole_numbers_and_decimal_strings(value: object, expected: int) -> None:
    assert parse(schemas.ListQueuesRequest, {"limit": value}).limit == expected


@pytest.mark.parametrize(
    ("value", "expected"), [(True, True), (1, True), ("yes", True), ("off", False), (0, False), ("F", False)]
)
def test_a_boolean_field_takes_the_usual_spellings(value: object, expected: bool) -> None:
    assert (
        parse(schemas.RetryRequest, {"queue_name": "q", "items": [{"id": "a", "dead": value}]}).items[0].dead
        is expected
    )


@pytest.mark.parametrize("value", [2, "maybe", None, 0.5])
def test_a_boolean_field_refuses_anything_else(value: object) -> None:
    message = invalid(schemas.RetryRequest, {"queue_name": "q", "items": [{"id": "a", "dead": value}]})
    assert message.startswith("items[0].dead: ")


@pytest.mark.parametrize(
    "body", ["NaN", '{"queue_name": "q", "limit": Infinity}', '{"queue_name": "q", "x": -Infinity}']
)
def test_nan_and_infinity_are_not_json(body: str) -> None:
    assert "invalid JSON" in unsupported(schemas.ListItemsRequest, body)


@pytest.mark.parametrize("sign", ["", "-"])
def test_an_integer_past_pythons_digit_limit_is_a_400_naming_the_field(sign: str) -> None:
    body = '{"queue_name": "q", "limit": ' + sign + "9" * 4301 + "}"
    with pytest.raises(InvalidRequestError) as caught:
        parse_request(schemas.ListItemsRequest, body)
    assert status_for(caught.value) == 400
    assert str(caught.value).startswith("limit: ")


def test_a_message_is_immutable_and_equal_by_value() -> None:
    first = parse(schemas.StatsRequest, {"queue_name": "q"})
    assert first == parse(schemas.StatsRequest, {"queueName": "q"})
    assert first != parse(schemas.StatsRequest, {"queue_name": "r"})
    with pytest.raises(AttributeError):
        first.queue_name = "r"  # type: ignore[misc]


def test_a_response_refuses_an_unknown_or_missing_field() -> None:
    with pytest.raises(TypeError, match="colour"):
        schemas.ImportedItem(id="a", colour="blue")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="'id'"):
        schemas.ImportedItem()  # type: ignore[call-arg]


def test_a_455_names_only_what_was_not_understood() -> None:
    body = json.dumps({"queue_name": "q", "items": [5, {"utf8": "x", "colour": 1}], "extra": True})
    message = unsupported(schemas.ProduceRequest, body)
    assert message == "Unsupported content; extra: unknown key; items[1].colour: unknown key"


# -- queue names --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a\x00b", "a\x1b[2Jb", "a\x07b", "a\x7fb", "a\x80b", "a\x9bb"])
def test_a_queue_to_create_may_not_hold_control_characters(name: str) -> None:
    body = {"queue_name": name, "lease_timeout": "30s", "expire_timeout": "1h"}
    message = invalid(schemas.CreateQueueRequest, body)
    assert message == "queue_name: queue_name may not hold control characters"


def test_a_lookup_takes_any_name_a_queue_could_have_been_created_with() -> None:
    # Queues created before the rule keep their names; a lookup of one nobody could create finds none.
    assert parse(schemas.DeleteQueueRequest, {"queue_name": "old\x1bq"}).queue_name == "old\x1bq"


# -- relative delays ----------------------------------------------------------------------------------


def test_retry_in_enqueue_in_are_durations_beside_their_timestamps() -> None:
    retry = parse(schemas.RetryRequest, {"queue_name": "q", "items": [{"id": "a", "retryIn": "30s"}]})
    assert retry.to_domain() == [RetryRequest(id="a", retry_in=timedelta(seconds=30))]
    produce = parse(
        schemas.ProduceRequest, {"queue_name": "q", "items": [{"utf8": "x", "enqueue_in": "1m30s"}]}
    )
    assert produce.to_domain()[0].enqueue_in == timedelta(minutes=1, seconds=30)
    imported = parse(schemas.ImportItemsRequest, {"queue_name": "q", "items": [{"enqueue_in": "0"}]})
    assert imported.to_domain()[0].enqueue_in == timedelta(0)


@pytest.mark.parametrize(
    ("model", "item", "named"),
    [
        (schemas.RetryRequest, {"id": "a", "retry_in": "-30s"}, "items[0].retry_in: must not be negative"),
        (
            schemas.ProduceRequest,
            {"utf8": "x", "enqueue_in": "-1ms"},
            "items[0].enqueue_in: must not be negative",
        ),
        (schemas.ImportItemsRequest, {"enqueue_in": "-1h"}, "items[0].enqueue_in: must not be negative"),
        (schemas.RetryRequest, {"id": "a", "retry_in": "30"}, "items[0].retry_in: invalid duration"),
        (
            schemas.RetryRequest,
            {"id": "a", "retry_in": "30s", "retry_at": "2026-11-22T06:00:00Z"},
            "items[0]: give 'retry_at' or 'retry_in', not both",
        ),
        (
            schemas.ProduceRequest,
            {"utf8": "x", "enqueue_in": "30s", "enqueue_at": "2026-11-22T06:00:00Z"},
            "items[0]: give 'enqueue_at' or 'enqueue_in', not both",
        ),
        (
            schemas.ImportItemsRequest,
            {"enqueue_in": "30s", "enqueue_at": "2026-11-22T06:00:00Z"},
            "items[0]: give 'enqueue_at' or 'enqueue_in', not both",
        ),
    ],
)
def test_a_negative_delay_or_both_forms_are_a_400_naming_the_field(
    model: type[schemas.WireRequest], item: dict[str, object], named: str
) -> None:
    assert named in invalid(model, {"queue_name": "q", "items": [item]})


def test_an_item_the_domain_refuses_is_named_by_its_place() -> None:
    body = {"queue_name": "q", "items": [{"utf8": "ok"}, {"utf8": "x" * 1_048_577}]}
    with pytest.raises(InvalidRequestError, match=r"^items\[1\]: item payload is larger than 1048576 bytes$"):
        parse(schemas.ProduceRequest, body).to_domain()


def test_a_misspelt_key_gets_the_nearest_one() -> None:
    assert unsupported(schemas.ListQueuesRequest, b'{"limt": 5}').endswith(
        "limt: unknown key; did you mean 'limit'"
    )
    assert unsupported(
        schemas.RetryRequest, b'{"queueName": "q", "items": [{"id": "a", "retryAtt": "1s"}]}'
    ).endswith("items[0].retryAtt: unknown key; did you mean 'retry_at'")
    assert unsupported(schemas.ListQueuesRequest, b'{"zzz": 5}').endswith("zzz: unknown key")
