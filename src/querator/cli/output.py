"""The ``querator`` client commands: exit codes, error reporting, tables, JSON and a stderr progress bar.

Every client command runs through ``guarded``, so the exit code depends only on what went wrong
(docs/cli.md lists them) and a script can branch on it without reading the message.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import threading
import time
from datetime import datetime, timedelta
from typing import IO, TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from querator.api.durations import format_duration, format_timestamp
from querator.client import (
    ApiError,
    AuthError,
    BadRequestError,
    ConnectionFailedError,
    PayloadTooLargeError,
    RequestFailedError,
    RetryError,
    ServerError,
    UnsupportedContentError,
)

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Sequence


class ExitCode:
    """What the ``querator`` client commands exit with (docs/cli.md)."""

    OK: Final = 0
    #: An unexpected error, or a problem found before anything was sent (a missing file).
    ERROR: Final = 1
    #: argparse's own: unknown option, missing argument.
    USAGE: Final = 2
    #: 400 / 413 / 455: invalid request, unknown queue, stale item id, bad duration.
    BAD_REQUEST: Final = 3
    #: 454 / 429: try again; for ``lease``, nothing to lease.
    TRY_AGAIN: Final = 4
    #: 453: a valid request that cannot succeed now.
    REQUEST_FAILED: Final = 5
    #: 5xx.
    SERVER_ERROR: Final = 6
    #: No reply: cannot connect, connection dropped, timed out.
    CANNOT_CONNECT: Final = 7
    #: 401 / 403.
    NOT_ALLOWED: Final = 8
    #: Ctrl-C (128 + SIGINT), as shells report it.
    INTERRUPTED: Final = 130


class CliError(Exception):
    """A problem found by the command itself, with the exit code to report it under."""

    def __init__(self, message: str, code: int = ExitCode.ERROR) -> None:
        super().__init__(message)
        self.code = code


#: What a terminal acts on instead of showing: C0 controls (ESC, BEL, NUL, newline), DEL, C1 controls
#: (CSI is one), lone surrogates, line and paragraph separators, and the bidirectional marks,
#: embeddings, overrides and isolates that reorder what follows them ("Trojan Source").
_RAW: Final = re.compile(
    "[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029\u200e\u200f\u061c\u202a-\u202e\u2066-\u2069]"
)
#: The same, less what ``json.dumps`` escapes itself (C0 controls; it writes the rest as they are).
_RAW_IN_JSON: Final = re.compile(
    "[\x7f-\x9f\ud800-\udfff\u2028\u2029\u200e\u200f\u061c\u202a-\u202e\u2066-\u2069]"
)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: str) -> str:
    """``text`` with every character a terminal would act on written as an escape (``\\x1b``,
    ``\\u202e``). Whatever came from the server or a user (queue names, groups, references, payload
    previews, error messages) goes through it before it is printed, so it shows as text and never
    moves the cursor, rings, clears the screen or reorders the line."""
    return text if text.isprintable() else _RAW.sub(_escape, text)


def exit_code_for(error: ApiError) -> int:
    if isinstance(error, RetryError):
        return ExitCode.TRY_AGAIN
    if isinstance(error, BadRequestError | PayloadTooLargeError | UnsupportedContentError):
        return ExitCode.BAD_REQUEST
    if isinstance(error, RequestFailedError):
        return ExitCode.REQUEST_FAILED
    if isinstance(error, AuthError):
        return ExitCode.NOT_ALLOWED
    if isinstance(error, ServerError):
        return ExitCode.SERVER_ERROR
    return ExitCode.ERROR


def guarded(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Turn the client's errors into a one-line message on stderr and the documented exit code."""

    @functools.wraps(run)
    def wrapper(args: argparse.Namespace) -> int:
        prog = f"querator {args.command_path}"
        try:
            return run(args)
        except ApiError as exc:
            # The whole envelope: scripts may grep the stable class, people read the details.
            print(f"{prog}: {exc.code} {shown(exc.code_text)}: {shown(exc.message)}", file=sys.stderr)  # noqa: T201
            return exit_code_for(exc)
        except ConnectionFailedError as exc:
            print(f"{prog}: {exc}{connection_hint(args, exc)}", file=sys.stderr)  # noqa: T201
            return ExitCode.CANNOT_CONNECT
        except CliError as exc:
            print(f"{prog}: {shown(str(exc))}", file=sys.stderr)  # noqa: T201
            return exc.code
        except KeyboardInterrupt:
            print(f"{prog}: interrupted", file=sys.stderr)  # noqa: T201
            return ExitCode.INTERRUPTED

    return wrapper


LOOPBACK_HOSTS: Final = frozenset({"127.0.0.1", "localhost", "::1"})


def connection_hint(args: argparse.Namespace, error: ConnectionFailedError) -> str:
    """What to do about a call that got no reply, to append to its message."""
    if error.timed_out:
        longer = max(300, int(getattr(args, "timeout", 30) * 10))
        return (
            f"; the server may still be working on it (stats, clear and delete read the whole queue): "
            f"wait longer with --timeout SECONDS, e.g. --timeout {longer}"
        )
    if error.sent:
        return ""
    host = urlsplit(str(getattr(args, "url", ""))).hostname or ""
    if host in LOOPBACK_HOSTS:
        return (
            "; is the server running? Start it with `querator serve` (`./run serve` in a clone of the "
            "repository), or point --url / $QUERATOR_URL at another one"
        )
    return "; check --url / $QUERATOR_URL and the network"


