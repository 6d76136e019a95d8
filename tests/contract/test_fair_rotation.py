"""Contract: a fair lease is exactly the round-robin docs/api.md describes, the turn carried over.

Each lease is checked against a model of the promise: by priority, then one item of each group
with ready items per turn, in the rotation's order (items without a group first, then the groups by
their lane), starting after the group served last in that priority, oldest first within a group.
Every combination of 2-7 groups and batches of 1-7 runs on the embedded stores; a few run on the
moto stores too (slow there: moto's Query reads the whole partition).
"""

from __future__ import annotations

from collections import deque
from datetime import timedelta
from typing import TYPE_CHECKING

import pytest

from querator.domain.errors import NothingToLeaseError
from querator.domain.groups import group_lane
from querator.domain.model import NewItem
from querator.service.tuning import MAX_LANES_PER_LEASE
from querator.testing import memory_service, sqlite_service
from tests.contract.helpers import make_queue

if TYPE_CHECKING:
    from pathlib import Path

    from querator.service import QueueService
    from querator.testing import FakeClock


class RoundRobin:
    """The promise, kept apart from the code: per priority, FIFO lanes in rotation order (items
    without a group, then each group's lane in key order, round again) and the lane served last."""

    def __init__(self) -> None:
        self.lanes: dict[int, dict[str, deque[bytes]]] = {}
        self.ring: dict[int, str] = {}

    def produce(self, group: str, payloads: list[bytes], priority: int = 5) -> None:
        # Items without a group sort first (the band's own range), then the groups by their lane.
        lane = group_lane(group) if group else ""
        self.lanes.setdefault(priority, {}).setdefault(lane, deque()).extend(payloads)

    def lease(self, batch: int) -> list[bytes]:
        handed: list[bytes] = []
        for priority in sorted(self.lanes):
            lanes = self.lanes[priority]
            order = sorted(lane for lane, held in lanes.items() if held)
            if not order:
                continue
            # The turn carries over: the rotation starts after the lane served last (at first, as
            # if the items without a group had been: the first group's lane comes first).
            ring = self.ring.get(priority, "")
            start = next((n for n, lane in enumerate(order) if lane > ring), 0)
            order = order[start:] + order[:start]
            while len(handed) < batch and any(lanes[lane] for lane in order):
                for lane in order:
                    if len(handed) < batch and lanes[lane]:
                        handed.append(lanes[lane].popleft())
                        self.ring[priority] = lane
            if len(handed) >= batch:
                break
        return handed


def lease(service: QueueService, batch: int) -> list[bytes]:
    try:
        found = service.lease("jobs", batch_size=batch, client_id="c", timeout=timedelta(0)).items
    except NothingToLeaseError:
        return []
    return [item.payload for item in found]


def produce(service: QueueService, model: RoundRobin, group: str, count: int, priority: int = 5) -> None:
    payloads = [f"{group or '-'}/p{priority}/{n}".encode() for n in range(count)]
    for start in range(0, count, 1000):
        chunk = payloads[start : start + 1000]
        service.produce("jobs", [NewItem(payload=p, group=group, priority=priority) for p in chunk])
    model.produce(group, payloads, priority)


def run_rotation(service: QueueService, groups: int, batch: int) -> int:
    """Produce into ``groups`` groups of different depths (so they run dry at different times;
    with an odd count one of them is the items without a group), lease once, add a group that
    appears late and a priority band above, then lease to the end, checking every lease."""
    make_queue(service, delivery="fair")
    model = RoundRobin()
    names = ["" if n == 0 and groups % 2 else f"G{n}" for n in range(groups)]
    for n, name in enumerate(names):
        produce(service, model, name, 2 + n % 3)
    leases = 0

    def check() -> list[bytes]:
        nonlocal leases
        expected = model.lease(batch)
        got = lease(service, batch)
        leases += 1
        assert got == expected, f"lease {leases} of {batch} over {groups} groups"
        return got

    check()
    produce(service, model, "late", 3)
    produce(service, model, names[-1], 2, priority=3)
    produce(service, model, "late", 1, priority=3)
    check()
    produce(service, model, names[1], 1)  # a group that may have run dry gets an item again
    while check():
        pass
    return leases


@pytest.mark.parametrize("batch", range(1, 8))
@pytest.mark.parametrize("groups", range(2, 8))
def test_every_lease_is_the_next_stretch_of_one_round_robin(
    embedded: QueueService, groups: int, batch: int
) -> None:
    service = embedded

    assert run_rotation(service, groups, batch) > 1


