"""The DynamoDB item store's group lanes and group ledgers (fair delivery), on moto in process.

Lane rows (``~R<lane>``) and ledger rows (``~S<g>``) live under the partition's key; FIFO queues
(no group lane) must not send a single request that touches them.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import pytest
from moto import mock_aws

from querator.domain.model import Item
from querator.domain.priority import lane_of
from querator.ports import GroupLedger, Guard, Move, PartitionHead
from querator.service.tuning import BAND_IDLE
from querator.storage.dynamodb import schema
from querator.storage.dynamodb.lanes import REGISTRATION_REUSE
from querator.storage.dynamodb.store import DynamoDBItemStore
from querator.testing import dynamodb_client

if TYPE_CHECKING:
    from collections.abc import Iterator

    from mypy_boto3_dynamodb import DynamoDBClient

TABLE = "lanes-items"
NOW = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)
G1, G2, G3 = "0" * 16, "5a" * 8, "f" * 16


@dataclass
class Rig:
    store: DynamoDBItemStore
    client: DynamoDBClient
    #: Every request sent: (operation, parameters).
    calls: list[tuple[str, dict[str, Any]]]

    def rows(self, prefix: str) -> list[str]:
        """Sort keys of the table's rows that start with ``prefix``."""
        found = self.client.scan(TableName=TABLE).get("Items", [])
        return sorted(str(a["sk"]["S"]) for a in found if str(a["sk"]["S"]).startswith(prefix))

    def operations(self) -> list[str]:
        return [name for name, _ in self.calls]


@pytest.fixture(params=["moto"])
def rig(request: pytest.FixtureRequest) -> Iterator[Rig]:
    with mock_aws():
        client = dynamodb_client()
        client.create_table(**schema.items_table_definition(TABLE))
        calls: list[tuple[str, dict[str, Any]]] = []

        def record(params: dict[str, Any], model: Any, **_: Any) -> None:
            calls.append((model.name, copy.deepcopy(params)))

        client.meta.events.register("provide-client-params.dynamodb.*", record)
        yield Rig(DynamoDBItemStore(client, TABLE, concurrency=1), client, calls)


def fair_id(band: str, group: str, n: int) -> str:
    return f"{band}g{group}{n:030x}"


def item(item_id: str, **changes: Any) -> Item:
    return Item(
        id=item_id,
        payload=b"x",
        expire_deadline=NOW + timedelta(days=1),
        created_at=NOW,
        **changes,
    )


def head(rig: Rig, partition: int = 0, queue: str = "q") -> PartitionHead:
    return rig.store.head(queue, partition, now=NOW)[0]


def lane_names(rig: Rig, band: str, *, after: str = "", limit: int = 100) -> list[str]:
    return [lane.lane for lane in rig.store.lanes("q", 0, band, after=after, limit=limit)]


# -- registration ---------------------------------------------------------------------------------


def test_registration_writes_a_row_per_group_lane_and_marks_the_head(rig: Rig) -> None:
    ids = [fair_id("", G1, 1), fair_id("", G1, 2), fair_id(".3", G2, 1), f"{1:030x}", f".3{1:030x}"]

    rig.store.register_bands("q", 0, ids, now=NOW)

    # One head update (bands and ``gl`` together) and one per distinct group lane.
    assert rig.operations() == ["UpdateItem"] * 3
    assert rig.rows("~R") == [f"~R.3g{G2}", f"~Rg{G1}"]
    found = head(rig)
    assert found.has_lanes
    assert dict(found.band_registered) == {".3": NOW}  # lanes are not in the head row
    assert [
        (lane.lane, lane.cursor, lane.registered) for lane in rig.store.lanes("q", 0, "", after="", limit=5)
    ] == [(f"g{G1}", f"g{G1}0", NOW)]


def test_priority_5_lanes_alone_still_set_has_lanes(rig: Rig) -> None:
    rig.store.register_bands("q", 0, [fair_id("", G3, 1)], now=NOW)

    assert head(rig).has_lanes
    assert dict(head(rig).band_registered) == {}
    assert lane_names(rig, "") == [f"g{G3}"]