# -- rendering ----------------------------------------------------------------------------------------


def jsonable(value: Any) -> Any:
    """Durations in Go form, timestamps RFC 3339, bytes as base64 (as on the wire)."""
    if isinstance(value, timedelta):
        return format_duration(value)
    if isinstance(value, datetime):
        return format_timestamp(value)
    if isinstance(value, dict):
        return {key: jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    return value


def print_json(data: Any, out: IO[str] | None = None) -> None:
    # Such characters can only be inside JSON strings, where their JSON escape means the same.
    text = _RAW_IN_JSON.sub(_json_escape, json.dumps(jsonable(data), ensure_ascii=False))
    print(text, file=out or sys.stdout)


def _json_escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def human_duration(value: timedelta) -> str:
    """A duration as a person reads it in a table: ``1m``, ``1m30s``, ``18.7s``, ``250ms``, ``24h``.

    Rounded (a tenth of a second under a minute, whole seconds above), with no zero parts, and still
    Go syntax, so a value read off a table can be typed back (``--lease-timeout 1m``). ``-o json``
    keeps the API's exact form (``1m0s``, ``18.666667s``).
    """
    micros = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    sign, micros = ("-", -micros) if micros < 0 else ("", micros)
    if micros == 0:
        return "0s"
    if micros < 1_000:
        return f"{sign}{micros}µs"
    if micros < 999_950:  # under a second once rounded to a tenth of a millisecond
        return f"{sign}{_tenths(micros / 1_000)}ms"
    if micros < 59_950_000:  # under a minute once rounded to a tenth of a second
        return f"{sign}{_tenths(micros / 1_000_000)}s"
    seconds = round(micros / 1_000_000)
    hours, rest = divmod(seconds, 3600)
    minutes, second = divmod(rest, 60)
    parts = [f"{n}{unit}" for n, unit in ((hours, "h"), (minutes, "m"), (second, "s")) if n]
    return sign + "".join(parts)


def _tenths(number: float) -> str:
    text = f"{number:.1f}"
    return text[:-2] if text.endswith(".0") else text


def cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, timedelta):
        return human_duration(value)
    if isinstance(value, datetime):
        return format_timestamp(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return shown(str(value))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned table; numbers right-aligned."""
    text_rows = [[cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in text_rows]) for i, h in enumerate(headers)]
    numeric = [
        bool(rows) and all(isinstance(row[i], int) and not isinstance(row[i], bool) for row in rows)
        for i in range(len(headers))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True)]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in text_rows)])


def key_values(pairs: Sequence[tuple[str, Any]]) -> str:
    width = max(len(key) for key, _ in pairs)
    return "\n".join(f"{key.ljust(width)}  {cell(value)}".rstrip() for key, value in pairs)


def preview(payload: bytes, limit: int = 60) -> str:
    """A payload for a table: its text when it is printable UTF-8, else ``<N bytes>``."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return f"<{len(payload)} bytes>"
    if not text.isprintable():
        text = text.encode("unicode_escape").decode("ascii")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def utf8_or_none(payload: bytes) -> str | None:
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError:
        return None


# -- progress -----------------------------------------------------------------------------------------


class Progress:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal (never in pipes or
    logs), at most ten times a second. With ``total`` 0 (stdin: size unknown) it counts items only."""

    def __init__(self, total: int, *, label: str, stream: IO[str] | None = None, force: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.enabled = force or self.stream.isatty()
        self.total = total
        self.label = shown(label)  # it may hold a queue name
        self.done = 0
        self.items = 0
        self._drawn_at = 0.0
        self._started = time.monotonic()

    def advance(self, done: int, items: int) -> None:
        self.done, self.items = done, items
        now = time.monotonic()
        if self.enabled and (now - self._drawn_at >= 0.1 or (self.total and done >= self.total)):
            self._drawn_at = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        rate = self.items / max(now - self._started, 1e-9)
        if not self.total:
            self.stream.write(f"\r{self.label}: {self.items} items {rate:,.0f}/s")
            self.stream.flush()
            return
        fraction = min(1.0, self.done / self.total)
        filled = int(fraction * 30)
        bar = "#" * filled + "-" * (30 - filled)
        self.stream.write(f"\r{self.label} [{bar}] {fraction:6.1%} {self.items} items {rate:,.0f}/s")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self._drawn_at:
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()


class Waiting:
    """``label… 12 s`` on stderr, redrawn every second while a slow call runs, and erased when it
    returns; only on a terminal, so pipes and logs stay quiet. Nothing is drawn in the first second."""

    def __init__(self, label: str, *, stream: IO[str] | None = None, force: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.enabled = force or self.stream.isatty()
        self.label = shown(label)  # it may hold a queue name
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._width = 0

    def __enter__(self) -> Waiting:
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name="querator-waiting", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        started = time.monotonic()
        while not self._done.wait(1.0):
            text = f"\r{self.label}… {time.monotonic() - started:.0f} s (Ctrl-C to stop waiting)"
            self._width = len(text)
            self.stream.write(text)
            self.stream.flush()

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
            if self._width:
                self.stream.write("\r" + " " * self._width + "\r")
                self.stream.flush()
