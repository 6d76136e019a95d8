"""A stream whose server goes away is told apart from one that is slow (issue 32, point 5).

A WebSocket server on 127.0.0.1 stands in for ``querator serve``: it subscribes the client, pushes
what the test asks, and on the first call either closes with 1001 "server stopping" (as the server
does when it stops), drops the connection without a close frame (1006: a crash, a cut network) or
never answers (a slow server). The first two must fail the waiting call at once with
``StreamClosedError`` and its code; the last must stay a timeout."""

from __future__ import annotations

import json
import socket
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.server import serve

from querator.client import ConnectionFailedError, StreamClosedError
from querator.client.stream import SharedStream, Stream, stream_consume

if TYPE_CHECKING:
    from collections.abc import Iterator

    from websockets.sync.server import ServerConnection

#: Far longer than any answer here takes: a call that waited this long was not told of the close.
CALL_TIMEOUT = 30.0
#: What "at once" means for a close: well under CALL_TIMEOUT on a loaded 2-core machine.
PROMPT = 5.0


class GoingAway:
    """Subscribes each connection, pushes ``pushed`` leases, then meets the first call with ``end``:
    ``"close"`` (close frame 1001 ``server stopping``), ``"drop"`` (no close frame) or ``"silent"``
    (no answer until the client leaves). ``calls`` keeps the calls it got."""

    def __init__(self, end: str, pushed: list[dict[str, Any]] | None = None) -> None:
        self.end = end
        self.pushed = pushed or []
        self.calls: list[dict[str, Any]] = []
        self._server = serve(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.socket.getsockname()[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _handle(self, connection: ServerConnection) -> None:
        try:
            subscribe = json.loads(connection.recv(timeout=PROMPT))
            connection.send(
                json.dumps({"type": "subscribed", "queue_name": subscribe["queue_name"], "credit": 1})
            )
            for lease in self.pushed:
                connection.send(json.dumps(lease))
            call = json.loads(connection.recv(timeout=CALL_TIMEOUT))
            self.calls.append(call)
            if self.end == "close":
                connection.close(1001, "server stopping")
            elif self.end == "drop":
                # A crash: the TCP connection ends with no close frame.
                connection.socket.shutdown(socket.SHUT_RDWR)
                connection.socket.close()
            else:
                connection.recv(timeout=CALL_TIMEOUT)  # until the client gives up and leaves
        except (ConnectionClosed, OSError, TimeoutError):
            return  # the client left first

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join(timeout=PROMPT)


@pytest.fixture
def going_away(request: pytest.FixtureRequest) -> Iterator[GoingAway]:
    end, pushed = request.param if isinstance(request.param, tuple) else (request.param, None)
    server = GoingAway(end, pushed)
    yield server
    server.stop()


def lease_of(*ids: str) -> dict[str, Any]:
    deadline = (datetime.now(UTC) + timedelta(minutes=1)).isoformat()
    items = [{"id": i, "attempts": 1, "lease_deadline": deadline, "bytes": ""} for i in ids]
    return {"type": "lease", "queue_name": "jobs", "partition": 0, "items": items}


GONE = [("close", 1001, "server stopping"), ("drop", 1006, "")]


@pytest.mark.parametrize(("going_away", "code", "reason"), GONE, indirect=["going_away"])
def test_a_call_on_a_stream_the_server_closes_fails_at_once_with_the_close(
    going_away: GoingAway, code: int, reason: str
) -> None:
    # GIVEN: a subscribed stream whose server goes away when it gets a call
    with Stream(going_away.url, "jobs", credit=1, call_timeout=CALL_TIMEOUT) as stream:
        started = time.monotonic()

        # WHEN: a complete is under way
        with pytest.raises(StreamClosedError) as closed:
            stream.complete(0, ["a"])

        # THEN: it fails at once with the close, not a timeout: sent (it may have been applied)
        assert time.monotonic() - started < PROMPT
        assert (closed.value.code, closed.value.reason) == (code, reason)
        assert closed.value.sent is True
        assert closed.value.timed_out is False
        assert str(code) in str(closed.value)
        # leases() ends rather than raising; closed_by says it was a close, the next call raises it
        assert list(stream.leases(timeout=PROMPT)) == []
        assert stream.closed_by is not None
        assert stream.closed_by.code == code
        with pytest.raises(StreamClosedError) as again:
            stream.renew(0, ["a"])
        assert (again.value.code, again.value.sent) == (code, False)


@pytest.mark.parametrize(("going_away", "code", "reason"), GONE, indirect=["going_away"])
def test_a_call_waiting_on_a_shared_stream_fails_at_once_when_the_server_goes_away(
    going_away: GoingAway, code: int, reason: str
) -> None:
    with SharedStream(going_away.url, "jobs", credit=1, call_timeout=CALL_TIMEOUT) as stream:
        started = time.monotonic()
        with pytest.raises(StreamClosedError) as closed:
            stream.complete(0, ["a"])
        assert time.monotonic() - started < PROMPT
        assert (closed.value.code, closed.value.reason, closed.value.sent) == (code, reason, True)
        assert closed.value.timed_out is False
        # Every reader of pushed leases sees the end; a later call raises the close, unsent.
        assert list(stream.leases(timeout=PROMPT)) == []
        assert stream.ended.is_set()
        with pytest.raises(StreamClosedError) as again:
            stream.retry(0, [])
        assert (again.value.code, again.value.sent) == (code, False)


@pytest.mark.parametrize("going_away", ["silent"], indirect=True)
@pytest.mark.parametrize("kind", [Stream, SharedStream])
def test_a_server_that_does_not_answer_is_a_timeout_not_a_close(
    going_away: GoingAway, kind: type[Stream]
) -> None:
    with kind(going_away.url, "jobs", credit=1, call_timeout=0.5) as stream:
        with pytest.raises(ConnectionFailedError) as slow:
            stream.complete(0, ["a"])
        assert not isinstance(slow.value, StreamClosedError)
        assert slow.value.timed_out is True
        assert "no reply" in str(slow.value)
        assert stream.closed_by is None


@pytest.mark.parametrize(
    ("going_away", "code"),
    [(("close", [lease_of("a", "b")]), "1001 server stopping"), (("drop", [lease_of("a", "b")]), "1006")],
    indirect=["going_away"],
)
def test_stream_consume_returns_its_report_when_the_server_goes_away(
    going_away: GoingAway, code: str
) -> None:
    # GIVEN: two items pushed; the server goes away on the first complete
    handled: list[str] = []

    # WHEN: stream_consume runs with no idle limit (only a close can end it)
    report = stream_consume(going_away.url, "jobs", lambda item: handled.append(item.id), credit=2)

    # THEN: it returns, saying why; the item whose complete was cut off and the one not run yet
    # are unsettled (their leases run out), the second never reached the handler
    assert handled == ["a"]
    assert (report.stopped_by, report.closed_by, report.transport) == ("closed", code, "stream")
    assert (report.leased, report.completed, report.unsettled) == (2, 0, 2)
    assert report.settled == report.leased
    assert [call["type"] for call in going_away.calls] == ["complete"]


@pytest.mark.parametrize("going_away", ["close"], indirect=True)
def test_stream_consume_with_an_idle_limit_says_closed_not_idle(going_away: GoingAway) -> None:
    # The close comes when the first complete does; a 60 s idle limit is not what ended it.
    going_away.pushed = [lease_of("a")]
    started = time.monotonic()
    report = stream_consume(going_away.url, "jobs", lambda item: None, credit=1, idle=60.0)
    assert time.monotonic() - started < PROMPT
    assert (report.stopped_by, report.closed_by) == ("closed", "1001 server stopping")
