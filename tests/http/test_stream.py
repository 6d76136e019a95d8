"""The stream protocol against ``querator serve`` (ws://.../v1/stream), as a consumer sees it.

Waits poll with a deadline; the absence checks wait a bounded time longer than the server's idle
lease interval, since "nothing more was pushed" can only be seen by waiting.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest
import urllib3
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from querator.client import ApiError, Client, ConnectionFailedError, ItemNotLeasedError, QueueNotFoundError
from querator.client.stream import FRAME_CHARS, Stream, stream_consume, stream_url
from querator.stream import protocol
from querator.stream.local import IDLE_POLL
from querator.testing import serve_process

if TYPE_CHECKING:
    from collections.abc import Iterator

DEADLINE = 15.0


@pytest.fixture(scope="module")
def stream_server() -> Iterator[str]:
    with serve_process("--store", "memory", "--reaper-interval", "0.5") as url:
        yield url


@pytest.fixture
def api(stream_server: str) -> Iterator[Client]:
    with Client(stream_server) as client:
        yield client


def fresh_queue(api: Client, **options: Any) -> str:
    name = f"stream-{uuid.uuid4().hex[:8]}"
    api.create_queue(name, lease_timeout=options.pop("lease_timeout", "30s"), expire_timeout="1h", **options)
    return name


def test_items_produced_after_subscribing_are_pushed_in_the_lease_shape(
    stream_server: str, api: Client
) -> None:
    queue = fresh_queue(api)
    with Stream(stream_server, queue, credit=5) as stream:
        api.produce(queue, ["a", "b", "c"])
        lease = next(stream.leases(timeout=DEADLINE))
        assert [item.payload for item in lease.items] == [b"a", b"b", b"c"]
        assert all(item.attempts == 1 and item.lease_deadline is not None for item in lease.items)
        assert api.stats(queue).total_leased == 3
        stream.complete(lease.partition, lease.ids)
    assert api.stats(queue).total == 0


def test_the_server_never_holds_more_than_the_credit(stream_server: str, api: Client) -> None:
    queue = fresh_queue(api)
    api.produce(queue, [f"item {n}" for n in range(5)])
    with Stream(stream_server, queue, credit=2) as stream:
        first = next(stream.leases(timeout=DEADLINE))
        assert len(first.items) == 2
        # Longer than the server's idle lease interval: with credit it would have pushed by now.
        assert list(stream.leases(timeout=IDLE_POLL * 2)) == []
        assert api.stats(queue).total_leased == 2
        stream.complete(first.partition, first.ids[:1])  # one credit back: one more item
        second = next(stream.leases(timeout=DEADLINE))
        assert len(second.items) == 1
        assert api.stats(queue).total_leased == 2
        # Credit returned for an item settled over HTTP instead.
        api.complete(queue, second.items)
        stream.give_credit(1)
        third = next(stream.leases(timeout=DEADLINE))
        assert len(third.items) == 1
        assert {item.payload for item in first.items + second.items + third.items} == {
            b"item 0",
            b"item 1",
            b"item 2",
            b"item 3",
        }


def test_eight_consumers_each_item_to_one_consumer_at_a_time_within_credit(
    stream_server: str, api: Client
) -> None:
    queue = fresh_queue(api, requested_partitions=2)
    total, credit = 240, 3
    for start in range(0, total, 60):
        api.produce(queue, [f"{n}" for n in range(start, start + 60)])
    delivered: Counter[bytes] = Counter()
    most_held: list[int] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def consumer() -> None:
        try:
            with Stream(stream_server, queue, credit=credit) as stream:
                held = 0
                worst = 0
                for lease in stream.leases(timeout=3.0):
                    held += len(lease.items)
                    worst = max(worst, held)
                    with lock:
                        delivered.update(item.payload for item in lease.items)
                    stream.complete(lease.partition, lease.ids)
                    held -= len(lease.items)
                most_held.append(worst)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=consumer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    assert sum(delivered.values()) == total
    assert set(delivered.values()) == {1}
    assert max(most_held) <= credit
    assert api.stats(queue).total == 0


def test_a_dropped_connection_loses_nothing_and_its_old_ids_are_fenced(
    stream_server: str, api: Client
) -> None:
    queue = fresh_queue(api, lease_timeout="1s")
    api.produce(queue, ["precious"])
    first = Stream(stream_server, queue, credit=1).open()
    [held] = next(first.leases(timeout=DEADLINE)).items
    first.close()  # gone mid-lease, nothing settled
    with Stream(stream_server, queue, credit=1) as second:
        # The lease runs out; the item goes back and is pushed to the next consumer with a new id.
        [again] = next(second.leases(timeout=DEADLINE)).items
        assert (again.payload, again.attempts) == (b"precious", 2)
        assert again.id != held.id
        # The first consumer's id is fenced, over the stream as over HTTP.
        with pytest.raises(ItemNotLeasedError):
            second.complete(held.partition, [held.id])
        second.complete(again.partition, [again.id])
    assert api.stats(queue).total == 0


def test_retry_and_renew_over_the_stream(stream_server: str, api: Client) -> None:
    queue = fresh_queue(api)
    api.produce(queue, ["x"])
    with Stream(stream_server, queue, credit=1) as stream:
        [item] = next(stream.leases(timeout=DEADLINE)).items
        renewed = stream.renew(item.partition, [item.id], lease_timeout="5m")
        assert renewed["items"][0]["id"] == item.id
        from querator.client.models import RetryItem  # noqa: PLC0415 - only here

        stream.retry(item.partition, [RetryItem(id=item.id)])
        [back] = next(stream.leases(timeout=DEADLINE)).items
        assert (back.payload, back.attempts) == (b"x", 2)
        stream.complete(back.partition, [back.id])


def test_stream_consume_runs_a_handler_per_item(stream_server: str, api: Client) -> None:
    queue = fresh_queue(api)
    api.produce(queue, [f"job {n}" for n in range(20)])
    seen: list[bytes] = []
    report = stream_consume(
        stream_server, queue, lambda item: seen.append(item.payload), credit=4, max_items=20
    )
    assert sorted(seen) == sorted(f"job {n}".encode() for n in range(20))
    assert (report.leased, report.completed) == (20, 20)
    assert report.transport == "stream"  # not the report's default, "poll"
    assert api.stats(queue).total == 0


def test_protocol_errors_are_answered_and_the_connection_stays(stream_server: str, api: Client) -> None:
    queue = fresh_queue(api)
    with connect(stream_url(stream_server), open_timeout=DEADLINE) as socket:
        socket.send("not json")
        assert json.loads(socket.recv(timeout=DEADLINE))["code"] == 400
        socket.send(json.dumps({"type": "complete", "ids": ["x"]}))
        assert "subscribe first" in json.loads(socket.recv(timeout=DEADLINE))["message"]
        socket.send(json.dumps({"type": "subscribe", "queue_name": queue, "credit": 0}))
        assert "credit must be" in json.loads(socket.recv(timeout=DEADLINE))["message"]
        socket.send(json.dumps({"type": "subscribe", "queue_name": queue, "credit": 1, "extra": 1}))
        assert "unknown key(s) extra" in json.loads(socket.recv(timeout=DEADLINE))["message"]
        socket.send(json.dumps({"type": "subscribe", "queue_name": queue, "credit": 1}))
        assert json.loads(socket.recv(timeout=DEADLINE)) == {
            "type": "subscribed",
            "queue_name": queue,
            "credit": 1,
        }


def test_subscribing_to_an_unknown_queue_fails_loudly(stream_server: str) -> None:
    stream = Stream(stream_server, "no-such-queue", credit=1)
    # Refused by the subscribe itself, before "subscribed"; the connection is closed.
    with pytest.raises(QueueNotFoundError):
        stream.open()
    with pytest.raises(ConnectionFailedError):
        stream.give_credit(1)


def test_subscribe_answers_an_unknown_queue_before_subscribed(stream_server: str) -> None:
    with connect(stream_url(stream_server), open_timeout=DEADLINE) as socket:
        socket.send(json.dumps({"type": "subscribe", "queue_name": "no-such-queue", "credit": 1}))
        refused = json.loads(socket.recv(timeout=DEADLINE))
        assert (refused["type"], refused["code"]) == ("error", 400)
        assert refused["message"].startswith("Queue does not exist")
        # Not subscribed: the connection may subscribe again.
        socket.send(json.dumps({"type": "complete", "ids": ["x"]}))
        assert "subscribe first" in json.loads(socket.recv(timeout=DEADLINE))["message"]


def test_a_plain_get_of_the_stream_path_gets_the_contract_envelope(stream_server: str) -> None:
    reply = urllib3.request("GET", stream_server + "/v1/stream", timeout=10)
    assert reply.status == 400
    assert "WebSocket" in reply.json()["message"]


def test_the_server_stopping_closes_open_streams(api: Client) -> None:
    with serve_process("--store", "memory") as url, Client(url) as local:
        local.create_queue("q", lease_timeout="30s", expire_timeout="1h")
        stream = Stream(url, "q", credit=1).open()
    started = time.monotonic()
    # The server went away: the stream ends instead of hanging.
    assert list(stream.leases(timeout=DEADLINE)) == []
    assert time.monotonic() - started < DEADLINE
    stream.close()


def test_a_message_over_the_limit_gets_an_error_and_a_1009_close(stream_server: str) -> None:
    with connect(stream_url(stream_server), open_timeout=DEADLINE) as socket:
        socket.send(json.dumps({"type": "ping", "x": "y" * protocol.MAX_MESSAGE_BYTES}))
        answer = json.loads(socket.recv(timeout=DEADLINE))
        assert (answer["type"], answer["code"]) == ("error", 413)
        with pytest.raises(ConnectionClosed) as closed:
            socket.recv(timeout=DEADLINE)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == protocol.CLOSE_TOO_BIG


def test_a_deeply_nested_message_is_a_400_and_the_stream_stays(stream_server: str) -> None:
    with connect(stream_url(stream_server), open_timeout=DEADLINE) as socket:
        socket.send('{"type":"ping","x":' + "[" * 100_000 + "]" * 100_000 + "}")
        answer = json.loads(socket.recv(timeout=DEADLINE))
        assert (answer["type"], answer["code"]) == ("error", 400)
        socket.send(json.dumps({"type": "ping"}))
        assert json.loads(socket.recv(timeout=DEADLINE)) == {"type": "pong"}


def test_refused_and_partly_refused_settles_never_let_the_credit_be_exceeded(
    stream_server: str, api: Client
) -> None:
    # Leases of 1 s, so the renewed deadline is what stops a push at the old one.
    queue = fresh_queue(api, lease_timeout="1s", requested_partitions=2)
    api.produce(queue, [f"item {n}" for n in range(8)])
    with Stream(stream_server, queue, credit=2) as stream:
        leases = [next(stream.leases(timeout=DEADLINE))]
        if len(leases[0].items) < 2:
            leases.append(next(stream.leases(timeout=DEADLINE)))
        for lease in leases:
            stream.renew(lease.partition, lease.ids, lease_timeout="1m")
            # The wrong partition: one that does not exist (refused whole), the other one (each id
            # fails there: the items stay leased in theirs).
            with pytest.raises(ApiError):
                stream.complete(5, lease.ids)
            with pytest.raises(ItemNotLeasedError):
                stream.complete(1 - lease.partition, lease.ids)
            # A renew naming an id that is not held: the others are renewed, and count as such.
            with pytest.raises(ItemNotLeasedError):
                stream.renew(lease.partition, [*lease.ids, "0" * 30], lease_timeout="1m")
        # Past the old 1 s deadline and the idle lease interval: nothing more may be pushed.
        assert next(stream.leases(timeout=1.0 + IDLE_POLL * 2), None) is None
        assert api.stats(queue).total_leased == 2
        for lease in leases:
            stream.complete(lease.partition, lease.ids)
        assert len(next(stream.leases(timeout=DEADLINE)).items) >= 1


def test_a_call_longer_than_a_frame_goes_in_fragments_of_one_message(
    stream_server: str, api: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # API Gateway closes a connection on a frame over 32 KB: 1,000 ids (~34 KB) go in fragments.
    queue = fresh_queue(api)
    ids = [f"{n:030x}" for n in range(1000)]
    with Stream(stream_server, queue, credit=1) as stream:
        assert stream._socket is not None
        sent: list[list[str]] = []
        send = stream._socket.send

        def recording(message: Any) -> None:
            frames = [message] if isinstance(message, str) else list(message)
            sent.append(frames)
            send(frames)

        monkeypatch.setattr(stream._socket, "send", recording)
        with pytest.raises(ItemNotLeasedError) as refused:
            stream.complete(0, ids)
    assert len(refused.value.failed_ids) == 1000  # the server read the whole message
    [frames] = sent
    assert len(frames) == 2 and all(len(frame) <= FRAME_CHARS for frame in frames)