@pytest.fixture(params=["memory", "sqlite"])
def logged(request: pytest.FixtureRequest, clock: FakeClock, tmp_path: Path) -> QueueService:
    """An embedded store's service with engine v3's logs: each group's lane is a log."""
    if request.param == "memory":
        return memory_service(clock=clock, engine=3)
    return sqlite_service(tmp_path / "querator.db", clock=clock, engine=3)


@pytest.mark.parametrize("batch", range(1, 8))
@pytest.mark.parametrize("groups", range(2, 8))
def test_every_lease_is_the_next_stretch_of_one_round_robin_over_logs(
    logged: QueueService, groups: int, batch: int
) -> None:
    assert run_rotation(logged, groups, batch) > 1


@pytest.mark.parametrize(("groups", "batch"), [(3, 3), (4, 6), (5, 2)])
def test_the_round_robin_on_every_store(service: QueueService, groups: int, batch: int) -> None:
    assert run_rotation(service, groups, batch) > 1


def test_the_issue_case_three_groups_leased_three_at_a_time(service: QueueService) -> None:
    """Issue 31, point 8: the second lease of three gave two items of one group and skipped one."""
    make_queue(service, delivery="fair")
    for group in ("X", "Y", "Z"):
        service.produce("jobs", [NewItem(payload=f"{group}{n}".encode(), group=group) for n in range(5)])

    handed = [[p.decode()[0] for p in lease(service, 3)] for _ in range(5)]

    assert [sorted(turn) for turn in handed] == [["X", "Y", "Z"]] * 5
    assert len({tuple(turn) for turn in handed}) == 1  # the same rotation order every turn


def test_a_batch_larger_than_a_lanes_first_read_reads_the_lane_on_in_turn(embedded: QueueService) -> None:
    service = embedded
    make_queue(service, delivery="fair")
    model = RoundRobin()
    produce(service, model, "deep", 1500)
    produce(service, model, "shallow", 10)

    for _ in range(3):
        assert lease(service, 1000) == model.lease(1000)


def test_a_lease_that_finds_its_most_lanes_empty_moves_the_ring_past_them(embedded: QueueService) -> None:
    """A lease reads at most ``MAX_LANES_PER_LEASE`` lanes; when all of them were empty the next
    lease must read the lanes after them, not the same empty ones for as long as they stay registered."""
    service = embedded
    make_queue(service, delivery="fair")
    groups = sorted((f"T{n:03d}" for n in range(MAX_LANES_PER_LEASE + 20)), key=group_lane)
    service.produce("jobs", [NewItem(payload=g.encode(), group=g) for g in groups])
    for _ in range(2):  # a lease reads at most that many lanes: two take them all
        held = service.lease("jobs", batch_size=len(groups), client_id="c", timeout=timedelta(0)).items
        service.complete("jobs", 0, [item.id for item in held])
    # The ring is at the last group's lane; the rotation goes on with the items without a group (its
    # first lane), then the groups from the first: the first lane past a lease's reach is this one's.
    beyond = groups[MAX_LANES_PER_LEASE - 1]
    service.produce("jobs", [NewItem(payload=b"beyond", group=beyond)])

    assert lease(service, 1) == []
    assert lease(service, 1) == [b"beyond"]


def test_a_band_of_exactly_the_most_lanes_a_lease_reads_still_gets_further_turns(
    embedded: QueueService,
) -> None:
    service = embedded
    make_queue(service, delivery="fair")
    model = RoundRobin()
    # With the band's own lane (items without a group), the band holds exactly that many lanes.
    for n in range(MAX_LANES_PER_LEASE - 1):
        produce(service, model, f"T{n:03d}", 3)

    assert lease(service, 250) == model.lease(250)


# The lane limits above, over engine v3's lane logs.


def test_a_deep_lanes_items_are_dealt_in_turn_over_logs(logged: QueueService) -> None:
    test_a_batch_larger_than_a_lanes_first_read_reads_the_lane_on_in_turn(logged)


def test_a_lease_over_logs_that_finds_its_most_lanes_empty_moves_the_ring(logged: QueueService) -> None:
    test_a_lease_that_finds_its_most_lanes_empty_moves_the_ring_past_them(logged)


def test_a_band_of_exactly_the_most_lanes_gets_further_turns_over_logs(logged: QueueService) -> None:
    test_a_band_of_exactly_the_most_lanes_a_lease_reads_still_gets_further_turns(logged)
