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
``res`` (M)
    Reservation token → credit, for every push between its reserve and its hold (usually empty).
``grants`` (M)
    Tokens of ``credit`` messages whose call has not ended yet (usually empty).
``sub`` (S)
    The token of the subscribe call that made the row.

Credit moves only by atomic ``ADD`` under a condition, so two dispatchers pushing to one connection
at once can never push more than its credit between them: each reserves before it leases.

Every write that moves credit also means the same when botocore sends it twice (its reply was lost
after it applied, and botocore retried): the write carries a token of its own call, and when the
retry fails its condition, the old row it is answered with (``ReturnValuesOnConditionCheckFailure``)
shows whether that token is already there. A reserve records its token with the credit it took, and
the push's hold removes it, so a push that died in between (a Lambda timeout) leaves a reservation
that a later push gives back once no invocation can still be running (``RESERVATION_LIFETIME``).
The tokens hold a write's time and live only until their call ends: the row does not grow with
traffic (docs/adr/0091-stream-on-aws.md).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Final

from botocore.exceptions import ClientError

from querator.storage.dynamodb import codec
from querator.storage.dynamodb.errors import error_code

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence

    from mypy_boto3_dynamodb import DynamoDBClient

CONNECTION_ID: Final = "cid"
QUEUE: Final = "q"
CLIENT_ID: Final = "client"
CREDIT: Final = "cr"
HELD: Final = "held"
TTL: Final = "ttl"
RESERVED: Final = "res"
GRANTS: Final = "grants"
SUBSCRIBER: Final = "sub"
BY_QUEUE_INDEX: Final = "by_queue"
#: API Gateway ends a WebSocket connection after 2 hours; a row outlives it by a margin.
ROW_LIFETIME_SECONDS: Final = 3 * 3600
_CONDITION_FAILED: Final = "ConditionalCheckFailedException"
#: Tries of a read-modify-write against concurrent dispatchers before giving up for this call.
_CONFLICT_TRIES: Final = 5
#: Lambda's longest timeout: a reservation or grant token older than this belongs to an invocation
#: that has ended, so no retry of its write can still come.
RESERVATION_LIFETIME: Final = timedelta(minutes=15)


@dataclass(frozen=True, slots=True)
class Subscription:
    """One connection's row."""

    connection_id: str
    queue_name: str
    client_id: str
    credit: int
    held: Mapping[str, datetime] = field(default_factory=dict)
    #: Reservation token → credit of the pushes between their reserve and their hold.
    reserved: Mapping[str, int] = field(default_factory=dict)
    #: Tokens of credit grants whose call may not have ended.
    grants: tuple[str, ...] = ()

    def expired(self, now: datetime) -> list[str]:
        """Held ids whose lease deadline has passed: the item went back to the queue."""
        return [item_id for item_id, deadline in self.held.items() if deadline <= now]

    def stale_reservations(self, now: datetime) -> dict[str, int]:
        """Reservations whose push cannot still be running: it died before its hold."""
        return {token: credit for token, credit in self.reserved.items() if _is_stale(token, now)}

    def owed(self, now: datetime) -> bool:
        """Whether credit is due back: a held lease ran out, or a push died holding a reservation."""
        return bool(self.expired(now) or self.stale_reservations(now))


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


def _token(now: datetime) -> str:
    """A write's own token: its time (epoch milliseconds, for staleness) and 12 random hex digits."""
    return f"{_millis(now):013d}.{uuid.uuid4().hex[:12]}"


def _is_stale(token: str, now: datetime) -> bool:
    written = _moment(token.partition(".")[0])
    return now - written > RESERVATION_LIFETIME


def _subscription(row: Mapping[str, Any]) -> Subscription:
    held = row.get(HELD, {}).get("M", {})
    return Subscription(
        connection_id=row[CONNECTION_ID]["S"],
        queue_name=row[QUEUE]["S"],
        client_id=row.get(CLIENT_ID, {}).get("S", ""),
        credit=int(row[CREDIT]["N"]),
        held={item_id: _moment(value["N"]) for item_id, value in held.items()},
        reserved={token: int(value["N"]) for token, value in row.get(RESERVED, {}).get("M", {}).items()},
        grants=tuple(row.get(GRANTS, {}).get("M", {})),
    )


