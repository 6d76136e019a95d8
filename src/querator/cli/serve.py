"""``querator serve``: the whole service on 127.0.0.1 (see ``querator.localserver``)."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

from querator.localserver import DEFAULT_PORT, LocalServer
from querator.localstore import LOOPBACK

if TYPE_CHECKING:
    import argparse


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "serve",
        help="run the service locally (embedded store and reaper)",
        description=(
            "Run the HTTP API on 127.0.0.1 with the real Lambda handlers, an embedded DynamoDB-"
            "compatible store (or AWS_ENDPOINT_URL_DYNAMODB when set) and the reaper."
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
    parser.add_argument("--quiet", action="store_true", help="do not log each request")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.reaper_interval <= 0:
        print("querator serve: --reaper-interval must be positive", file=sys.stderr)  # noqa: T201
        return 2
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if args.quiet:
        # Request lines go through the Powertools logger ("querator"); quiet drops only them.
        logging.getLogger("querator.localserver").setLevel(logging.WARNING)
    stopping = threading.Event()

    def stop(signum: int, frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server = LocalServer(host=args.host, port=args.port, reaper_interval=args.reaper_interval).start()
    try:
        # The first line of stdout is the URL, so scripts and tests can start it with --port 0.
        print(f"Querator listening on {server.url}", flush=True)  # noqa: T201
        stopping.wait()
    finally:
        server.stop()
    print("Querator stopped", file=sys.stderr, flush=True)  # noqa: T201
    return 0