def test_registering_again_moves_the_registration_time_once_the_last_one_is_not_fresh(rig: Rig) -> None:
    rig.store.register_bands("q", 0, [fair_id(".1", G1, 1)], now=NOW)
    soon = NOW + timedelta(minutes=3)
    rig.store.register_bands("q", 0, [fair_id(".1", G1, 9)], now=soon)  # reused: no write
    assert [lane.registered for lane in rig.store.lanes("q", 0, ".1", after="", limit=5)] == [NOW]

    later = NOW + timedelta(minutes=6)
    rig.store.register_bands("q", 0, [fair_id(".1", G1, 9)], now=later)
    assert [lane.registered for lane in rig.store.lanes("q", 0, ".1", after="", limit=5)] == [later]


# -- lanes ----------------------------------------------------------------------------------------


def test_lanes_are_a_bands_own_in_key_order_from_after_a_given_lane(rig: Rig) -> None:
    bands = ["", ".3", "p7"]
    ids = [fair_id(band, group, 1) for band in bands for group in (G3, G1, G2)]
    # Plain items of the same bands register no lane.
    rig.store.register_bands("q", 0, [*ids, f"{1:030x}", f".3{1:030x}", f"p7{1:030x}"], now=NOW)
    rig.store.register_bands("other", 0, [fair_id("", "1" * 16, 1)], now=NOW)

    for band in bands:
        lanes = [f"{band}g{group}" for group in (G1, G2, G3)]
        assert lane_names(rig, band) == lanes
        assert lane_names(rig, band, after=lanes[0]) == lanes[1:]
        assert lane_names(rig, band, after=lanes[1]) == lanes[2:]
        assert lane_names(rig, band, after=lanes[2]) == []
        assert lane_names(rig, band, limit=2) == lanes[:2]
        assert lane_names(rig, band, after=lanes[0], limit=1) == [lanes[1]]
    # A lane of another band as ``after``: every lane of this band after it in key order.
    assert lane_names(rig, "p7", after=f".3g{G3}") == [f"p7g{g}" for g in (G1, G2, G3)]
    assert lane_names(rig, ".3", after=f"p7g{G1}") == []
    assert lane_names(rig, ".0") == []


def test_lanes_is_one_consistent_query(rig: Rig) -> None:
    rig.store.register_bands("q", 0, [fair_id(".3", G1, 1)], now=NOW)
    rig.calls.clear()

    rig.store.lanes("q", 0, ".3", after="", limit=10)

    ((name, params),) = rig.calls
    assert name == "Query"
    assert params["ConsistentRead"] is True
    assert params["Limit"] == 10


# -- cursors, sweeps, rings ---------------------------------------------------------------------


def test_note_leased_moves_a_lane_cursor_and_the_ring(rig: Rig) -> None:
    first, second = fair_id(".3", G1, 1), fair_id(".3", G2, 1)
    rig.store.register_bands("q", 0, [first, second], now=NOW)
    rig.calls.clear()

    rig.store.note_leased("q", 0, [item(first)], cursor=first + "0", ring=(".3", f".3g{G1}"))

    assert sorted(rig.operations()) == ["UpdateItem", "UpdateItem"]  # the head and the lane row
    found = head(rig)
    assert found.leased == 1
    assert dict(found.rings) == {".3": f".3g{G1}"}
    assert found.cursor == ""
    assert dict(found.band_cursors) == {}  # the lane's cursor is on its row
    assert {lane.lane: lane.cursor for lane in rig.store.lanes("q", 0, ".3", after="", limit=5)} == {
        f".3g{G1}": first + "0",
        f".3g{G2}": f".3g{G2}0",
    }

    rig.store.note_leased("q", 0, [], cursor=None, ring=("", f"g{G3}"))
    assert dict(head(rig).rings) == {".3": f".3g{G1}", "": f"g{G3}"}


