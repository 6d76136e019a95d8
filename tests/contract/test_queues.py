"""Contract: the queue catalog (create, info, list with pivot paging, update, delete with items)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from querator.domain.errors import (
    InvalidRequestError,
    QueueAlreadyExistsError,
    QueueDeletingError,
    QueueNotFoundError,
)
from querator.domain.model import QueueUpdate
from tests.contract.helpers import beside, items, make_queue


def test_created_queue_is_returned_by_info_with_the_service_times(service, clock):
    make_queue(service, "orders", max_attempts=3, reference="team-a", partitions=4)

    info = service.get_queue("orders")

    assert (info.max_attempts, info.reference, info.partitions) == (3, "team-a", 4)
    assert info.created_at == info.updated_at == clock.now()


def test_create_refuses_a_name_that_exists(service):
    make_queue(service, "orders")
    with pytest.raises(QueueAlreadyExistsError):
        make_queue(service, "orders")


@pytest.mark.parametrize("name", ["has space", "tilde~name", "x" * 513])
def test_create_refuses_bad_names(service, name):
    with pytest.raises(InvalidRequestError):
        make_queue(service, name)


@pytest.mark.parametrize(
    "name",
    ["nul\x00q", "esc\x1b[31mq", "bel\x07q", "del\x7fq", "c1\x80q", "csi\x9bq", "apc\x9fq"],
    ids=["NUL", "ESC", "BEL", "DEL", "C1-PAD", "C1-CSI", "C1-APC"],
)
def test_create_refuses_a_name_with_control_characters_as_a_group_does(service, name):
    with pytest.raises(InvalidRequestError, match="queue_name may not hold control characters"):
        make_queue(service, name)
    assert service.list_queues() == []


@pytest.mark.parametrize("name", ["nel\x85q", "sep\u2028q", "tab\tq"])
def test_control_characters_that_are_whitespace_keep_the_whitespace_message(service, name):
    with pytest.raises(InvalidRequestError, match="may not contain whitespace"):
        make_queue(service, name)


def test_a_name_with_emoji_and_other_scripts_is_taken(service):
    make_queue(service, "訂單-👩\u200d💻")  # the zero-width joiner is a format character, not a control
    assert [q.name for q in service.list_queues()] == ["訂單-👩\u200d💻"]


def test_a_queue_stored_before_the_rule_can_still_be_used_and_deleted(service, clock):
    # A name the old rules let through: created straight in the catalog, as an older version did.
    old = "old\x1bq"
    service.catalog.create(
        replace(make_queue(service, "template"), name=old, created_at=clock.now(), updated_at=clock.now())
    )
    service.produce(old, items("a"))
    assert service.get_queue(old).name == old
    assert old in [q.name for q in service.list_queues()]
    service.delete_queue(old)
    with pytest.raises(QueueNotFoundError):
        service.get_queue(old)


def test_dead_queue_must_exist_differ_and_have_no_dead_queue_of_its_own(service):
    make_queue(service, "dlq")
    make_queue(service, "work", dead_queue="dlq")
    with pytest.raises(InvalidRequestError, match="does not exist"):
        make_queue(service, "a", dead_queue="missing")
    with pytest.raises(InvalidRequestError, match="itself"):
        make_queue(service, "b", dead_queue="b")
    with pytest.raises(InvalidRequestError, match="dead_queue of its own"):
        make_queue(service, "c", dead_queue="work")


def test_a_queue_that_is_a_dead_queue_cannot_be_given_one_of_its_own(service):
    # GIVEN "dlq", the dead_queue of "work", and "other", a plain queue
    make_queue(service, "dlq")
    make_queue(service, "work", dead_queue="dlq")
    make_queue(service, "other")

    # WHEN "dlq" is given a dead_queue THEN it is refused, and "dlq" keeps none (no chain forms)
    with pytest.raises(InvalidRequestError, match="'dlq' is the dead_queue of work and cannot") as refused:
        service.update_queue(QueueUpdate(name="dlq", dead_queue="other"))
    assert refused.value.context == {"field": "dead_queue"}
    assert service.get_queue("dlq").dead_queue == ""

    # ...and once "work" no longer dead-letters there, it may
    service.update_queue(QueueUpdate(name="work", dead_queue=""))
    service.update_queue(QueueUpdate(name="dlq", dead_queue="other"))
    assert service.get_queue("dlq").dead_queue == "other"


def test_list_pages_in_name_order_from_an_inclusive_pivot(service):
    for name in ["d", "a", "c", "b", "e"]:
        make_queue(service, name)

    first = service.list_queues(limit=2)
    second = service.list_queues(pivot=first[-1].name, limit=3)

    assert [q.name for q in first] == ["a", "b"]
    assert [q.name for q in second] == ["b", "c", "d"]


def test_update_changes_only_present_fields(service, clock):
    make_queue(service, "orders", max_attempts=3, reference="keep me")
    clock.advance(timedelta(seconds=5))

    updated = service.update_queue(QueueUpdate(name="orders", lease_timeout=timedelta(seconds=10)))

    info = service.get_queue("orders")
    assert info == updated
    assert info.lease_timeout == timedelta(seconds=10)
    assert (info.max_attempts, info.reference) == (3, "keep me")
    assert info.updated_at == clock.now() != info.created_at


def test_update_validates_the_result(service):
    make_queue(service, "orders")
    with pytest.raises(InvalidRequestError, match="lease_timeout"):
        service.update_queue(QueueUpdate(name="orders", lease_timeout=timedelta(hours=2)))
    with pytest.raises(InvalidRequestError, match="reduced"):
        service.update_queue(QueueUpdate(name="orders", partitions=2))
        service.update_queue(QueueUpdate(name="orders", partitions=1))
    with pytest.raises(QueueNotFoundError):
        service.update_queue(QueueUpdate(name="missing", max_attempts=1))


def test_delete_removes_the_queue_and_its_items(service):
    make_queue(service, "orders", partitions=2)
    service.produce("orders", items("a", "b"))
    service.produce("orders", items("c"))

    service.delete_queue("orders")

    with pytest.raises(QueueNotFoundError):
        service.get_queue("orders")
    make_queue(service, "orders", partitions=2)  # same name again: nothing left from before
    assert sum(s.total for s in service.stats("orders")) == 0


def test_a_delete_left_to_the_reaper_is_a_453_and_the_queue_answers_453_until_gone(service, clock):
    make_queue(service, "orders")
    service.produce("orders", items("a", "b"))
    # No time for the request's own share: the reaper must finish (a queue bigger than ~10 s).
    hurried = beside(service, clock, purge_budget=timedelta(0))

    with pytest.raises(QueueDeletingError, match="reaper removes the rest"):
        hurried.delete_queue("orders")

    for call in (
        lambda: service.get_queue("orders"),
        lambda: service.stats("orders"),
        lambda: make_queue(service, "orders"),
    ):
        with pytest.raises(QueueDeletingError):
            call()
    service.reap(clock.now(), timedelta(seconds=30))
    with pytest.raises(QueueNotFoundError):
        service.get_queue("orders")
    make_queue(service, "orders")  # the name is free again
    assert sum(s.total for s in service.stats("orders")) == 0


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("a b", "dead_queue may not contain whitespace or '~'"),
        ("x" * 513, "dead_queue is longer than 512 bytes"),
    ],
)
def test_a_dead_queue_that_cannot_be_a_name_is_refused_naming_dead_queue(service, name, message):
    with pytest.raises(InvalidRequestError, match=message) as refused:
        make_queue(service, "orders", dead_queue=name)
    assert refused.value.context["field"] == "dead_queue"
    make_queue(service, "orders")
    with pytest.raises(InvalidRequestError, match=message):
        service.update_queue(QueueUpdate(name="orders", dead_queue=name))


def test_delete_refuses_a_queue_used_as_dead_queue(service):
    make_queue(service, "dlq")
    make_queue(service, "work", dead_queue="dlq")
    with pytest.raises(InvalidRequestError, match="dead_queue of work"):
        service.delete_queue("dlq")


def test_unknown_queue_is_reported(service):
    with pytest.raises(QueueNotFoundError):
        service.get_queue("nope")
    with pytest.raises(QueueNotFoundError):
        service.produce("nope", items("a"))


def test_the_catalog_keeps_delivery_and_max_leased_per_group(service):
    make_queue(service, "fair", delivery="fair", max_leased_per_group=3)
    make_queue(service, "plain")

    fair, plain = service.get_queue("fair"), service.get_queue("plain")

    assert (fair.delivery, fair.max_leased_per_group) == ("fair", 3)
    assert (plain.delivery, plain.max_leased_per_group) == ("fifo", 0)
    listed = {q.name: (q.delivery, q.max_leased_per_group) for q in service.list_queues()}
    assert listed == {"fair": ("fair", 3), "plain": ("fifo", 0)}
    assert {q.name: q.delivery for q in service.catalog.iterate()} == {"fair": "fair", "plain": "fifo"}


def test_the_catalog_replaces_delivery_and_marking_deleting_keeps_it(service, clock):
    created = make_queue(service, "orders", delivery="fair", max_leased_per_group=1_000_000)
    clock.advance(timedelta(seconds=1))
    # The catalog port itself: whether an update may change delivery is the service's business.
    back = replace(created, delivery="fifo", max_leased_per_group=0, updated_at=clock.now())
    service.catalog.replace(back, expected_updated_at=created.updated_at)
    assert service.catalog.get("orders") == back
    again = replace(
        back, delivery="fair", max_leased_per_group=7, updated_at=clock.now() + timedelta(seconds=1)
    )
    service.catalog.replace(again, expected_updated_at=back.updated_at)

    marked = service.catalog.mark_deleting("orders")

    assert (marked.deleting, marked.delivery, marked.max_leased_per_group) == (True, "fair", 7)
    stored = service.catalog.get("orders")
    assert (stored.deleting, stored.delivery, stored.max_leased_per_group) == (True, "fair", 7)