def _old_row(error: ClientError) -> Mapping[str, Any]:
    """The row as it was when a conditional write failed (asked for with ``ALL_OLD``); empty when
    there was none."""
    return codec.returned(error.response, "Item") or {}


def _has_entry(row: Mapping[str, Any], attribute: str, token: str) -> bool:
    return token in row.get(attribute, {}).get("M", {})


class DynamoDBConnections:
    """The connections table through an injected boto3 client."""

    def __init__(
        self, client: DynamoDBClient, table: str, *, now: Callable[[], datetime] | None = None
    ) -> None:
        self._client = client
        self._table = table
        self._now = now or (lambda: datetime.now(timezone.utc))

    def subscribe(self, connection_id: str, queue_name: str, client_id: str, credit: int) -> bool:
        """Record the subscription; ``False`` when the connection is already subscribed."""
        token = _token(self._now())
        try:
            self._client.put_item(
                TableName=self._table,
                Item={
                    CONNECTION_ID: {"S": connection_id},
                    QUEUE: {"S": queue_name},
                    CLIENT_ID: {"S": client_id},
                    CREDIT: {"N": str(credit)},
                    HELD: {"M": {}},
                    RESERVED: {"M": {}},
                    GRANTS: {"M": {}},
                    SUBSCRIBER: {"S": token},
                    TTL: {"N": str(int(time.time()) + ROW_LIFETIME_SECONDS)},
                },
                ConditionExpression="attribute_not_exists(#cid)",
                ExpressionAttributeNames={"#cid": CONNECTION_ID},
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as error:
            if error_code(error) == _CONDITION_FAILED:
                # Ours when botocore sent this put again after its reply was lost.
                return bool(_old_row(error).get(SUBSCRIBER, {}).get("S") == token)
            raise
        return True

    def get(self, connection_id: str) -> Subscription | None:
        reply = self._client.get_item(
            TableName=self._table, Key={CONNECTION_ID: {"S": connection_id}}, ConsistentRead=True
        )
        row = codec.returned(reply, "Item")
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
            yield from (_subscription(row) for row in codec.rows(reply))
            start = codec.last_key(reply)
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
            yield from (_subscription(row) for row in codec.rows(reply) if QUEUE in row)
            start = codec.last_key(reply)
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
            now = self._now()
            token = _token(now)
            names = {"#cr": CREDIT, "#gr": GRANTS, "#tok": token}
            removes = []
            # Tokens left by calls that died before removing their own: no retry of theirs can come.
            for n, stale in enumerate(t for t in row.grants if _is_stale(t, now)):
                names[f"#s{n}"] = stale
                removes.append(f"#gr.#s{n}")
            applied = self._update(
                connection_id,
                "ADD #cr :n SET #gr.#tok = :one" + (f" REMOVE {', '.join(removes)}" if removes else ""),
                "#cr = :was AND attribute_not_exists(#gr.#tok)",
                names,
                {":n": {"N": str(grant)}, ":was": {"N": str(row.credit)}, ":one": {"N": "1"}},
                token_in=GRANTS,
            )
            if applied:
                # The grant's call is over: its token has nothing left to recognise.
                self._update(
                    connection_id,
                    "REMOVE #gr.#tok",
                    "attribute_exists(#cid)",
                    {"#gr": GRANTS, "#tok": token, "#cid": CONNECTION_ID},
                    None,
                )
                return True
        return False

    def reserve(self, connection_id: str, credit: int) -> str | None:
        """Take ``credit`` before leasing; the reservation's token for ``hold``, or ``None`` if the
        connection has less (or is gone)."""
        token = _token(self._now())
        applied = self._update(
            connection_id,
            "ADD #cr :minus SET #res.#tok = :n",
            "#cr >= :n AND attribute_not_exists(#res.#tok)",
            {"#cr": CREDIT, "#res": RESERVED, "#tok": token},
            {":minus": {"N": str(-credit)}, ":n": {"N": str(credit)}},
            token_in=RESERVED,
        )
        return token if applied else None

    def hold(self, connection_id: str, leased: Mapping[str, datetime], unused: int, reservation: str) -> bool:
        """After a lease: hold what was leased, give back the reserved credit it did not use, and end
        the reservation. ``False`` if the connection is gone."""
        names = {"#cr": CREDIT, "#res": RESERVED, "#tok": reservation} | ({"#held": HELD} if leased else {})
        values: dict[str, Any] = {":unused": {"N": str(unused)}}
        sets = []
        for n, (item_id, deadline) in enumerate(leased.items()):
            names[f"#i{n}"] = item_id
            values[f":d{n}"] = {"N": str(_millis(deadline))}
            sets.append(f"#held.#i{n} = :d{n}")
        expression = ("SET " + ", ".join(sets) + " " if sets else "") + "ADD #cr :unused REMOVE #res.#tok"
        old = self._send(connection_id, expression, "attribute_exists(#res.#tok)", names, values, old=True)
        # A row there without the reservation: only this hold removes it (a stale one is given back
        # only after the push's invocation has ended), so this is botocore's second send of a hold
        # that applied. No row: the connection is gone.
        return old is None or bool(old)

    def give_back(self, connection_id: str, reservations: Mapping[str, int]) -> None:
        """End reservations whose push died before its hold, returning their credit; each once."""
        for token, credit in reservations.items():
            self._update(
                connection_id,
                "ADD #cr :n REMOVE #res.#tok",
                "attribute_exists(#res.#tok)",
                {"#cr": CREDIT, "#res": RESERVED, "#tok": token},
                {":n": {"N": str(credit)}},
            )

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

    def _send(
        self,
        connection_id: str,
        expression: str,
        condition: str,
        names: dict[str, str],
        values: dict[str, Any] | None,
        *,
        old: bool = False,
    ) -> Mapping[str, Any] | None:
        """One conditional update: ``None`` when it applied; when its condition failed, the row as
        it was if ``old`` asked for it (empty when there was no row, or when not asked)."""
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "Key": {CONNECTION_ID: {"S": connection_id}},
            "UpdateExpression": expression,
            "ConditionExpression": condition,
            "ExpressionAttributeNames": names,
        }
        if values:
            kwargs["ExpressionAttributeValues"] = values
        if old:
            kwargs["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
        try:
            self._client.update_item(**kwargs)
        except ClientError as error:
            if error_code(error) == _CONDITION_FAILED:
                return _old_row(error)
            raise
        return None

    def _update(
        self,
        connection_id: str,
        expression: str,
        condition: str,
        names: dict[str, str],
        values: dict[str, Any] | None,
        *,
        token_in: str | None = None,
    ) -> bool:
        """One conditional update; ``False`` when its condition failed. With ``token_in``, the
        update writes its token (``#tok``) into that map attribute, and a failure whose old row
        already holds the token is this update's own second send: ``True``."""
        if token_in is None:
            return self._send(connection_id, expression, condition, names, values) is None
        # Without the map, setting a token in it would be a ValidationException: fail the condition
        # instead, and add the map below.
        condition = f"({condition}) AND attribute_exists(#tokens)"
        with_map = names | {"#tokens": token_in}
        for _ in range(2):
            old = self._send(connection_id, expression, condition, with_map, values, old=True)
            if old is None or _has_entry(old, token_in, names["#tok"]):
                return True
            if not old or token_in in old:
                return False
            # A row subscribed before this attribute existed: add the empty map, then again.
            self._send(
                connection_id,
                "SET #m = if_not_exists(#m, :empty)",
                "attribute_exists(#cid)",
                {"#m": token_in, "#cid": CONNECTION_ID},
                {":empty": {"M": {}}},
            )
        return False
