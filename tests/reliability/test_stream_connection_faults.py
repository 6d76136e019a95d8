"""The stream's connections table under the faults of ``tests.reliability.faults``.

On AWS a connection's credit lives in its row, and every push reserves credit, leases, then holds
what it leased (``querator.storage.dynamodb.connections``). Each of those writes must mean the same
when botocore sends it twice (``Fault.RETRIED``: the first reply was lost after the write applied):
a reserve taken twice leaves the connection without credit, and since it holds nothing, nothing ever
gives the credit back and the stream stops for good. And a push that dies between its reserve and
its hold (a lost reply the caller saw, or a Lambda timeout) must not keep the credit for ever.

The matrix at the end lives a connection (subscribe with credit 3, a push, a complete over the
stream, a credit message of 2) with each of its table calls failing in turn, by every kind of fault,
then lets the leases run out and the sweep run, and checks that the connection holds nothing and
has every credit its client gave exactly once.
"""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
from botocore.exceptions import BotoCoreError, ClientError
from moto import mock_aws

from querator.storage.dynamodb.connections import (
    RESERVATION_LIFETIME,
    DynamoDBConnections,
    connections_table_definition,
)
from querator.stream import protocol
from querator.stream.dispatch import Dispatcher
from querator.testing import FakeClock, dynamodb_client
from tests.reliability.faults import Fault, FaultInjector, LambdaTimeout

if TYPE_CHECKING:
    from collections.abc import Iterator

TABLE = "connections"
CID = "conn-1"
QUEUE = "jobs"
DEADLINE = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


class World:
    """One connections table, its store's client behind a fault injector, and a fake clock."""

    def __init__(self) -> None:
        client = dynamodb_client()
        client.create_table(**connections_table_definition(TABLE))
        self.client = client
        self.injector = FaultInjector()
        self.injector.attach(client)
        self.injector.disarm()
        self.clock = FakeClock(datetime(2026, 11, 26, 11, 0, tzinfo=UTC))
        self.connections = DynamoDBConnections(client, TABLE, now=self.clock.now)

    def credit(self) -> int:
        row = self.connections.get(CID)
        assert row is not None
        return row.credit

    def armed(self, fault: Fault, operation: str) -> None:
        self.injector.arm(None, fault, operation=operation)


@pytest.fixture
def world() -> Iterator[World]:
    with mock_aws():
        yield World()


def test_a_subscribe_retried_after_it_applied_is_the_callers_subscription(world: World) -> None:
    world.armed(Fault.RETRIED, "PutItem")
    assert world.connections.subscribe(CID, QUEUE, "client", 5)
    assert world.injector.fired
    world.injector.disarm()
    assert world.credit() == 5
    # Another subscribe on the connection is still refused.
    assert not world.connections.subscribe(CID, QUEUE, "client", 5)


def test_a_reserve_retried_after_it_applied_takes_the_credit_once(world: World) -> None:
    world.connections.subscribe(CID, QUEUE, "client", 5)
    world.armed(Fault.RETRIED, "UpdateItem")
    reservation = world.connections.reserve(CID, 5)
    assert world.injector.fired
    world.injector.disarm()
    assert reservation is not None
    assert world.credit() == 0
    # The push leased 3 of the 5: they are held and the 2 it did not use come back.
    assert world.connections.hold(CID, {"a": DEADLINE, "b": DEADLINE, "c": DEADLINE}, 2, reservation)
    assert world.credit() == 2
    assert world.connections.release(CID, ["a", "b", "c"]) == 3
    assert world.credit() == 5


def test_a_hold_retried_after_it_applied_gives_the_unused_credit_back_once(world: World) -> None:
    world.connections.subscribe(CID, QUEUE, "client", 5)
    reservation = world.connections.reserve(CID, 5)
    assert reservation is not None
    world.armed(Fault.RETRIED, "UpdateItem")
    assert world.connections.hold(CID, {"a": DEADLINE}, 4, reservation)
    assert world.injector.fired
    world.injector.disarm()
    row = world.connections.get(CID)
    assert row is not None
    assert (row.credit, list(row.held), row.reserved) == (4, ["a"], {})


