"""Failure reasons through the client: ``retry(reason=)`` and ``RetryItem(reason=)`` (checked before
anything is sent, by the server's rule), ``last_reason`` / ``failures`` on what a lease and a listing
return (``source_queue`` too), and the worker recording each failure: a handler's exception type and
message, a ``DeadLetter``'s or ``RetryLater``'s own message, cut to the limit; a stop's put-back
records nothing."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import TYPE_CHECKING

import pytest

from querator.client import (
    MAX_REASON_BYTES,
    Client,
    DeadLetter,
    LeasedItem,
    RetryItem,
    RetryLater,
    StoredItem,
    check_reason,
    failure_reason,
    reason_text,
)
from querator.client import models as client_models
from querator.domain import model as domain_model
from querator.domain.errors import InvalidRequestError

if TYPE_CHECKING:
    from tests.client.fakeserver import FakeServer

SAMPLES = ["", "ValueError: bad input", "x" * 1024, "x" * 1025, "é" * 512, "é" * 513, "a\nb", "tab\t",
           "\x00", "\x1b[31m", "\u2028", "🚀 emoji", "\xa0nbsp"]  # fmt: skip
QUICK = {"backoff": lambda attempts: timedelta(0), "idle_timeout": 0.5, "request_timeout": 0.3}


def test_the_clients_reason_rule_is_the_servers() -> None:
    assert client_models.MAX_REASON_BYTES == MAX_REASON_BYTES == domain_model.MAX_REASON_BYTES
    for sample in SAMPLES:
        try:
            domain_model.validate_reason(sample)
            server_takes = True
        except InvalidRequestError:
            server_takes = False
        try:
            check_reason(sample)
            client_takes = True
        except ValueError:
            client_takes = False
        assert client_takes == server_takes, sample
        # Whatever the text, reason_text makes one the server takes.
        domain_model.validate_reason(reason_text(sample * 100))


def test_reason_text_puts_any_text_on_one_line_within_the_limit() -> None:
    assert (
        reason_text("  Traceback:\n  File x\r\n\tKeyError: 'k'  \x1b[0m")
        == "Traceback: File x KeyError: 'k' [0m"
    )
    long = reason_text("é" * 2000)
    assert len(long.encode()) <= MAX_REASON_BYTES and long.endswith("…")
    tail = reason_text("start " + "x" * 2000 + " the end", keep_end=True)
    assert tail.startswith("…") and tail.endswith(" the end") and len(tail.encode()) <= MAX_REASON_BYTES


class BrokenStrError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


@pytest.mark.parametrize(
    ("raised", "reason"),
    [
        (ValueError("bad input"), "ValueError: bad input"),
        (KeyError("k"), "KeyError: 'k'"),
        (TimeoutError(), "TimeoutError"),
        (RuntimeError("two\nlines"), "RuntimeError: two lines"),
        (DeadLetter("cannot handle it"), "cannot handle it"),
        (DeadLetter(), "DeadLetter"),
        (RetryLater("30s"), "retry in 30s"),
        (RetryLater("30s", "rate limited by the API"), "rate limited by the API"),
        (BrokenStrError(), "BrokenStrError"),
    ],
)
def test_failure_reason_is_the_exceptions_type_and_message(raised: BaseException, reason: str) -> None:
    assert failure_reason(raised) == reason


def test_a_huge_exception_message_is_cut_to_the_limit() -> None:
    reason = failure_reason(ValueError("x" * 10_000))

    assert reason.startswith("ValueError: xxx") and len(reason.encode()) == MAX_REASON_BYTES


@pytest.mark.parametrize("bad", ["x" * 1025, "a\nb", 7])
def test_a_bad_reason_raises_before_anything_is_sent(
    fake: FakeServer, fake_client: Client, bad: object
) -> None:
    with pytest.raises(ValueError, match="reason"):
        RetryItem(id="a", reason=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reason"):
        fake_client.retry("q", ["a"], reason=bad)  # type: ignore[arg-type]
    assert fake.seen == []


def test_the_wire_bodies_leave_out_empty_reasons() -> None:
    assert RetryItem(id="a").to_wire() == {"id": "a"}
    assert RetryItem(id="a", reason="boom").to_wire() == {"id": "a", "reason": "boom"}
    stored = StoredItem(id="i", payload=b"p").to_wire()
    assert {"source_queue", "last_reason", "failures"}.isdisjoint(stored)
    dead = StoredItem(id="i", payload=b"p", source_queue="jobs", last_reason="boom", failures=2).to_wire()
    assert (dead["source_queue"], dead["last_reason"], dead["failures"]) == ("jobs", "boom", 2)
    assert StoredItem.from_wire(dead).last_reason == "boom"
    leased = LeasedItem(id="i", attempts=1, lease_deadline=None, payload=b"", last_reason="x", failures=1)
    assert LeasedItem.from_wire(leased.to_wire(), partition=0) == leased


# -- against querator serve --------------------------------------------------------------------------


def test_retry_reasons_show_on_the_next_lease_and_in_the_dead_letter_queue(
    client: Client, queue_name: str
) -> None:
    dead_queue = f"{queue_name}-dead"
    client.create_queue(dead_queue, lease_timeout="30s", expire_timeout="1h")
    client.create_queue(
        queue_name, lease_timeout="30s", expire_timeout="1h", dead_queue=dead_queue, max_attempts=2
    )
    client.produce(queue_name, [b"a"])
    first = client.lease(queue_name, 1).items[0]
    assert (first.last_reason, first.failures) == ("", 0)

    client.retry(queue_name, [first], reason="TimeoutError: db")
    second = client.lease(queue_name, 1).items[0]
    assert (second.last_reason, second.failures) == ("TimeoutError: db", 1)
    client.retry(queue_name, [RetryItem(id=second.id, reason="ValueError: no")])

    [dead] = client.list_items(dead_queue)
    assert (dead.last_reason, dead.failures, dead.source_queue, dead.source_id) == (
        "max attempts: ValueError: no",
        2,
        queue_name,
        second.id,
    )


@pytest.mark.parametrize("mode", ["poll", "stream"])
def test_the_worker_records_each_failures_type_and_message(
    client: Client, queue_name: str, mode: str
) -> None:
    dead_queue = f"{queue_name}-dead"
    client.create_queue(dead_queue, lease_timeout="30s", expire_timeout="1h")
    client.create_queue(
        queue_name, lease_timeout="30s", expire_timeout="1h", dead_queue=dead_queue, max_attempts=3
    )
    client.produce(queue_name, [b"flaky", b"poison", b"later"])
    seen: dict[bytes, list[tuple[str, int]]] = {}

    def handler(item: LeasedItem) -> None:
        seen.setdefault(item.payload, []).append((item.last_reason, item.failures))
        if item.payload == b"poison":
            raise DeadLetter("cannot handle it")
        if item.payload == b"later" and item.attempts == 1:
            raise RetryLater(0, "upstream said 429")
        if item.payload == b"flaky":
            raise KeyError(f"attempt {item.attempts}")

    report = client.consume(queue_name, handler, mode=mode, **QUICK)

    assert (report.completed, report.dead_lettered) == (1, 2)
    assert seen[b"flaky"] == [("", 0), ("KeyError: 'attempt 1'", 1), ("KeyError: 'attempt 2'", 2)]
    assert seen[b"later"] == [("", 0), ("upstream said 429", 1)]
    dead = {i.payload: (i.last_reason, i.failures, i.source_queue) for i in client.list_items(dead_queue)}
    assert dead == {
        b"flaky": ("max attempts: KeyError: 'attempt 3'", 3, queue_name),
        b"poison": ("cannot handle it", 1, queue_name),
    }


def test_items_a_stopping_worker_puts_back_record_no_failure(client: Client, queue_name: str) -> None:
    client.create_queue(queue_name, lease_timeout="1m", expire_timeout="1h")
    client.produce(queue_name, [b"a"])
    started, release, stop = threading.Event(), threading.Event(), threading.Event()

    def handler(item: LeasedItem) -> None:
        started.set()
        release.wait(10)

    thread = threading.Thread(
        target=lambda: client.consume(
            queue_name, handler, stop=stop, shutdown_timeout=0.1, request_timeout=0.3
        ),
        daemon=True,
    )
    thread.start()
    assert started.wait(10)
    stop.set()
    thread.join(10)
    release.set()

    [back] = client.list_items(queue_name)
    assert (back.last_reason, back.failures, back.is_leased) == ("", 0, False)


def test_a_reason_hook_of_its_own_words_and_one_that_fails(client: Client, queue_name: str) -> None:
    client.create_queue(queue_name, lease_timeout="30s", expire_timeout="1h", max_attempts=3)
    client.produce(queue_name, [b"a"])

    def handler(item: LeasedItem) -> None:
        raise OSError(5, "input/output error")

    def words(exc: BaseException) -> str:
        if isinstance(exc, OSError):
            return f"disk\nerror {exc.errno}"  # two lines: put on one
        raise AssertionError("never")

    client.consume(queue_name, handler, reason=words, max_items=1, **QUICK)
    [item] = client.list_items(queue_name)
    assert (item.last_reason, item.failures) == ("disk error 5", 1)

    def broken(exc: BaseException) -> str:
        raise RuntimeError("bug in the hook")

    client.consume(queue_name, handler, reason=broken, max_items=1, **QUICK)
    [item] = client.list_items(queue_name)
    assert (item.last_reason, item.failures) == ("OSError: [Errno 5] input/output error", 2)
