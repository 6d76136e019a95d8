"""``benchmarks.connections``' own judgement, against tiny servers on 127.0.0.1: what counts as the
clean refusal past a ceiling and what counts as a dropped connection, and the ``/proc`` figures."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
from collections import Counter

import pytest

from benchmarks import connections

ENVELOPE = json.dumps(
    {"code": 503, "code_text": "Service Unavailable", "message": "Service unavailable; too many connections"}
).encode()


def _reply(*headers: str) -> bytes:
    head = "".join(f"{header}\r\n" for header in headers)
    return (
        f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n{head}"
        f"Content-Length: {len(ENVELOPE)}\r\n\r\n"
    ).encode() + ENVELOPE


async def _knock_each(mode: str) -> Counter[str]:
    """Three plain requests and three WebSocket upgrades to a server that answers each as ``mode``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if mode == "clean":
            writer.write(_reply("Retry-After: 1", "Connection: close"))
        elif mode == "no retry-after":
            writer.write(_reply("Connection: close"))
        elif mode == "reset":
            # SO_LINGER 0: close sends a reset, as a server dropping the connection would.
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        verdicts = await asyncio.gather(
            *(connections.knock("127.0.0.1", port, websocket=n % 2 == 1, queue_name="q") for n in range(6))
        )
    finally:
        server.close()
        await server.wait_closed()
    return Counter(verdicts)


@pytest.mark.parametrize(
    ("mode", "verdict"),
    [
        ("clean", "clean 503"),
        ("no retry-after", "503 without Retry-After: 1"),
        ("eof", "dropped: EOF without a reply"),
        ("reset", "dropped: connection reset"),
    ],
)
def test_only_the_envelope_with_retry_after_and_connection_close_is_a_clean_refusal(
    mode: str, verdict: str
) -> None:
    assert asyncio.run(_knock_each(mode)) == Counter({verdict: 6})


def test_the_server_figures_are_read_from_proc() -> None:
    sample = connections.read_proc(os.getpid())

    assert sample.threads >= 1
    assert sample.rss_kib > 1000
    assert sample.cpu_seconds > 0