def test_a_credit_message_retried_after_it_applied_grants_once(world: World) -> None:
    world.connections.subscribe(CID, QUEUE, "client", 2)
    world.armed(Fault.RETRIED, "UpdateItem")
    assert world.connections.add_credit(CID, 3, most=protocol.MAX_CREDIT)
    assert world.injector.fired
    world.injector.disarm()
    assert world.credit() == 5
    row = world.connections.get(CID)
    assert row is not None
    assert row.grants == ()  # the grant's token is gone once its call is over


def test_a_release_retried_after_it_applied_gives_the_credit_back_once(world: World) -> None:
    world.connections.subscribe(CID, QUEUE, "client", 2)
    reservation = world.connections.reserve(CID, 2)
    assert reservation is not None
    world.connections.hold(CID, {"a": DEADLINE, "b": DEADLINE}, 0, reservation)
    world.armed(Fault.RETRIED, "UpdateItem")
    world.connections.release(CID, ["a", "b"])
    assert world.injector.fired
    world.injector.disarm()
    assert world.credit() == 2


@pytest.mark.parametrize("death", ["reserve's reply lost", "timed out in the lease"])
def test_a_push_that_died_after_its_reserve_gives_the_credit_back_once_the_reservation_is_stale(
    world: World, death: str
) -> None:
    world.connections.subscribe(CID, QUEUE, "client", 3)
    leases: list[dict[str, Any]] = []
    dying = [death == "timed out in the lease"]

    def api(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if dying and dying.pop():
            raise LambdaTimeout("stopped in the lease")  # what it leased comes back by its lease
        if path.endswith("queue.lease"):
            leases.append(body)
        # Nothing to lease; the sweep's stats read failing too makes it pump (it cannot tell).
        return 454, {"code": 454, "message": "nothing to lease"}

    dispatcher = Dispatcher(world.connections, api, lambda _cid, _frame: True, now=world.clock.now)
    if death == "reserve's reply lost":
        # The reserve applied and its caller saw an error: the push ends before its lease and hold.
        world.armed(Fault.LOST_REPLY, "UpdateItem")
    with pytest.raises((LambdaTimeout, BotoCoreError)):
        dispatcher.pump(CID)
    world.injector.disarm()
    assert leases == []
    assert world.credit() == 0
    # A push soon after finds the credit taken by a push that may still be running: nothing to do.
    dispatcher.pump(CID)
    assert (world.credit(), leases) == (0, [])
    # Once no invocation can still be running, the minute's sweep gives the reservation back and
    # leases with it, though the client, waiting for items, sends nothing.
    world.clock.advance(RESERVATION_LIFETIME + timedelta(seconds=1))
    dispatcher.sweep()
    assert [lease["batch_size"] for lease in leases] == [3]
    assert world.credit() == 3
    row = world.connections.get(CID)
    assert row is not None
    assert row.reserved == {}


def test_a_row_written_before_reservations_existed_still_reserves(world: World) -> None:
    world.connections.subscribe(CID, QUEUE, "client", 2)
    # A connection subscribed by the previous version: no reservation or grant maps in its row.
    world.client.update_item(
        TableName=TABLE,
        Key={"cid": {"S": CID}},
        UpdateExpression="REMOVE #r, #g",
        ExpressionAttributeNames={"#r": "res", "#g": "grants"},
    )
    reservation = world.connections.reserve(CID, 2)
    assert reservation is not None
    assert world.connections.hold(CID, {}, 2, reservation)
    assert world.credit() == 2
    assert world.connections.add_credit(CID, 1, most=protocol.MAX_CREDIT)
    assert world.credit() == 3


# -- the matrix: a connection's life with a fault on each of its table's calls in turn --------------

#: A subscription with credit 3, a push of 2 items, one completed over the stream, a credit message
#: of 2: every write the connections table takes on the way.
INITIAL_CREDIT = 3
GRANT = 2
STEP_ERRORS = (BotoCoreError, ClientError, LambdaTimeout)


class FakeApi:
    """The HTTP API as the dispatcher calls it: leases hand out fresh items while any are left."""

    def __init__(self, clock: FakeClock, items: int) -> None:
        self.clock = clock
        self.left = items
        self.minted = 0

    def __call__(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if path.endswith("queue.lease"):
            count = min(self.left, body["batch_size"])
            if not count:
                return 454, {"code": 454, "message": "nothing to lease"}
            self.left -= count
            deadline = (self.clock.now() + timedelta(seconds=30)).isoformat().replace("+00:00", "Z")
            items = [{"id": f"item-{self.minted + n}", "lease_deadline": deadline} for n in range(count)]
            self.minted += count
            return 200, {"queue_name": QUEUE, "partition": 0, "items": items}
        if path.endswith("queue.stats"):
            return 500, {"code": 500, "message": "not here"}  # the sweep then pumps anyway
        return 200, {}


MESSAGES: tuple[dict[str, Any], ...] = (
    {"type": "subscribe", "queue_name": QUEUE, "credit": INITIAL_CREDIT},
    {"type": "complete", "request_id": "r1", "ids": ["item-0"]},
    {"type": "credit", "credit": GRANT},
)


def life(world: World, api: FakeApi) -> list[int]:
    """The connection's messages, each its own invocation (one failing does not stop the next);
    how many table calls had been made before each message."""
    dispatcher = Dispatcher(world.connections, api, lambda _cid, _frame: True, now=world.clock.now)
    starts = []
    for message in MESSAGES:
        starts.append(len(world.injector.calls))
        # The invocation failed; API Gateway logs it, the client's message goes unanswered.
        with contextlib.suppress(*STEP_ERRORS):
            dispatcher.message(CID, json.dumps(message))
    return starts


def _clean_life() -> tuple[list[str], int, int]:
    """The table calls of the life without faults, where the credit message starts, and the
    position of its grant."""
    with mock_aws():
        world = World()
        world.injector.arm(None, None)
        starts = life(world, FakeApi(world.clock, items=2))
        calls = list(world.injector.calls)
    # The credit message reads the subscription, add_credit reads the row, then writes the grant.
    grant = starts[2] + 2
    assert calls[starts[2] : grant + 1] == ["GetItem", "GetItem", "UpdateItem"]
    return calls, starts[2], grant


CLEAN_CALLS, CREDIT_MESSAGE, GRANT_POSITION = _clean_life()
#: Each kind once (the two throttling codes reach the caller alike).
FAULTS = [f for f in Fault if f is not Fault.THROTTLING]
#: Faults that stop a call before DynamoDB applies it.
NOT_APPLIED = frozenset({Fault.THROTTLED, Fault.INTERNAL, Fault.CONNECTION, Fault.LAMBDA_TIMEOUT})


@pytest.mark.slow  # about 40 s here: 17 calls x 6 faults, each a fresh table
@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
@pytest.mark.parametrize(
    "position", range(len(CLEAN_CALLS)), ids=[f"{i}-{call}" for i, call in enumerate(CLEAN_CALLS)]
)
def test_a_connection_keeps_its_credit_whatever_call_fails(world: World, fault: Fault, position: int) -> None:
    api = FakeApi(world.clock, items=2)
    world.injector.arm(position, fault)
    life(world, api)
    assert world.injector.fired
    world.injector.disarm()
    if world.connections.get(CID) is None:
        # Only a subscribe that never applied leaves no row; its client sees the error and
        # subscribes again.
        assert position == 0
        assert fault in NOT_APPLIED
        return
    # Heal: the items' leases run out, no invocation of the life can still be running, and the
    # minute's sweep gives back what is owed.
    world.clock.advance(RESERVATION_LIFETIME + timedelta(seconds=1))
    Dispatcher(world.connections, api, lambda _cid, _frame: True, now=world.clock.now).sweep()
    row = world.connections.get(CID)
    assert row is not None
    assert (row.held, row.reserved) == ({}, {})
    # Every credit the client gave is there once, and a write sent twice never counts twice. The
    # grant is missing only where the credit message failed before its write applied (a read that
    # failed, or the write stopped before DynamoDB): its client saw the message fail.
    expected = INITIAL_CREDIT + GRANT
    read_failed = CREDIT_MESSAGE <= position < GRANT_POSITION and fault is not Fault.RETRIED
    if read_failed or (position == GRANT_POSITION and fault in NOT_APPLIED):
        expected = INITIAL_CREDIT
    assert row.credit == expected
    assert len(row.grants) <= 1  # a grant whose call died before removing its token
