"""Storage layer: the stream connections of a deployed stack, one row per WebSocket connection.

On AWS no process lives as long as a connection, so what ``querator.stream.session`` keeps in memory
locally (the subscription, the credit, the items held) is a row of its own table
(docs/adr/0091-stream-on-aws.md):

``cid`` (S, hash)
    The API Gateway connection id.
``q`` (S)
    The queue subscribed to; also the hash key of the sparse index ``by_queue`` (range ``cid``), so
    the dispatcher finds a queue's subscribers with one Query and never reads the others.
``client`` (S), ``cr`` (N)
    The client id leases are made under, and the credit not yet used.
``held`` (M)
    Item id → lease deadline (epoch milliseconds) of every item pushed and not yet settled; its
    size is bounded by the credit (at most 1,000 entries, ~50 KB).
``ttl`` (N)
    Epoch seconds after which DynamoDB may drop a row whose ``$disconnect`` never came (API Gateway
    closes every connection after two hours).

Credit moves only by atomic ``ADD`` under a condition, so two dispatchers pushing to one connection
at once can never push more than its credit between them: each reserves before it leases.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Final

from botocore.exceptions import ClientError

from querator.storage.dynamodb.errors import error_code

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

    from mypy_boto3_dynamodb import DynamoDBClient

CONNECTION_ID: Final = "cid"
QUEUE: Final = "q"
CLIENT_ID: Final = "client"
CREDIT: Final = "cr"
HELD: Final = "held"
TTL: Final = "ttl"
BY_QUEUE_INDEX: Final = "by_queue"
#: API Gateway ends a WebSocket connection after 2 hours; a row outlives it by a margin.
ROW_LIFETIME_SECONDS: Final = 3 * 3600
_CONDITION_FAILED: Final = "ConditionalCheckFailedException"
#: Tries of a read-modify-write against concurrent dispatchers before giving up for this call.
_CONFLICT_TRIES: Final = 5


@dataclass(frozen=True, slots=True)
class Subscription:
    """One connection's row."""

    connection_id: str
    queue_name: str
    client_id: str
    credit: int
    held: Mapping[str, datetime] = field(default_factory=dict)

    def expired(self, now: datetime) -> list[str]:
        """Held ids whose lease deadline has passed: the item went back to the queue."""
        return [item_id for item_id, deadline in self.held.items() if deadline <= now]