def test_a_lane_cursor_alone_writes_only_the_lane_row(rig: Rig) -> None:
    lane_id = fair_id("", G1, 1)
    rig.store.register_bands("q", 0, [lane_id], now=NOW)
    rig.calls.clear()

    rig.store.note_leased("q", 0, [], cursor=lane_id)

    ((name, params),) = rig.calls
    assert (name, params["Key"]["sk"]["S"]) == ("UpdateItem", f"~Rg{G1}")


def test_cursor_and_sweep_never_bring_back_a_dropped_lane(rig: Rig) -> None:
    lane_id = fair_id(".2", G1, 1)
    rig.store.register_bands("q", 0, [lane_id], now=NOW)
    assert rig.store.drop_band("q", 0, f".2g{G1}", registered_before=NOW + timedelta(seconds=1))

    rig.store.note_leased("q", 0, [], cursor=lane_id)
    rig.store.set_sweep("q", 0, lane_id)

    assert rig.rows("~R") == []


def test_with_lanes_adds_every_lane_to_the_band_maps(rig: Rig) -> None:
    a, b, c = fair_id("", G1, 1), fair_id(".3", G2, 1), fair_id("p7", G3, 1)
    rig.store.register_bands("q", 0, [a, b, f".3{1:030x}"], now=NOW)
    rig.store.register_bands("q", 0, [c], now=NOW + timedelta(seconds=5))
    rig.store.note_leased("q", 0, [], cursor=f".3{5:030x}")
    rig.store.note_leased("q", 0, [], cursor=a)
    rig.store.set_sweep("q", 0, b)
    plain = head(rig)
    rig.calls.clear()

    merged = rig.store.with_lanes("q", 0, plain)

    assert rig.operations() == ["Query"]
    assert dict(merged.band_registered) == {
        ".3": NOW,
        f"g{G1}": NOW,
        f".3g{G2}": NOW,
        "p7": NOW + timedelta(seconds=5),
        f"p7g{G3}": NOW + timedelta(seconds=5),
    }
    assert dict(merged.band_cursors) == {".3": f".3{5:030x}", f"g{G1}": a}
    assert dict(merged.band_sweeps) == {f".3g{G2}": b}
    assert merged.cursor_in(f"g{G1}") == a
    assert merged.cursor_in(f"p7g{G3}") == f"p7g{G3}0"
    assert merged.sweep_in(f".3g{G2}") == b
    assert merged.leasable_lanes() == [".3", f".3g{G2}", "", f"g{G1}", "p7", f"p7g{G3}"]
    assert (merged.has_lanes, merged.items, merged.version) == (plain.has_lanes, plain.items, plain.version)


def test_with_lanes_of_a_partition_without_lanes_sends_nothing(rig: Rig) -> None:
    rig.store.register_bands("q", 0, [f".3{1:030x}"], now=NOW)
    plain = head(rig)
    rig.calls.clear()

    assert rig.store.with_lanes("q", 0, plain) == plain
    assert rig.calls == []


# -- dropping lanes -------------------------------------------------------------------------------


def test_drop_band_of_a_lane_respects_registered_before(rig: Rig) -> None:
    lane = f".4g{G1}"
    rig.store.register_bands("q", 0, [fair_id(".4", G1, 1), fair_id(".4", G2, 1)], now=NOW)

    assert not rig.store.drop_band("q", 0, lane, registered_before=NOW)  # registered at NOW: not before
    assert lane_names(rig, ".4") == [lane, f".4g{G2}"]
    assert rig.store.drop_band("q", 0, lane, registered_before=NOW + timedelta(seconds=1))
    assert lane_names(rig, ".4") == [f".4g{G2}"]
    assert not rig.store.drop_band("q", 0, lane, registered_before=NOW + timedelta(seconds=1))  # gone
    # The band and ``has_lanes`` stay: the band's own registration is the head row's.
    assert dict(head(rig).band_registered) == {".4": NOW}
    assert head(rig).has_lanes

    # The reaper's re-registration (the lane's start) brings it back.
    rig.store.register_bands("q", 0, [lane + "0"], now=NOW + timedelta(seconds=2))
    assert lane_names(rig, ".4") == [lane, f".4g{G2}"]


