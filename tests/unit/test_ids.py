"""Unit: item ids sort in visible-at order, keep produce order, and parse strictly."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from querator.domain.errors import InvalidRequestError
from querator.domain.ids import (
    ID_LENGTH,
    IdFactory,
    is_item_id,
    join_ids,
    parse_item_id,
    split_ids,
    visible_at_of,
    visible_bound,
)
from querator.domain.priority import priority_of

times = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC))


@given(a=times, b=times)
def test_ids_sort_like_their_visible_times(a, b):
    factory = IdFactory()
    id_a, id_b = factory.new_id(a), factory.new_id(b)
    if a < b:
        assert id_a < id_b
    assert visible_at_of(id_a) == a


@given(at=times, count=st.integers(1, 50), seed=st.integers(0, 16**10 // 2))
def test_ids_minted_for_one_time_keep_the_order_they_were_minted_in(at, count, seed):
    factory = IdFactory(seed=seed)
    ids = factory.new_ids(at, count) + factory.new_ids(at, count)
    assert ids == sorted(ids) and len(set(ids)) == 2 * count


@given(now=times, delta_us=st.integers(-(10**9), 10**9))
def test_visible_bound_splits_due_from_not_yet_due(now, delta_us):
    at = now + timedelta(microseconds=delta_us)
    item_id = IdFactory().new_id(at)
    assert (item_id < visible_bound(now)) == (at <= now)


def test_a_counter_wrap_inside_a_batch_keeps_the_batch_in_order():
    at = datetime(2026, 1, 1, tzinfo=UTC)
    ids = IdFactory(seed=16**10 - 2).new_ids(at, 5)
    assert ids == sorted(ids) and len(set(ids)) == 5


def test_ids_from_two_factories_never_collide():
    at = datetime(2026, 1, 1, tzinfo=UTC)
    a, b = IdFactory(node=1, seed=5), IdFactory(node=2, seed=5)
    assert not set(a.new_ids(at, 100)) & set(b.new_ids(at, 100))


@pytest.mark.parametrize("bad", ["", "xyz", "0" * (ID_LENGTH - 1), "G" * ID_LENGTH, "0" * (ID_LENGTH + 1)])
def test_parse_refuses_what_is_not_an_id(bad):
    with pytest.raises(InvalidRequestError):
        parse_item_id(bad)


def test_naive_times_are_refused():
    with pytest.raises(InvalidRequestError):
        IdFactory().new_id(datetime(2026, 1, 1))


@pytest.mark.parametrize(
    "priorities",
    [[5], [5, 5, 5], [0], [9], [0, 5, 9], [3, 3], []],
    ids=["one plain", "plain", "one urgent", "one bulk", "mixed", "banded", "none"],
)
def test_joined_ids_read_back_whole_whatever_their_priorities(priorities: list[int]) -> None:
    factory = IdFactory()
    now = datetime(2026, 11, 25, tzinfo=UTC)
    ids = [factory.new_id(now, p) for p in priorities]
    joined = join_ids(ids)
    assert split_ids(joined) == ids
    if all(p == 5 for p in priorities):
        assert joined == "".join(ids)  # the fixed-width form records had before priorities


def test_ids_of_each_priority_sort_by_priority_then_time() -> None:
    factory = IdFactory()
    early, late = datetime(2026, 11, 25, tzinfo=UTC), datetime(2026, 11, 26, tzinfo=UTC)
    ids = [factory.new_id(at, p) for p in (9, 5, 0) for at in (late, early)]
    expected = [(p, at) for p in (0, 5, 9) for at in (early, late)]
    assert [(priority_of(i), visible_at_of(i)) for i in sorted(ids)] == expected
    assert all(is_item_id(i) and parse_item_id(i) == i for i in ids)
    assert not is_item_id(".5" + ids[1][-30:]) and not is_item_id("p4" + ids[1][-30:])
