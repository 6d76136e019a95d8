"""``querator console``: the web console for a deployed stack, on 127.0.0.1 (``querator.console.proxy``).

``querator serve`` serves the console itself at ``/console``; this command is for a stack on AWS, whose
routes need SigV4 signatures a browser cannot make.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

from querator.console.proxy import (
    DEFAULT_PORT,
    LOOPBACK,
    ConsoleProxy,
    ProxyConfigError,
    describe_identity,
    region_from_url,
)

if TYPE_CHECKING:
    import argparse


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "console",
        help="open the web console for a deployed stack (signs its calls with your AWS credentials)",
        description=(
            "Serve the web console on 127.0.0.1 and forward its API calls to a deployed stack, signed with"
            " your AWS credentials (SigV4), like `kubectl proxy`. For `querator serve`, open"
            " http://127.0.0.1:2319/console instead."
        ),
    )
    parser.add_argument(
        "--url",
        required=True,
        help="the stack's API address, e.g. https://abc.execute-api.eu-west-1.amazonaws.com/prod",
    )
    parser.add_argument(
        "--sigv4-region",
        metavar="REGION",
        help="region to sign for (default: from --url, else AWS_REGION / AWS_DEFAULT_REGION)",
    )
    parser.add_argument("--profile", help="AWS profile to sign with (default: the usual credential chain)")
    parser.add_argument(
        "--read-only", action="store_true", help="hide and refuse every call that changes a queue"
    )
    parser.add_argument(
        "--queue",
        dest="queues",
        metavar="NAME",
        action="append",
        default=[],
        help=(
            "a queue to show in the list (repeatable): for a role granted some queues, which may not"
            " call queues.list; the console lists these instead"
        ),
    )
    parser.add_argument("--host", default=LOOPBACK, help=f"address to bind (default {LOOPBACK})")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 picks a free one)"
    )
    parser.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow --host other than loopback (anyone who reaches it acts with your credentials)",
    )
    parser.set_defaults(run=run, command_parser=parser, command_path="console")


def run(args: argparse.Namespace) -> int:
    # Imported here: every other CLI command starts without boto3 (~0.15 s); only this one signs.
    import boto3  # noqa: PLC0415

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    region = (
        args.sigv4_region
        or region_from_url(args.url)
        or os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
    )
    if not region:
        print("querator console: no region to sign for; pass --sigv4-region", file=sys.stderr)  # noqa: T201
        return 2
    session = boto3.Session(profile_name=args.profile, region_name=region)
    try:
        credentials = session.get_credentials()
        if credentials is None:
            raise ProxyConfigError("no AWS credentials found (environment, --profile, SSO or instance role)")
        # Checked before anything reaches the network: a bad URL or bind costs no STS call.
        proxy = ConsoleProxy(
            url=args.url,
            region=region,
            credentials=credentials,
            read_only=args.read_only,
            host=args.host,
            port=args.port,
            allow_remote=args.allow_remote,
            queues=args.queues,
        )
        identity = describe_identity(session)
        proxy.start()
    except ProxyConfigError as exc:
        print(f"querator console: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        print(  # noqa: T201
            f"querator console: {args.host}:{args.port} is already in use; pick another with --port",
            file=sys.stderr,
        )
        return 1
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.set())
    signal.signal(signal.SIGINT, lambda signum, frame: stopping.set())
    mode = " (read-only)" if args.read_only else ""
    print(  # noqa: T201
        f"querator console: signing as {identity} for {args.url} in {region}{mode}",
        file=sys.stderr,
        flush=True,
    )
    try:
        print(f"Console on {proxy.url}/console/", flush=True)  # noqa: T201
        stopping.wait()
    finally:
        proxy.stop()
    return 0
