"""HTTP/1.1 framing for ``querator serve``: a request's head and body read from an asyncio stream,
and a reply's bytes.

Strict on purpose (it faces whatever a developer's tools send): ``Content-Length`` framing only, one
length, as a digit string. A request the server cannot frame is answered and its connection closed,
since where the next request would start is unknown.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Callable

#: The most a request line and its headers may take (http.server's limits came to about this).
HEAD_LIMIT: Final = 64 * 1024
_CRLF: Final = b"\r\n"
#: The contract's own statuses, which ``http.HTTPStatus`` does not know.
_REASONS: Final = {453: "Request Failed", 454: "Retry Request", 455: "Unsupported Content"}


class FramingError(Exception):
    """A request the server cannot frame: answered with ``status`` and the connection closes."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class RequestHead:
    """A request line and its headers, as received."""

    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    @property
    def query(self) -> str:
        return self.target.partition("?")[2]

    def get(self, name: str) -> str | None:
        """The first value of a header (names are case-insensitive)."""
        wanted = name.lower()
        return next((value for key, value in self.headers if key.lower() == wanted), None)

    def get_all(self, name: str) -> list[str]:
        wanted = name.lower()
        return [value for key, value in self.headers if key.lower() == wanted]

    def as_dict(self) -> dict[str, str]:
        """The headers as the proxy event carries them (a repeated header: its last value)."""
        return dict(self.headers)

    @property
    def keep_alive(self) -> bool:
        """Whether the client lets the connection carry another request after this one."""
        tokens = {token.strip().lower() for token in (self.get("Connection") or "").split(",")}
        if self.version == "HTTP/1.0":
            return "keep-alive" in tokens
        return "close" not in tokens


async def read_head(
    reader: asyncio.StreamReader, *, timeout: float, started: Callable[[], None] | None = None
) -> RequestHead | None:
    """The next request's head, or None when the client closed the connection between requests.

    Waits for the first byte as long as it takes (an idle keep-alive connection costs a socket, not a
    thread), calls ``started``, and from there the whole head must arrive within ``timeout`` seconds.

    Raises
    ------
    FramingError
        A head over ``HEAD_LIMIT`` (431), one that stopped arriving (408) or does not parse (400).
    """
    first = b"\r"
    # Empty lines before a request line are ignored (RFC 9112 2.2).
    while first in (b"\r", b"\n"):
        first = await reader.read(1)
        if not first:
            return None
    if started is not None:
        started()  # a request is under way from its first byte
    try:
        rest = await asyncio.wait_for(reader.readuntil(_CRLF + _CRLF), timeout)
    except asyncio.LimitOverrunError as error:
        raise FramingError(431, "the request line and headers are over 64 KiB") from error
    except asyncio.IncompleteReadError:
        return None  # the client went away in the middle of a request: nobody to answer
    except TimeoutError as error:
        raise FramingError(
            408, f"the request line and headers did not arrive within {timeout:g} s of its first byte"
        ) from error
    if len(first) + len(rest) > HEAD_LIMIT:
        # The reader's limit counts the bytes before the blank line only; the contract counts them all.
        raise FramingError(431, "the request line and headers are over 64 KiB")
    return parse_head(first + rest)


def parse_head(raw: bytes) -> RequestHead:
    lines = raw[: -len(_CRLF + _CRLF)].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[2].startswith("HTTP/1."):
        raise FramingError(400, f"malformed request line {lines[0][:80]!r}")
    method, target, version = parts
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip() or line[0] in " \t":
            # No name, whitespace before the colon, or an obsolete folded line: RFC 9112 5 says reject.
            raise FramingError(400, f"malformed header line {line[:80]!r}")
        headers.append((name, value.strip(" \t")))
    return RequestHead(method=method, target=target, version=version, headers=tuple(headers))


async def read_body(reader: asyncio.StreamReader, length: int, *, timeout: float, keep: bool) -> bytes | None:
    """``length`` bytes of body (kept, or dropped a chunk at a time); fewer when the client closed
    early, None when nothing arrived for ``timeout`` seconds (a body may take long, as long as it
    keeps coming)."""
    chunks: list[bytes] = []
    while length > 0:
        try:
            chunk = await asyncio.wait_for(reader.read(min(length, 1 << 16)), timeout)
        except TimeoutError:
            return None
        if not chunk:
            break
        length -= len(chunk)
        if keep:
            chunks.append(chunk)
    return b"".join(chunks)


def reply_bytes(
    status: int, headers: dict[str, str], body: bytes, *, close: bool, with_body: bool = True
) -> bytes:
    """A reply's bytes: its own ``Content-Length`` and ``Connection`` (the headers' are dropped)."""
    lines = [
        f"HTTP/1.1 {status} {reason(status)}",
        "Server: querator-local",
        f"Date: {formatdate(usegmt=True)}",
    ]
    lines.extend(
        f"{name}: {value}"
        for name, value in headers.items()
        if name.lower() not in {"content-length", "connection"}
    )
    lines.append(f"Content-Length: {len(body)}")
    if close:
        # Tells a keep-alive client not to send its next request on this connection.
        lines.append("Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + body if with_body else head


def reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return _REASONS.get(status, "")