def test_drop_band_of_a_band_is_unchanged(rig: Rig) -> None:
    rig.store.register_bands("q", 0, [f"p9{1:030x}"], now=NOW)

    assert not rig.store.drop_band("q", 0, "p9", registered_before=NOW)
    assert rig.store.drop_band("q", 0, "p9", registered_before=NOW + timedelta(seconds=1))
    assert dict(head(rig).band_registered) == {}


# -- group ledgers --------------------------------------------------------------------------------


def test_claim_in_group_holds_only_at_the_ledgers_version(rig: Rig) -> None:
    ids = [fair_id(".3", G1, n) for n in (1, 2, 3)]
    other_band = fair_id("", G1, 4)  # same group, another priority: the same ledger
    rig.store.put_new("q", 0, [item(i) for i in [*ids, other_band]], now=NOW)
    deadline = NOW + timedelta(minutes=1)
    group = f"g{G1}"

    assert rig.store.group_ledgers("q", 0, [group]) == {group: GroupLedger()}

    won = rig.store.claim_in_group("q", 0, ids[0], version=0, forget=[], lease_deadline=deadline, now=NOW)
    assert won is not None
    assert (won.id, won.lease_deadline, won.attempts, won.payload) == (ids[0], deadline, 1, b"x")
    assert rig.store.group_ledgers("q", 0, [group]) == {
        group: GroupLedger(version=1, leases={ids[0]: deadline})
    }

    # A stale version: nothing written, the item stays unleased.
    assert (
        rig.store.claim_in_group("q", 0, ids[1], version=0, forget=[], lease_deadline=deadline, now=NOW)
        is None
    )
    stale = rig.store.get("q", 0, ids[1])
    assert stale is not None
    assert stale.lease_deadline is None
    # An item already claimed: the ledger does not move.
    assert (
        rig.store.claim_in_group("q", 0, ids[0], version=1, forget=[], lease_deadline=deadline, now=NOW)
        is None
    )
    assert rig.store.group_ledgers("q", 0, [group])[group].version == 1
    # An item that expired is the reaper's.
    late = NOW + timedelta(days=2)
    assert (
        rig.store.claim_in_group("q", 0, ids[2], version=1, forget=[], lease_deadline=late, now=late) is None
    )

    # The right version, dropping an ended lease from the ledger.
    later = deadline + timedelta(minutes=1)
    won = rig.store.claim_in_group(
        "q", 0, other_band, version=1, forget=[ids[0]], lease_deadline=later, now=NOW
    )
    assert won is not None
    assert won.id == other_band
    assert rig.store.group_ledgers("q", 0, [group, "g" + G2]) == {
        group: GroupLedger(version=2, leases={other_band: later}),
        "g" + G2: GroupLedger(),
    }
    assert rig.rows("~S") == [f"~Sg{G1}"]


def test_forget_leases_removes_entries_without_moving_the_version(rig: Rig) -> None:
    ids = [fair_id("p6", G2, n) for n in (1, 2, 3)]
    rig.store.put_new("q", 0, [item(i) for i in ids], now=NOW)
    deadline = NOW + timedelta(minutes=1)
    for version, item_id in enumerate(ids):
        assert rig.store.claim_in_group(
            "q", 0, item_id, version=version, forget=[], lease_deadline=deadline, now=NOW
        )
    rig.calls.clear()

    rig.store.forget_leases("q", 0, [ids[0], ids[2], f"{1:030x}", fair_id("", G3, 1)])

    # One update per ledger row; a group without a ledger row gets none created.
    assert rig.operations() == ["UpdateItem", "UpdateItem"]
    assert rig.store.group_ledgers("q", 0, ["g" + G2]) == {
        "g" + G2: GroupLedger(version=3, leases={ids[1]: deadline})
    }
    assert rig.rows("~S") == [f"~Sg{G2}"]


