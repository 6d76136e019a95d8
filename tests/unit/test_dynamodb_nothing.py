"""The DynamoDB adapter reads every spelling of "nothing" a DynamoDB-compatible store sends.

AWS and moto leave a key out of a reply when there is nothing under it. LocalStack's DynamoDB
returns ``Attributes: {}`` for ``ReturnValues=ALL_OLD`` on a new item, which broke every produce
with an ``Idempotency-Key`` (``KeyError: 'part'`` in ``codec.decode_idempotency``); ``Item: {}``,
``Items`` absent, ``LastEvaluatedKey: {}``, ``UnprocessedItems: {}`` and ``Responses`` absent are
as valid to botocore's parser. The decoders are tested on each spelling; the store, the catalog and
the service on a moto client whose replies are rewritten into them (a botocore ``after-call`` hook),
and the idempotent produce also on botocore's ``Stubber``.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from botocore.stub import ANY, Stubber
from moto import mock_aws

from querator.domain.errors import QueueNotFoundError
from querator.domain.model import ClearScope, RetryRequest
from querator.ports import GroupLedger, IdempotencyRecord, PartitionHead
from querator.storage.dynamodb import codec
from querator.storage.dynamodb.store import DynamoDBItemStore
from querator.testing import build_service, dynamodb_client
from tests.contract.helpers import items, make_queue

if TYPE_CHECKING:
    from collections.abc import Iterator

    from querator.service import QueueService
    from querator.testing import FakeClock

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=timezone.utc)
ROW = {"pk": {"S": "q~0"}, "sk": {"S": "0" * 30}}
RECORD = IdempotencyRecord(
    key="k", partition=2, ids=["a" * 30, "b" * 30], done=True, started_at=NOW, queue_created_at=NOW
)

# -- the decoders -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply", [{}, {"Attributes": {}}, {"Attributes": None}], ids=["absent", "{}", "null"]
)
def test_no_returned_row_in_any_spelling_is_none(reply: dict[str, Any]) -> None:
    assert codec.returned(reply, "Attributes") is None
    assert codec.returned({k.replace("Attributes", "Item"): v for k, v in reply.items()}, "Item") is None


def test_a_returned_row_is_the_row() -> None:
    assert codec.returned({"Attributes": ROW}, "Attributes") == ROW


@pytest.mark.parametrize("reply", [{}, {"Items": []}, {"Items": None}], ids=["absent", "[]", "null"])
def test_no_rows_in_any_spelling_is_an_empty_list(reply: dict[str, Any]) -> None:
    assert codec.rows(reply) == []


@pytest.mark.parametrize(
    "reply", [{}, {"LastEvaluatedKey": {}}, {"LastEvaluatedKey": None}], ids=["absent", "{}", "null"]
)
def test_no_last_key_in_any_spelling_means_the_read_is_done(reply: dict[str, Any]) -> None:
    assert codec.last_key(reply) is None
    assert codec.last_key({"LastEvaluatedKey": ROW}) == ROW


@pytest.mark.parametrize(
    "reply",
    [{}, {"UnprocessedItems": {}}, {"UnprocessedItems": None}, {"UnprocessedItems": {"t": []}}],
    ids=["absent", "{}", "null", "table-empty"],
)
def test_nothing_unprocessed_in_any_spelling_is_an_empty_list(reply: dict[str, Any]) -> None:
    assert codec.table_part(reply, "UnprocessedItems", "t") == []
    assert codec.table_part({"Responses": reply.get("UnprocessedItems")}, "Responses", "t") == []


@pytest.mark.parametrize(
    "reply",
    [
        {},
        {"UnprocessedKeys": {}},
        {"UnprocessedKeys": None},
        {"UnprocessedKeys": {"t": {}}},
        {"UnprocessedKeys": {"t": {"Keys": []}}},
    ],
    ids=["absent", "{}", "null", "table-{}", "keys-[]"],
)
def test_no_unprocessed_keys_in_any_spelling_is_an_empty_list(reply: dict[str, Any]) -> None:
    assert codec.unprocessed_keys(reply, "t") == []


def test_unprocessed_keys_and_rows_are_read_when_there() -> None:
    assert codec.unprocessed_keys({"UnprocessedKeys": {"t": {"Keys": [ROW]}}}, "t") == [ROW]
    assert codec.table_part({"Responses": {"t": [ROW], "other": [{}]}}, "Responses", "t") == [ROW]


@pytest.mark.parametrize("attrs", [None, {}], ids=["None", "{}"])
def test_an_idempotency_record_of_nothing_is_none(attrs: dict[str, Any] | None) -> None:
    # {} raised KeyError: 'part', and every produce with an Idempotency-Key failed.
    assert codec.decode_idempotency("k", attrs) is None


def test_an_idempotency_record_round_trips() -> None:
    assert codec.decode_idempotency("k", codec.encode_idempotency("q", RECORD, NOW)) == RECORD


def test_an_empty_head_ledger_or_recount_is_the_empty_value() -> None:
    assert codec.decode_head({}) == PartitionHead()
    assert codec.decode_ledger({}) == GroupLedger()
    assert codec.decode_recount({}) is None
    assert codec.decode_recount({"M": {}}) is None


# -- the idempotent produce on botocore's Stubber ----------------------------------------------------


def test_begin_idempotent_takes_attributes_empty_as_no_previous_record() -> None:
    client = boto3.client(
        "dynamodb",
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
    )
    store = DynamoDBItemStore(client, "items", concurrency=1)
    pending = IdempotencyRecord(
        key="k", partition=0, ids=["a" * 30], done=False, started_at=NOW, queue_created_at=NOW
    )
    with Stubber(client) as stub:
        stub.add_response("put_item", {"Attributes": {}}, {"TableName": "items", "Item": ANY, **_ANY_PUT})
        began, previous = store.begin_idempotent(
            "q", pending, stale_before=NOW - timedelta(minutes=15), expires_at=NOW + timedelta(days=1)
        )
        stub.assert_no_pending_responses()
    assert (began, previous) == (True, None)


_ANY_PUT = {
    "ConditionExpression": ANY,
    "ExpressionAttributeNames": ANY,
    "ExpressionAttributeValues": ANY,
    "ReturnValues": "ALL_OLD",
    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
}


# -- the whole service on replies spelled as LocalStack spells them ----------------------------------


def _spell_nothing_as_empty(parsed: dict[str, Any], model: Any, **_: Any) -> None:
    """Rewrite a moto reply the way a DynamoDB-compatible store may send it: every "nothing" that
    moto leaves out becomes an empty value, and empty lists of rows are left out."""
    operation = model.name
    if operation in ("PutItem", "DeleteItem", "UpdateItem"):
        parsed.setdefault("Attributes", {})
    elif operation == "GetItem":
        parsed.setdefault("Item", {})
    elif operation in ("Query", "Scan"):
        if not parsed.get("Items"):
            parsed.pop("Items", None)
        parsed.setdefault("LastEvaluatedKey", {})
    elif operation == "BatchGetItem":
        if not any((parsed.get("Responses") or {}).values()):
            parsed.pop("Responses", None)
        parsed["UnprocessedKeys"] = parsed.get("UnprocessedKeys") or {}
    elif operation == "BatchWriteItem":
        parsed["UnprocessedItems"] = parsed.get("UnprocessedItems") or {}
    if parsed.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
        parsed.setdefault("Item", {})


def _refuse_an_empty_start_key(params: dict[str, Any], **_: Any) -> None:
    # DynamoDB refuses it ("The provided starting key is invalid"); moto reads from the start.
    if params.get("ExclusiveStartKey") == {}:
        raise AssertionError("ExclusiveStartKey {}: an empty LastEvaluatedKey was taken for more to read")


@pytest.fixture
def spelled(clock: FakeClock) -> Iterator[QueueService]:
    """A service on moto whose store and catalog clients get every reply rewritten."""
    with mock_aws():
        client = dynamodb_client()
        client.meta.events.register("after-call.dynamodb.*", _spell_nothing_as_empty)
        client.meta.events.register("provide-client-params.dynamodb.*", _refuse_an_empty_start_key)
        service = build_service(client, clock=clock)
        catalog_client = service.catalog._model._get_connection().connection.client  # type: ignore[attr-defined]
        catalog_client.meta.events.register("after-call.dynamodb.*", _spell_nothing_as_empty)
        yield service


def test_an_idempotent_produce_and_its_replay_work_on_attributes_empty(spelled: QueueService) -> None:
    make_queue(spelled, "jobs")

    first = spelled.produce("jobs", items("a", "b"), idempotency_key="k1")
    again = spelled.produce("jobs", items("a", "b"), idempotency_key="k1")

    assert (first.replayed, again.replayed) == (False, True)
    assert again.ids == first.ids
    assert [i.payload for i in spelled.list_items("jobs", 0)] == [b"a", b"b"]


def test_every_call_works_on_replies_that_spell_nothing_as_empty(
    spelled: QueueService, clock: FakeClock
) -> None:
    make_queue(spelled, "dead")
    make_queue(spelled, "jobs", dead_queue="dead", max_attempts=2)
    spelled.produce("jobs", items(*(f"p{i}" for i in range(30))))  # more than one BatchWriteItem

    lease = spelled.lease("jobs", batch_size=4, client_id="c", timeout=timedelta(0))
    first, second, third, fourth = (i.id for i in lease.items)
    assert spelled.renew("jobs", 0, [first]).items[0].id == first
    assert spelled.complete("jobs", 0, [first, "0" * 30]).applied == [first]
    assert spelled.retry("jobs", 0, [RetryRequest(id=second)]).applied == [second]
    assert spelled.retry("jobs", 0, [RetryRequest(id=third, dead=True)]).applied == [third]
    spelled.delete_items("jobs", 0, [fourth])

    assert [i.payload for i in spelled.list_items("dead", 0)] == [b"p2"]
    assert len(spelled.list_items("jobs", 0)) == 27
    assert sum(p.total for p in spelled.stats("jobs")) == 27
    # Past expire_timeout: the reaper dead-letters the 27 left, and deletes p2 (a dead letter that
    # outlived the dead-letter queue's own expire_timeout), as it does on moto's own replies.
    clock.advance(timedelta(hours=2))
    report = spelled.reap(now=clock.now(), time_budget=timedelta(seconds=20))
    assert (report.finished, report.dead_lettered) == (True, 27)
    assert spelled.list_items("jobs", 0) == []
    assert spelled.clear("dead", ClearScope.QUEUE) == 27
    spelled.delete_queue("jobs")
    with pytest.raises(QueueNotFoundError):
        spelled.get_queue("jobs")


def test_the_catalog_lists_each_queue_once_when_the_last_page_has_an_empty_key(spelled: QueueService) -> None:
    # PynamoDB takes LastEvaluatedKey {} for "more to read" and queries again from the start.
    for name in ("a", "b", "c"):
        make_queue(spelled, name)

    assert [q.name for q in spelled.list_queues()] == ["a", "b", "c"]
    assert [q.name for q in spelled.list_queues(pivot="b", limit=10)] == ["b", "c"]
    assert [q.name for q in spelled.catalog.iterate()] == ["a", "b", "c"]
    with pytest.raises(QueueNotFoundError):
        spelled.get_queue("missing")  # Item: {}
