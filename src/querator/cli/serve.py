"""``querator serve``: the whole service on 127.0.0.1 (see ``querator.localserver``)."""

from __future__ import annotations

import errno
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from querator.config import SERVICE_NAME, ConfigurationError, StoreKind, parse_store
from querator.localserver import DEFAULT_MAX_CONNECTIONS, DEFAULT_PORT, REQUEST_LOGGER, LocalServer
from querator.localstore import LOOPBACK

if TYPE_CHECKING:
    import argparse


#: How often the main thread looks for a signal that another thread received (see ``run``).
_SIGNAL_POLL = 0.2


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "serve",
        help="run the service locally (embedded store and reaper)",
        description=(
            "Run the HTTP API on 127.0.0.1 with the real Lambda handlers, the reaper and a store: by"
            f" default a SQLite file that keeps queues and items across restarts ({default_database_path()})."
        ),
    )
    parser.add_argument(
        "--store",
        metavar="URL",
        help=(
            "where queues and items live: sqlite:PATH (one file; default"
            f" sqlite:{default_database_path()}), memory (lost when the server stops) or dynamodb (an"
            " embedded DynamoDB-compatible store in memory, or AWS_ENDPOINT_URL_DYNAMODB when set, which is"
            " also the default then)"
        ),
    )
    parser.add_argument("--host", default=LOOPBACK, help=f"address to bind (default {LOOPBACK})")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 picks a free one)"
    )
    parser.add_argument(
        "--reaper-interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="seconds between reaper runs (default 1)",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        metavar="N",
        help=(
            "open connections (keep-alive, long-polls, streams) held at most"
            f" (default {DEFAULT_MAX_CONNECTIONS:,}); past it a new one is answered 503"
        ),
    )
    parser.add_argument("--quiet", action="store_true", help="do not log each request (only problems)")
    parser.set_defaults(run=run, command_parser=parser, command_path="serve")


def run(args: argparse.Namespace) -> int:
    if args.reaper_interval <= 0:
        print("querator serve: --reaper-interval must be positive", file=sys.stderr)  # noqa: T201
        return 2
    if args.max_connections < 1:
        print("querator serve: --max-connections must be at least 1", file=sys.stderr)  # noqa: T201
        return 2
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    _log_requests(quiet=args.quiet)
    stopping = threading.Event()

    def stop(signum: int, frame: object) -> None:
        if stopping.is_set():
            # A second signal while requests under way finish (up to LocalServer.stop's grace): the
            # user wants out now. A SQLite store survives this (its write-ahead log).
            print("querator serve: stopped at once (second signal)", file=sys.stderr, flush=True)  # noqa: T201
            os._exit(1)
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    store = args.store or (
        StoreKind.DYNAMODB
        if os.environ.get("AWS_ENDPOINT_URL_DYNAMODB")
        else f"{StoreKind.SQLITE}:{default_database_path()}"
    )
    try:
        parse_store(store)
        server = LocalServer(
            host=args.host,
            port=args.port,
            reaper_interval=args.reaper_interval,
            store=store,
            max_connections=args.max_connections,
        ).start()
    except ConfigurationError as exc:
        print(f"querator serve: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        print(  # noqa: T201
            f"querator serve: {args.host}:{args.port} is already in use (another querator serve?); stop "
            f"it, or pick another port with --port (0 picks a free one)",
            file=sys.stderr,
        )
        return 1
    _print_errors()
    where = _describe(store, embedded=server.embedded_dynamodb)
    print(f"querator serve: {where}", file=sys.stderr, flush=True)  # noqa: T201
    try:
        # The first line of stdout is the URL, so scripts and tests can start it with --port 0.
        print(f"Querator listening on {server.url}", flush=True)  # noqa: T201
        # Waits a little at a time: the kernel may deliver the signal to any thread (one reading a
        # socket, say), and Python runs the handler in the main thread only when it next runs
        # bytecode; a wait without a timeout missed SIGTERM that way (2 of 8 tries, measured).
        while not stopping.wait(_SIGNAL_POLL):
            pass
        print(  # noqa: T201
            "querator serve: stopping; requests under way get their replies (signal again to stop at once)",
            file=sys.stderr,
            flush=True,
        )
    finally:
        server.stop()
    print("Querator stopped", file=sys.stderr, flush=True)  # noqa: T201
    return 0


def default_database_path() -> Path:
    """``$XDG_DATA_HOME/querator/querator.db``, or under ``~/.local/share`` when it is not set."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "querator" / "querator.db"


def _describe(store: str, *, embedded: bool) -> str:
    """Where the data lives and how long it lasts: the start-up line on stderr."""
    kind, path = parse_store(store)
    if kind == StoreKind.SQLITE:
        return (
            f"data in {Path(path).expanduser().resolve()} (kept across restarts; stop the server and delete"
            " the file to wipe it)"
        )
    if kind == StoreKind.MEMORY:
        return "WARNING: --store memory is EPHEMERAL: every queue and item is lost when the server stops"
    if embedded:
        return (
            "WARNING: --store dynamodb without AWS_ENDPOINT_URL_DYNAMODB is an embedded DynamoDB-compatible"
            " store (moto) in memory: every queue and item is lost when the server stops"
        )
    return f"data in DynamoDB at {os.environ.get('AWS_ENDPOINT_URL_DYNAMODB') or 'AWS'}"


def _log_requests(*, quiet: bool) -> None:
    """One plain line per request on stderr, ``10:29:25 POST /v1/queue.lease 200 3.1ms``; none when quiet."""
    requests = logging.getLogger(REQUEST_LOGGER)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
    requests.addHandler(handler)
    # Not through the Powertools logger of the handlers ("querator"), whose JSON lines are ~400 bytes.
    requests.propagate = False
    requests.setLevel(logging.WARNING if quiet else logging.INFO)


def _print_errors() -> None:
    """Errors (every 5xx among them) as plain lines with their traceback, not as JSON.

    The handlers log through the Powertools logger (``querator``), one JSON line per record with the
    traceback escaped inside, and with the Lambda context of whichever request set it last (the
    server's threads share it); the message of a 5xx names its own request id. Records below error
    level stay as they were (``POWERTOOLS_LOG_LEVEL`` shows them).
    """
    service_logger = logging.getLogger(SERVICE_NAME)
    for handler in service_logger.handlers:
        handler.addFilter(lambda record: record.levelno < logging.ERROR)
    plain = logging.StreamHandler(sys.stderr)
    plain.setLevel(logging.ERROR)
    plain.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S"))
    service_logger.addHandler(plain)