def test_forget_leases_of_plain_ids_sends_nothing(rig: Rig) -> None:
    rig.store.forget_leases("q", 0, [f"{1:030x}", f".3{1:030x}"])
    assert rig.calls == []


def test_lane_and_ledger_rows_sort_after_the_lease_records(rig: Rig) -> None:
    lane_id = fair_id("", G1, 1)
    rig.store.put_new("q", 0, [item(lane_id)], now=NOW)
    assert rig.store.claim_in_group(
        "q", 0, lane_id, version=0, forget=[], lease_deadline=NOW + timedelta(minutes=1), now=NOW
    )
    key = rig.store.record_lease("q", 0, [lane_id], deadline=NOW - timedelta(seconds=1))

    found, records = rig.store.head("q", 0, now=NOW, records=1)

    assert [r.key for r in records] == [key]
    assert found.has_lanes


def test_a_move_into_a_group_lane_registers_it(rig: Rig) -> None:
    source = item(f"{1:030x}", lease_deadline=NOW - timedelta(seconds=1))
    rig.store.put_new("q", 0, [source], now=NOW)
    target = item(fair_id("", G2, 7))

    moved = rig.store.move(
        "q",
        0,
        [Move(item=source, target_queue="dlq", target_partition=1, replacement=target)],
        guard=Guard.LEASE_EXPIRED,
        now=NOW,
    )

    assert moved.applied == [source.id]
    assert [lane.lane for lane in rig.store.lanes("dlq", 1, "", after="", limit=5)] == [lane_of(target.id)]
    assert head(rig, 1, "dlq").has_lanes


# -- FIFO queues pay nothing ------------------------------------------------------------------------


def test_a_fifo_sequence_touches_no_lane_or_ledger_row(rig: Rig) -> None:
    plain = [f"{n:030x}" for n in (1, 2)]
    banded = [f".3{n:030x}" for n in (1, 2)]

    rig.store.register_bands("q", 0, plain, now=NOW)
    assert rig.calls == []  # priority 5 without lanes: no request, as before
    rig.store.register_bands("q", 0, banded, now=NOW)
    assert rig.operations() == ["UpdateItem"]  # one head update, as before
    rig.store.put_new("q", 0, [item(i) for i in plain + banded], now=NOW)
    won = rig.store.claim("q", 0, [plain[0], banded[0]], lease_deadline=NOW + timedelta(minutes=1), now=NOW)
    rig.calls.clear()
    rig.store.note_leased("q", 0, won.applied, cursor=plain[1])
    rig.store.note_leased("q", 0, [], cursor=banded[1])
    assert rig.operations() == ["UpdateItem", "UpdateItem"]  # one head update each, as before
    rig.store.set_sweep("q", 0, plain[1])
    rig.store.set_sweep("q", 0, banded[1])
    rig.store.with_lanes("q", 0, head(rig))
    rig.store.forget_leases("q", 0, plain + banded)
    rig.store.delete("q", 0, plain, guard=Guard.ANY, now=NOW)
    assert rig.store.drop_band("q", 0, ".3", registered_before=NOW + timedelta(seconds=1))

    sent = json.dumps([params for _, params in rig.calls], default=str)
    assert '"~R' not in sent
    assert '"~S' not in sent
    assert '"gl"' not in sent
    assert '"rg' not in sent
    assert rig.rows("~R") == rig.rows("~S") == []
    found = head(rig)
    assert (found.has_lanes, dict(found.rings), found.cursor) == (False, {}, plain[1])


def test_a_registration_is_reused_for_far_less_than_the_reaper_waits_before_dropping() -> None:
    # A write relying on a reused registration lands long before the reaper may drop the lane.
    assert REGISTRATION_REUSE * 4 <= BAND_IDLE
