"""Thousands of consumers on one ``querator serve``, and the clean refusal past its ceiling.

``benchmarks.connections`` at a smaller size: 1,500 streams and 1,500 long-polls (each stream holds
three open files in the server, so more than the 1,024 that ``select()`` can wait on), all from
this one process on asyncio, each of which must receive an item; and a server started with
``--max-connections 100`` that answers every connection past it with the contract's 503 instead of
dropping it, and takes new ones again once some close. Every wait has a deadline.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import TYPE_CHECKING

import pytest

from benchmarks import connections
from querator.testing import serve_child

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.slow

STREAMS = 1500
LONG_POLLS = 1500
#: A server with a thread per connection holds 3,000 here; an event loop holds a few.
MOST_THREADS = 100


def test_1500_streams_and_1500_long_polls_each_receive_an_item_from_one_server(tmp_path: Path) -> None:
    connections.raise_file_limit(STREAMS + LONG_POLLS + 100)
    # A server that fails here may log a line per connection: its log is kept, the report shows it.
    with (tmp_path / "serve.log").open("wb") as log, serve_child(stderr=log) as server:
        result = asyncio.run(
            connections.load(
                server.url,
                pid=server.pid,
                streams=STREAMS,
                long_polls=LONG_POLLS,
                queues=20,
                idle_seconds=1.0,
                deadline=30.0,
            )
        )

    assert result.errors == Counter(), connections.report_load(result) + _tail(tmp_path / "serve.log")
    assert result.served == {"stream": STREAMS, "long-poll": LONG_POLLS}
    assert result.delivered == result.completed == {"stream": STREAMS, "long-poll": LONG_POLLS}
    idle = next(phase for phase in result.phases if phase.name == "all open, idle")
    assert idle.threads_max < MOST_THREADS, connections.report_load(result)


def test_past_max_connections_each_new_connection_gets_a_clean_503_and_room_comes_back(
    tmp_path: Path,
) -> None:
    with (
        (tmp_path / "serve.log").open("wb") as log,
        serve_child("--max-connections", "100", stderr=log) as server,
    ):
        result = asyncio.run(connections.ceiling(server.url, limit=100, extra=20))

    report = connections.report_ceiling(result) + _tail(tmp_path / "serve.log")
    assert result.errors == Counter(), report
    assert result.opened == 100, report
    # Plain requests and WebSocket upgrades alike: a 503 envelope with Retry-After and
    # Connection: close, never a reset or an EOF without a reply.
    assert result.past_ceiling == Counter({"clean 503": 20}), report
    assert result.released == 20
    assert result.after_release == Counter({"accepted": 20}), report


def _tail(log: Path) -> str:
    lines = log.read_text(errors="replace").splitlines()
    return "\n\nserver log, the last lines:\n" + "\n".join(line[:200] for line in lines[-10:])