def connections_table_definition(table_name: str) -> dict[str, Any]:
    """``CreateTable`` arguments for the connections table (on-demand), for tests and local use."""
    return {
        "TableName": table_name,
        "AttributeDefinitions": [
            {"AttributeName": CONNECTION_ID, "AttributeType": "S"},
            {"AttributeName": QUEUE, "AttributeType": "S"},
        ],
        "KeySchema": [{"AttributeName": CONNECTION_ID, "KeyType": "HASH"}],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": BY_QUEUE_INDEX,
                "KeySchema": [
                    {"AttributeName": QUEUE, "KeyType": "HASH"},
                    {"AttributeName": CONNECTION_ID, "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            }
        ],
        "BillingMode": "PAY_PER_REQUEST",
    }


def _millis(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _moment(millis: str) -> datetime:
    return datetime.fromtimestamp(int(millis) / 1000, tz=timezone.utc)


def _subscription(row: Mapping[str, Any]) -> Subscription:
    held = row.get(HELD, {}).get("M", {})
    return Subscription(
        connection_id=row[CONNECTION_ID]["S"],
        queue_name=row[QUEUE]["S"],
        client_id=row.get(CLIENT_ID, {}).get("S", ""),
        credit=int(row[CREDIT]["N"]),
        held={item_id: _moment(value["N"]) for item_id, value in held.items()},
    )


class DynamoDBConnections:
    """The connections table through an injected boto3 client."""

    def __init__(self, client: DynamoDBClient, table: str) -> None:
        self._client = client
        self._table = table

    def subscribe(self, connection_id: str, queue_name: str, client_id: str, credit: int) -> bool:
        """Record the subscription; ``False`` when the connection is already subscribed."""
        try:
            self._client.put_item(
                TableName=self._table,
                Item={
                    CONNECTION_ID: {"S": connection_id},
                    QUEUE: {"S": queue_name},
                    CLIENT_ID: {"S": client_id},
                    CREDIT: {"N": str(credit)},
                    HELD: {"M": {}},
                    TTL: {"N": str(int(time.time()) + ROW_LIFETIME_SECONDS)},
                },
                ConditionExpression="attribute_not_exists(#cid)",
                ExpressionAttributeNames={"#cid": CONNECTION_ID},
            )
        except ClientError as error:
            if error_code(error) == _CONDITION_FAILED:
                return False
            raise
        return True

    def get(self, connection_id: str) -> Subscription | None:
        reply = self._client.get_item(
            TableName=self._table, Key={CONNECTION_ID: {"S": connection_id}}, ConsistentRead=True
        )
        row = reply.get("Item")
        return _subscription(row) if row else None

    def subscribers(self, queue_name: str) -> Iterator[Subscription]:
        """The connections subscribed to ``queue_name`` (the index is eventually consistent: a
        subscription a moment old may be missed; its own subscribe pushes what is there)."""
        start: dict[str, Any] | None = None
        while True:
            kwargs: dict[str, Any] = {
                "TableName": self._table,
                "IndexName": BY_QUEUE_INDEX,
                "KeyConditionExpression": "#q = :q",
                "ExpressionAttributeNames": {"#q": QUEUE},
                "ExpressionAttributeValues": {":q": {"S": queue_name}},
            }
            if start:
                kwargs["ExclusiveStartKey"] = start
            reply = self._client.query(**kwargs)
            yield from (_subscription(row) for row in reply.get("Items", []))
            start = reply.get("LastEvaluatedKey")
            if not start:
                return

    def all(self) -> Iterator[Subscription]:
        """Every subscription (the timed sweep: items that became ready by time write nothing)."""
        start: dict[str, Any] | None = None
        while True:
            kwargs: dict[str, Any] = {"TableName": self._table}
            if start:
                kwargs["ExclusiveStartKey"] = start
            reply = self._client.scan(**kwargs)
            yield from (_subscription(row) for row in reply.get("Items", []) if QUEUE in row)
            start = reply.get("LastEvaluatedKey")
            if not start:
                return

    def add_credit(self, connection_id: str, credit: int, *, most: int) -> bool:
        """Give ``credit`` back, never past ``most`` credit + held; ``False`` if not subscribed."""
        for _ in range(_CONFLICT_TRIES):
            row = self.get(connection_id)
            if row is None:
                return False
            grant = min(credit, most - row.credit - len(row.held))
            if grant <= 0:
                return True
            if self._update(
                connection_id,
                "ADD #cr :n",
                "#cr = :was",
                {"#cr": CREDIT},
                {":n": {"N": str(grant)}, ":was": {"N": str(row.credit)}},
            ):
                return True
        return False

    def reserve(self, connection_id: str, credit: int) -> bool:
        """Take ``credit`` before leasing; ``False`` if the connection has less (or is gone)."""
        return self._update(
            connection_id,
            "ADD #cr :minus",
            "#cr >= :n",
            {"#cr": CREDIT},
            {":minus": {"N": str(-credit)}, ":n": {"N": str(credit)}},
        )

    def hold(self, connection_id: str, leased: Mapping[str, datetime], unused: int) -> bool:
        """After a lease: hold what was leased, give back the reserved credit it did not use."""
        names = {"#cr": CREDIT} | ({"#held": HELD} if leased else {})
        values: dict[str, Any] = {":unused": {"N": str(unused)}}
        sets = []
        for n, (item_id, deadline) in enumerate(leased.items()):
            names[f"#i{n}"] = item_id
            values[f":d{n}"] = {"N": str(_millis(deadline))}
            sets.append(f"#held.#i{n} = :d{n}")
        expression = ("SET " + ", ".join(sets) + " " if sets else "") + "ADD #cr :unused"
        return self._update(connection_id, expression, "attribute_exists(#cr)", names, values)

    def release(self, connection_id: str, ids: Sequence[str]) -> int:
        """Stop holding ``ids`` (settled, or their leases ran out) and give their credit back; returns
        how many were held. Each id is released once, whoever releases it."""
        for _ in range(_CONFLICT_TRIES):
            row = self.get(connection_id)
            if row is None:
                return 0
            held = [item_id for item_id in dict.fromkeys(ids) if item_id in row.held]
            if not held:
                return 0
            names = {"#cr": CREDIT, "#held": HELD}
            removes, conditions = [], []
            for n, item_id in enumerate(held):
                names[f"#i{n}"] = item_id
                removes.append(f"#held.#i{n}")
                conditions.append(f"attribute_exists(#held.#i{n})")
            if self._update(
                connection_id,
                f"REMOVE {', '.join(removes)} ADD #cr :n",
                " AND ".join(conditions),
                names,
                {":n": {"N": str(len(held))}},
            ):
                return len(held)
        return 0

    def renewed(self, connection_id: str, deadlines: Mapping[str, datetime]) -> None:
        """New lease deadlines of held items (renewed over the stream); ids no longer held are left.
        One update for all of them; one per id only when some were released meanwhile."""
        if not deadlines:
            return
        names = {"#held": HELD}
        values: dict[str, Any] = {}
        sets, conditions = [], []
        for n, (item_id, deadline) in enumerate(deadlines.items()):
            names[f"#i{n}"] = item_id
            values[f":d{n}"] = {"N": str(_millis(deadline))}
            sets.append(f"#held.#i{n} = :d{n}")
            conditions.append(f"attribute_exists(#held.#i{n})")
        if self._update(connection_id, "SET " + ", ".join(sets), " AND ".join(conditions), names, values):
            return
        if len(deadlines) == 1:
            return
        for item_id, deadline in deadlines.items():
            self.renewed(connection_id, {item_id: deadline})

    def delete(self, connection_id: str) -> None:
        self._client.delete_item(TableName=self._table, Key={CONNECTION_ID: {"S": connection_id}})

    def _update(
        self,
        connection_id: str,
        expression: str,
        condition: str,
        names: dict[str, str],
        values: dict[str, Any],
    ) -> bool:
        try:
            self._client.update_item(
                TableName=self._table,
                Key={CONNECTION_ID: {"S": connection_id}},
                UpdateExpression=expression,
                ConditionExpression=condition,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
            )
        except ClientError as error:
            if error_code(error) == _CONDITION_FAILED:
                return False
            raise
        return True
