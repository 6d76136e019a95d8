"""The ``querator`` client commands: queues, produce, lease, complete, retry, renew, reprioritize,
consume, stats, watch, peek, clear, dead-letters and redrive, over ``querator.client.Client``.

Each command takes ``--url`` (default ``$QUERATOR_URL`` or http://127.0.0.1:2319), ``--sigv4-region``
(``$QUERATOR_SIGV4_REGION``) and ``--output table|json``; exit codes are in ``output.ExitCode`` and
docs/cli.md. Durations are passed to the server verbatim, so it is the one judge of their syntax.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import csv
import json
import os
import re
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

from querator.api.durations import parse_duration
from querator.cli.output import (
    CliError,
    ExitCode,
    Progress,
    Waiting,
    cell,
    exit_code_for,
    guarded,
    key_values,
    preview,
    print_json,
    shown,
    table,
    utf8_or_none,
)
from querator.client import (
    DEFAULT_URL,
    ApiError,
    AuthError,
    Client,
    ItemNotLeasedError,
    NewItem,
    RequestFailedError,
    RetryItem,
)
from querator.client.models import (
    DEFAULT_PRIORITY,
    MAX_PRIORITY,
    MIN_PRIORITY,
    check_group,
    check_priority,
    check_reason,
)
from querator.domain.errors import InvalidRequestError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence

    from querator.client import Lease, LeasedItem, QueueInfo, QueueStats, StoredItem

#: ``datetime.UTC`` is Python 3.11+; the package supports 3.10 (docs/adr/0021-python-and-spark-versions.md).
UTC = timezone.utc

URL_ENV: Final = "QUERATOR_URL"
SIGV4_REGION_ENV: Final = "QUERATOR_SIGV4_REGION"
#: Items per produce request (the API's maximum is 1000).
DEFAULT_BATCH: Final = 500
#: Bytes of JSON per produce request, under the API's 5,000,000-byte body limit with room to spare.
MAX_BATCH_BYTES: Final = 4_000_000
EPILOG: Final = (
    "Exit codes: 0 ok, 1 error, 2 usage, 3 bad request (unknown queue, stale id, bad duration), 4 try again\n"
    "or nothing to lease, 5 request failed, 6 server error, 7 cannot connect or no reply (--timeout),\n"
    "8 not allowed (docs/cli.md)."
)


def register(commands: Any) -> argparse.ArgumentParser:
    """Add the client commands to the ``querator`` parser's subcommands; returns the parent parser of
    their connection and output options, for commands defined elsewhere (``consume``)."""
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("connection and output")
    group.add_argument(
        "--url",
        default=os.environ.get(URL_ENV, DEFAULT_URL),
        help=f"API base URL (default: ${URL_ENV} or {DEFAULT_URL})",
    )
    group.add_argument(
        "--sigv4-region",
        default=os.environ.get(SIGV4_REGION_ENV) or None,
        metavar="REGION",
        help=f"sign requests with SigV4 for an IAM-protected API (default: ${SIGV4_REGION_ENV})",
    )
    group.add_argument(
        "--output", "-o", choices=("table", "json"), default="table", help="output format (default: table)"
    )
    group.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long to wait for a reply (default: 30); stats, clear, delete of a large queue take longer",
    )
    _register_queues(commands, common)
    _register_produce(commands, common)
    _register_lease(commands, common)
    _register_settle(commands, common)
    _register_reprioritize(commands, common)
    _register_stats(commands, common)
    _register_peek(commands, common)
    _register_clear(commands, common)
    _register_dead_letters(commands, common)
    _register_redrive(commands, common)
    return common


def add_command(
    commands: Any,
    name: str,
    common: argparse.ArgumentParser,
    run: Callable[[argparse.Namespace], int],
    **kw: Any,
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(
        name, parents=[common], epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter, **kw
    )
    parser.set_defaults(run=guarded(run), command_path=name, command_parser=parser)
    return parser


def make_client(args: argparse.Namespace) -> Client:
    return Client(args.url, sigv4_region=args.sigv4_region, timeout=args.timeout)


def group_arg(text: str) -> str:
    """``--group``: at most 128 bytes of UTF-8 without control characters; else a usage error (2)."""
    try:
        return check_group(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def priority_arg(text: str) -> int:
    """``--priority``: 0-9, lower leases first; anything else is a usage error (2) naming the option."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be an integer between {MIN_PRIORITY} and {MAX_PRIORITY}, not {text!r}"
        ) from None
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise argparse.ArgumentTypeError(
            f"must be between {MIN_PRIORITY} and {MAX_PRIORITY} (lower leases first), not {value}"
        )
    return value


def reason_arg(text: str) -> str:
    """``--reason``: a failure reason as the server takes it (at most 1,024 bytes, one line)."""
    try:
        return check_reason(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def failure_columns(items: Sequence[LeasedItem | StoredItem]) -> bool:
    """Whether a listing shows FAILURES and LAST REASON: when one of its items failed (most listings
    hold none that did, and keep their width)."""
    return any(item.failures or item.last_reason for item in items)


def reason_cell(text: str, limit: int = 60) -> str:
    """A failure reason for a table: its start, cut with ``…`` (``-o json`` has all of it)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def seconds(text: str, what: str) -> float:
    """A Go duration the command itself needs (a wait, a delay); a bad one is a bad request (3)."""
    try:
        return parse_duration(text).total_seconds()
    except InvalidRequestError as exc:
        raise CliError(f"{what}: {exc}", ExitCode.BAD_REQUEST) from exc


# -- queues -------------------------------------------------------------------------------------------


def _register_queues(commands: Any, common: argparse.ArgumentParser) -> None:
    queues: argparse.ArgumentParser = commands.add_parser(
        "queues", help="create, list, inspect, change and delete queues", description="Manage queues."
    )
    actions = queues.add_subparsers(dest="queues_command", required=True, metavar="ACTION")

    create = add_command(
        actions,
        "create",
        common,
        _queues_create,
        help="create a queue",
        description="Create a queue. Durations are Go syntax: 300ms, 30s, 5m, 1h30m.",
    )
    create.add_argument("queue_name", metavar="QUEUE")
    create.add_argument("--lease-timeout", default="1m", help="how long a lease lasts (default 1m)")
    create.add_argument(
        "--expire-timeout", default="24h", help="age at which an item is dead-lettered (default 24h)"
    )
    _queue_fields(create)
    create.set_defaults(command_path="queues create")

    listing = add_command(
        actions,
        "list",
        common,
        _queues_list,
        help="list queues (with --depth: how many items each holds)",
        description=(
            "List queues in name order. --depth adds each queue's items, leased items and scheduled\n"
            "items (one stats call per queue, so it is slower on many or large queues)."
        ),
    )
    listing.add_argument("--pivot", default="", help="start at this name (inclusive)")
    listing.add_argument("--limit", type=int, default=None, help="at most this many (default: all)")
    listing.add_argument(
        "--depth", action="store_true", help="add ITEMS, LEASED and SCHEDULED columns (queue.stats)"
    )
    listing.set_defaults(command_path="queues list")

    info = add_command(
        actions, "info", common, _queues_info, help="show one queue", description="Show a queue's settings."
    )
    info.add_argument("queue_name", metavar="QUEUE")
    info.set_defaults(command_path="queues info")

    update = add_command(
        actions,
        "update",
        common,
        _queues_update,
        help="change a queue",
        description="Change the given settings of a queue; the others stay as they are.",
    )
    update.add_argument("queue_name", metavar="QUEUE")
    update.add_argument("--lease-timeout")
    update.add_argument("--expire-timeout")
    _queue_fields(update, defaults=False)
    update.set_defaults(command_path="queues update")

    delete = add_command(
        actions,
        "delete",
        common,
        _queues_delete,
        help="delete a queue and its items",
        description="Delete a queue and all its items.",
    )
    delete.add_argument("queue_name", metavar="QUEUE")
    delete.set_defaults(command_path="queues delete")


def _queue_fields(parser: argparse.ArgumentParser, *, defaults: bool = True) -> None:
    parser.add_argument(
        "--max-attempts",
        type=int,
        default=0 if defaults else None,
        help="leases before dead-lettering (0: unlimited)",
    )
    parser.add_argument(
        "--dead-queue", default="" if defaults else None, help="dead-letter queue (must exist)"
    )
    parser.add_argument("--reference", default="" if defaults else None, help="free text")
    parser.add_argument(
        "--partitions",
        type=int,
        default=1 if defaults else None,
        dest="requested_partitions",
        help="partition count" + (" (default 1)" if defaults else ""),
    )
    parser.add_argument(
        "--delivery",
        choices=("fifo", "fair"),
        default=None,
        help="fifo: oldest first; fair: leases go round-robin across the item groups"
        + (" (default fifo)" if defaults else "; only while the queue holds no items"),
    )
    parser.add_argument(
        "--max-leased-per-group",
        type=int,
        default=None,
        metavar="N",
        help="fair queues: the most valid leases one group may hold (0: no limit"
        + (", the default)" if defaults else ")"),
    )
    parser.add_argument(
        "--rate-limit",
        type=float,
        default=None,
        metavar="PER_SECOND",
        help="leases a second of the whole queue, across consumers and partitions (0: no limit"
        + (", the default)" if defaults else ")"),
    )
    parser.add_argument(
        "--rate-limit-per-group",
        type=float,
        default=None,
        metavar="PER_SECOND",
        help="fair queues: leases a second of each group (0: no limit"
        + (", the default)" if defaults else ")"),
    )


def _queue_row(info: QueueInfo) -> list[Any]:
    return [
        info.queue_name,
        info.lease_timeout,
        info.expire_timeout,
        info.max_attempts,
        info.dead_queue,
        info.requested_partitions,
        info.delivery,
        info.max_leased_per_group,
        _rate(info.rate_limit),
        _rate(info.rate_limit_per_group),
        info.reference,
    ]


def _rate(per_second: float) -> str:
    """A rate limit as the tables show it: ``20``, ``0.5``, ``-`` for none."""
    return f"{per_second:g}" if per_second else "-"


QUEUE_HEADERS: Final = [
    "QUEUE",
    "LEASE",
    "EXPIRE",
    "MAX ATTEMPTS",
    "DEAD QUEUE",
    "PARTITIONS",
    "DELIVERY",
    "MAX LEASED/GROUP",
    "RATE/S",
    "RATE/S/GROUP",
    "REFERENCE",
]


def _show_queue(args: argparse.Namespace, info: QueueInfo) -> None:
    if args.output == "json":
        print_json(info.to_wire())
    else:
        # The values, not their wire strings, so durations read as in the tables (1m, not 1m0s).
        pairs = [(key, getattr(info, key, value)) for key, value in info.to_wire().items()]
        print(key_values(pairs))  # noqa: T201


def _queues_create(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        client.create_queue(
            args.queue_name,
            lease_timeout=args.lease_timeout,
            expire_timeout=args.expire_timeout,
            max_attempts=args.max_attempts,
            dead_queue=args.dead_queue,
            reference=args.reference,
            requested_partitions=args.requested_partitions,
            delivery=args.delivery,
            max_leased_per_group=args.max_leased_per_group,
            rate_limit=args.rate_limit,
            rate_limit_per_group=args.rate_limit_per_group,
        )
        _show_queue(args, client.queue_info(args.queue_name))
    return ExitCode.OK


def _queues_list(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        queues: list[QueueInfo] = []
        try:
            for info in client.iter_queues(pivot=args.pivot, page_size=min(args.limit or 100, 1000)):
                if args.limit is not None and len(queues) >= args.limit:
                    break
                queues.append(info)
        except AuthError as exc:
            # queues.list spans queues: a role granted some queues (their scoped paths) may not call it.
            raise CliError(
                f"{exc.code} {exc.code_text}: listing queues needs the whole-API grant "
                "(POST /v1/queues.list); a role granted only some queues cannot list them, but can "
                "name each one: querator queues info NAME (docs/api.md, 'Access per queue')",
                ExitCode.NOT_ALLOWED,
            ) from exc
        depths: list[QueueStats] = []
        if args.depth:
            with Waiting(f"counting the items of {len(queues)} queue(s)"):
                depths = [client.stats(q.queue_name) for q in queues]
    if args.output == "json":
        wire = [q.to_wire() for q in queues]
        for body, stats in zip(wire, depths, strict=False):
            body.update(total=stats.total, total_leased=stats.total_leased, scheduled=stats.scheduled)
        print_json({"items": wire})
    elif args.depth:
        rows = [
            [*_queue_row(q)[:1], d.total, d.total_leased, d.scheduled, *_queue_row(q)[1:]]
            for q, d in zip(queues, depths, strict=True)
        ]
        headers = [QUEUE_HEADERS[0], "ITEMS", "LEASED", "SCHEDULED", *QUEUE_HEADERS[1:]]
        print(table(headers, rows))  # noqa: T201
    else:
        print(table(QUEUE_HEADERS, [_queue_row(q) for q in queues]))  # noqa: T201
    return ExitCode.OK


def _queues_info(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        _show_queue(args, client.queue_info(args.queue_name))
    return ExitCode.OK


def _queues_update(args: argparse.Namespace) -> int:
    fields = {
        key: getattr(args, key)
        for key in (
            "lease_timeout",
            "expire_timeout",
            "max_attempts",
            "dead_queue",
            "reference",
            "requested_partitions",
            "delivery",
            "max_leased_per_group",
            "rate_limit",
            "rate_limit_per_group",
        )
        if getattr(args, key) is not None
    }
    if not fields:
        raise CliError("nothing to change: give at least one option (see --help)", ExitCode.USAGE)
    with make_client(args) as client:
        client.update_queue(args.queue_name, **fields)
        _show_queue(args, client.queue_info(args.queue_name))
    return ExitCode.OK


def _queues_delete(args: argparse.Namespace) -> int:
    try:
        with make_client(args) as client, Waiting(f"deleting {args.queue_name} and its items"):
            client.delete_queue(args.queue_name)
    except RequestFailedError as exc:
        if exc.stable_class != "Queue is being deleted":
            raise
        # A queue too big for one call: deleted, and the reaper removes the rest of its items.
        if args.output == "json":
            print_json({"deleting": args.queue_name})
        else:
            print(f"deleting queue {shown(args.queue_name)}: the reaper removes the rest of its items")  # noqa: T201
        return ExitCode.OK
    if args.output == "json":
        print_json({"deleted": args.queue_name})
    else:
        print(f"deleted queue {shown(args.queue_name)}")  # noqa: T201
    return ExitCode.OK


# -- produce ------------------------------------------------------------------------------------------


def _register_produce(commands: Any, common: argparse.ArgumentParser) -> None:
    produce = add_command(
        commands,
        "produce",
        common,
        _produce,
        help="produce items from arguments, stdin or a file",
        description=(
            "Produce items: one per PAYLOAD argument; else one per line of --file or of stdin.\n"
            "--format jsonl: each line a JSON object with payload (text) or bytes (base64), and\n"
            "  optionally reference, encoding, kind, enqueue_at or enqueue_in, priority, group; any\n"
            "  other JSON"
            " value is the payload.\n"
            "--format csv: a header row; the payload column (or every column, as a JSON object)\n"
            "  is the payload; reference, encoding, kind, enqueue_at, enqueue_in, priority and group\n"
            "  columns are used when present.\n"
            "--in 5m (or --delay 5m) schedules the items 5 minutes after the server's clock at the call;\n"
            "  --enqueue-at an RFC 3339 time; a line's own enqueue_at / enqueue_in wins.\n"
            "--priority: 0-9, lower leases first (default 5); a line's own priority wins.\n"
            "--group: the group (tenant, customer) of every item; a line's own group wins.\n"
            "Items go in batches of --batch-size, each sent with its own Idempotency-Key so a\n"
            "retried batch is never stored twice. Progress is drawn on stderr when it is a terminal.\n"
            "PAYLOADs may come before or after the options; one that starts with '-' goes after '--'."
        ),
    )
    produce.add_argument("queue_name", metavar="QUEUE")
    produce.add_argument("payloads", nargs="*", metavar="PAYLOAD", help="item payloads (text)")
    produce.set_defaults(intermixed=True)
    produce.add_argument("--file", "-f", type=Path, help="read items from this file ('-' for stdin)")
    produce.add_argument(
        "--format",
        choices=("lines", "jsonl", "csv"),
        help="input format (default: from the file name: .jsonl/.ndjson, .csv, else lines)",
    )
    produce.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULT_BATCH,
        help=f"items per request, 1-1000 (default {DEFAULT_BATCH})",
    )
    produce.add_argument(
        "--reference", default="", help="reference of every item (unless the input sets one)"
    )
    produce.add_argument("--kind", default="", help="kind of every item")
    produce.add_argument("--encoding", default="", help="encoding of every item")
    produce.add_argument(
        "--priority",
        type=priority_arg,
        default=DEFAULT_PRIORITY,
        metavar="N",
        help=f"priority of every item unless the input sets one: 0-9, lower leases first "
        f"(default {DEFAULT_PRIORITY})",
    )
    produce.add_argument(
        "--group",
        type=group_arg,
        default="",
        help="group of every item unless the input sets one (a tenant, a customer; default none)",
    )
    when = produce.add_mutually_exclusive_group()
    when.add_argument("--enqueue-at", metavar="TIMESTAMP", help="schedule the items for this RFC 3339 time")
    when.add_argument(
        "--in",
        "--delay",
        dest="delay",
        metavar="DURATION",
        help="schedule the items this long after the server's clock (Go duration, e.g. 5m)",
    )


@dataclass(frozen=True, slots=True)
class _Defaults:
    reference: str
    kind: str
    encoding: str
    enqueue_at: datetime | str | None
    priority: int
    group: str = ""
    #: ``--in``: a delay the server counts from its clock (``enqueue_at`` is then ``None``).
    enqueue_in: timedelta | None = None


def _produce(args: argparse.Namespace) -> int:
    if not 1 <= args.batch_size <= 1000:
        raise CliError("--batch-size must be between 1 and 1000", ExitCode.USAGE)
    enqueue_in = parse_delay(args.delay, "--in") if args.delay else None
    defaults = _Defaults(
        args.reference, args.kind, args.encoding, args.enqueue_at, args.priority, args.group, enqueue_in
    )
    produced = batches = 0
    key_prefix = uuid.uuid4().hex
    with make_client(args) as client, _input(args) as (lines, size, fmt):
        # Arguments are few; a file has a size to show a bar against; stdin has neither, so the
        # count and rate alone.
        progress = Progress(size, label=f"produce {args.queue_name}")
        progress.enabled = progress.enabled and not args.payloads
        try:
            for batch, position, numbers in _batches(_items(lines, fmt, defaults), args.batch_size):
                try:
                    client.produce(args.queue_name, batch, idempotency_key=f"{key_prefix}-{batches}")
                except ApiError as exc:
                    raise _on_line(exc, numbers, "PAYLOAD" if args.payloads else "line", produced) from exc
                produced += len(batch)
                batches += 1
                progress.advance(position, produced)
        finally:
            progress.close()
    if args.output == "json":
        print_json({"queue_name": args.queue_name, "produced": produced, "batches": batches})
    else:
        print(f"produced {produced} item(s) to {shown(args.queue_name)} in {batches} request(s)")  # noqa: T201
    return ExitCode.OK


def parse_duration_delta(text: str, what: str) -> timedelta:
    try:
        return parse_duration(text)
    except InvalidRequestError as exc:
        raise CliError(f"{what}: {exc}", ExitCode.BAD_REQUEST) from exc


def parse_delay(text: str, what: str) -> timedelta:
    """A delay option (``--in``): a Go duration, 0 or more."""
    delay = parse_duration_delta(text, what)
    if delay < timedelta(0):
        raise CliError(f"{what}: must not be negative, not {text!r}", ExitCode.BAD_REQUEST)
    return delay


class _input:  # noqa: N801 - a context manager used like a function
    """The lines to produce: from arguments, a file or stdin; with the file's size for the progress bar."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.handle: IO[str] | None = None

    def __enter__(self) -> tuple[Iterable[str], int, str]:
        args = self.args
        if args.payloads:
            if args.file is not None:
                raise CliError("give PAYLOAD arguments or --file, not both", ExitCode.USAGE)
            return list(args.payloads), 0, "lines"
        path: Path | None = args.file
        if path is None or str(path) == "-":
            return sys.stdin, 0, args.format or "lines"
        fmt = args.format or {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}.get(
            path.suffix.lower(), "lines"
        )
        try:
            self.handle = path.open(encoding="utf-8", newline="" if fmt == "csv" else None)
            size = path.stat().st_size
        except OSError as exc:
            raise CliError(f"cannot read {path}: {exc.strerror}") from exc
        return self.handle, size, fmt

    def __exit__(self, *exc_info: object) -> None:
        if self.handle is not None:
            self.handle.close()


def _on_line(exc: ApiError, numbers: Sequence[int], what: str, produced: int) -> CliError:
    """The server's refusal of a batch, naming the input line of the item it names (``items[3]``)."""
    match = _ITEM_INDEX.search(exc.message)
    where = ""
    if match is not None and int(match.group(1)) < len(numbers):
        where = f"{what} {numbers[int(match.group(1))]}: "
    return CliError(
        f"{where}{exc.code} {exc.code_text}: {exc.message} ({produced} item(s) before it were produced)",
        exit_code_for(exc),
    )


#: Where the server names an item of a batch: ``items[3].enqueue_at: ...``.
_ITEM_INDEX: Final = re.compile(r"\bitems\[(\d+)\]")


def _items(lines: Iterable[str], fmt: str, defaults: _Defaults) -> Iterator[tuple[NewItem, int, int]]:
    """Items with the number of input characters consumed so far (progress) and their line number."""
    consumed = 0
    if fmt == "csv":
        counted = _counting(lines)
        reader = csv.DictReader(counted)
        for number, row in enumerate(reader, start=2):
            yield _csv_item(row, defaults, number), counted.consumed, number
        return
    for number, line in enumerate(lines, start=1):
        consumed += len(line.encode("utf-8"))
        text = line.rstrip("\r\n")
        if fmt == "jsonl":
            if not text.strip():
                continue
            yield _jsonl_item(text, defaults, number), consumed, number
        else:
            yield _item(text, {}, defaults, number), consumed, number


class _counting:  # noqa: N801 - an iterator wrapper
    def __init__(self, lines: Iterable[str]) -> None:
        self.lines = iter(lines)
        self.consumed = 0

    def __iter__(self) -> _counting:
        return self

    def __next__(self) -> str:
        line = next(self.lines)
        self.consumed += len(line.encode("utf-8"))
        return line


def _item(payload: bytes | str, fields: dict[str, Any], defaults: _Defaults, number: int = 0) -> NewItem:
    priority = fields.get("priority")
    if priority is None or priority == "":
        priority = defaults.priority
    else:
        try:
            check_priority(priority)
        except ValueError as exc:
            raise CliError(f"line {number}: {exc}", ExitCode.BAD_REQUEST) from exc
    group = fields.get("group") or defaults.group
    try:
        check_group(group)
    except ValueError as exc:
        raise CliError(f"line {number}: {exc}", ExitCode.BAD_REQUEST) from exc
    # A line's own time, either form, wins over --enqueue-at / --in.
    enqueue_at, enqueue_in = fields.get("enqueue_at") or None, fields.get("enqueue_in") or None
    if enqueue_at is None and enqueue_in is None:
        enqueue_at, enqueue_in = defaults.enqueue_at, defaults.enqueue_in
    try:
        return NewItem(
            payload=payload,
            reference=str(fields.get("reference") or defaults.reference),
            encoding=str(fields.get("encoding") or defaults.encoding),
            kind=str(fields.get("kind") or defaults.kind),
            enqueue_at=enqueue_at,
            enqueue_in=enqueue_in,
            priority=priority,
            group=group,
        )
    except ValueError as exc:
        raise CliError(f"line {number}: {exc}", ExitCode.BAD_REQUEST) from exc


def _jsonl_item(text: str, defaults: _Defaults, number: int) -> NewItem:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise CliError(f"line {number}: not JSON: {exc}", ExitCode.BAD_REQUEST) from exc
    if not isinstance(value, dict) or not ({"payload", "bytes", "utf8"} & value.keys()):
        return _item(value if isinstance(value, str) else json.dumps(value), {}, defaults)
    if "bytes" in value:
        try:
            payload: bytes | str = base64.b64decode(str(value["bytes"]), validate=True)
        except binascii.Error as exc:
            raise CliError(f"line {number}: bytes: invalid base64: {exc}", ExitCode.BAD_REQUEST) from exc
    else:
        raw = value.get("payload", value.get("utf8"))
        payload = raw if isinstance(raw, str) else json.dumps(raw)
    return _item(payload, value, defaults, number)


def _csv_item(row: dict[str, Any], defaults: _Defaults, number: int) -> NewItem:
    if None in row:
        raise CliError(f"line {number}: more fields than the header has", ExitCode.BAD_REQUEST)
    if "payload" in row:
        priority = str(row.get("priority") or "").strip()
        if priority.isdecimal():
            # A CSV cell is text: "3" is priority 3 (a JSONL line's "3" is refused, as the API does).
            row = {**row, "priority": int(priority)}
        return _item(str(row["payload"] or ""), row, defaults, number)
    return _item(json.dumps(row, ensure_ascii=False), {}, defaults)


def _batches(
    items: Iterator[tuple[NewItem, int, int]], size: int
) -> Iterator[tuple[list[NewItem], int, list[int]]]:
    """Batches of at most ``size`` items and ``MAX_BATCH_BYTES``, each with the input position after it
    and the line number of each item."""
    batch: list[NewItem] = []
    numbers: list[int] = []
    batch_bytes = 0
    position = 0
    for item, consumed, number in items:
        # A rough upper bound of the item's JSON size: base64 grows by 4/3, the rest is small.
        item_bytes = len(item.payload) * 4 // 3 + 200
        if batch and (len(batch) >= size or batch_bytes + item_bytes > MAX_BATCH_BYTES):
            yield batch, position, numbers
            batch, numbers, batch_bytes = [], [], 0
        batch.append(item)
        numbers.append(number)
        batch_bytes += item_bytes
        position = consumed
    if batch:
        yield batch, position, numbers


# -- lease, complete, retry, renew --------------------------------------------------------------------


def _register_lease(commands: Any, common: argparse.ArgumentParser) -> None:
    lease = add_command(
        commands,
        "lease",
        common,
        _lease,
        help="lease items (exit 4 when there is nothing to lease)",
        description=(
            "Lease up to --batch-size items of one partition, oldest first, waiting up to --wait for one.\n"
            "Prints the partition and each item's id, attempts, priority, group, lease deadline and\n"
            "payload (and, when one of them failed before, its failures and last reason); complete,\n"
            "retry or renew them with the ids and --partition. Items of a lower priority lease first.\n"
            "Exits 4 when there was nothing to lease."
        ),
    )
    lease.add_argument("queue_name", metavar="QUEUE")
    lease.add_argument(
        "--batch-size", "-n", type=int, default=1, help="most items to lease, 1-1000 (default 1)"
    )
    lease.add_argument(
        "--wait", default="5s", metavar="DURATION", help="request_timeout: how long to wait (default 5s)"
    )
    lease.add_argument("--client-id", help="client id of the lease (default: host, pid and a random part)")


def _lease(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        lease = client.lease(
            args.queue_name, args.batch_size, client_id=args.client_id, request_timeout=args.wait
        )
    if args.output == "json":
        print_json(_lease_json(lease))
    elif lease.items:
        print(f"queue {shown(lease.queue_name)}, partition {lease.partition}")  # noqa: T201
        rows = [
            [i.id, i.attempts, i.priority, i.group, i.lease_deadline, preview(i.payload)] for i in lease.items
        ]
        headers = ["ID", "ATTEMPTS", "PRIORITY", "GROUP", "LEASE DEADLINE", "PAYLOAD"]
        if failure_columns(lease.items):
            headers += ["FAILURES", "LAST REASON"]
            rows = [
                [*row, i.failures, reason_cell(i.last_reason)]
                for row, i in zip(rows, lease.items, strict=True)
            ]
        print(table(headers, rows))  # noqa: T201
    # A rate limit says when it has a lease again (the JSON output carries next_lease_at).
    back_at = (
        f"; the rate limit has a lease again at {cell(lease.next_lease_at)}" if lease.next_lease_at else ""
    )
    if not lease.items:
        print(f"querator lease: nothing to lease in {shown(args.queue_name)}{back_at}", file=sys.stderr)  # noqa: T201
        return ExitCode.TRY_AGAIN
    if back_at and args.output != "json":
        print(f"querator lease: {back_at.removeprefix('; ')}", file=sys.stderr)  # noqa: T201
    return ExitCode.OK


def _lease_json(lease: Lease) -> dict[str, Any]:
    body = lease.to_wire()
    for wire, item in zip(body["items"], lease.items, strict=True):
        text = utf8_or_none(item.payload)
        if text is not None:
            wire["utf8"] = text
    return body


def _register_settle(commands: Any, common: argparse.ArgumentParser) -> None:
    ids_help = "item ids (from lease); '-' or none: read them from stdin, one per line"

    complete = add_command(
        commands,
        "complete",
        common,
        _complete,
        help="complete (delete) leased items",
        description=(
            "Complete leased items. A stale or unknown id exits 3 naming it; the others are done.\n"
            "The ids of one call are of one partition: the one the lease printed (-p)."
        ),
    )
    complete.add_argument("queue_name", metavar="QUEUE")
    complete.add_argument("ids", nargs="*", metavar="ID", help=ids_help)
    _partition_option(complete)

    retry = add_command(
        commands,
        "retry",
        common,
        _retry,
        help="put leased items back: now, later, or into the dead-letter queue",
        description=(
            "Put leased items back in the queue now, at --at / after --in (scheduled; --in counts from\n"
            "the server's clock), or with --dead\n"
            "into the queue's dead-letter queue (a queue without one: exit 3, nothing is done).\n"
            "--priority N puts them back with priority N (0-9, lower leases first) instead of their own.\n"
            "--reason TEXT says why: each item keeps it as its last reason (peek, lease and\n"
            "dead-letters show it) and counts one more failure.\n"
            "A stale or unknown id exits 3 naming it; the others apply."
        ),
    )
    retry.add_argument("queue_name", metavar="QUEUE")
    retry.add_argument("ids", nargs="*", metavar="ID", help=ids_help)
    _partition_option(retry)
    when = retry.add_mutually_exclusive_group()
    when.add_argument("--at", metavar="TIMESTAMP", help="RFC 3339 time at which the items come back")
    when.add_argument(
        "--in", dest="delay", metavar="DURATION", help="come back after this long (Go duration)"
    )
    when.add_argument("--dead", action="store_true", help="send to the dead-letter queue")
    retry.add_argument(
        "--priority",
        type=priority_arg,
        default=None,
        metavar="N",
        help="come back with this priority, 0-9 (default: the item's own)",
    )
    retry.add_argument(
        "--reason",
        type=reason_arg,
        default="",
        metavar="TEXT",
        help="why: kept as the items' last reason and counted as a failure (at most 1,024 bytes, one line)",
    )

    renew = add_command(
        commands,
        "renew",
        common,
        _renew,
        help="set leases to end --lease-timeout from now",
        description=(
            "Set each lease's deadline to now + --lease-timeout (default: the queue's lease timeout).\n"
            "Counted from now, not added to the old deadline, so a short --lease-timeout can shorten a\n"
            "lease (as SQS's ChangeMessageVisibility does); one longer than the queue's expire timeout\n"
            "is refused (exit 3, nothing renewed). A lost lease exits 3 naming it."
        ),
    )
    renew.add_argument("queue_name", metavar="QUEUE")
    renew.add_argument("ids", nargs="*", metavar="ID", help=ids_help)
    _partition_option(renew)
    renew.add_argument("--lease-timeout", metavar="DURATION", help="new lease length (default: the queue's)")


def _partition_option(parser: argparse.ArgumentParser, what: str = "the lease") -> None:
    parser.add_argument("--partition", "-p", type=int, default=None, help=f"partition of {what} (default 0)")
    parser.set_defaults(intermixed=True)


def _partition(args: argparse.Namespace) -> int:
    return 0 if args.partition is None else int(args.partition)


def _partition_hint(
    args: argparse.Namespace, client: Client, error: ItemNotLeasedError, ids: list[str]
) -> None:
    """Add a hint to a stale-id error when the likely cause is a missing ``-p``: every id failed, and
    they may be of a lease of another partition of a queue that has several."""
    if args.partition is not None or set(error.failed_ids) != set(ids):
        return
    try:
        partitions = client.queue_info(args.queue_name).requested_partitions
    except ApiError:
        return
    if partitions > 1:
        error.message += (
            f"; {args.queue_name} has {partitions} partitions and these ids were sent for partition 0: "
            f"give the lease's partition with -p (querator lease prints it)"
        )


#: How older servers word a per-id failure: "N id(s) not applied, the others were: <the failed ids>",
#: which reads as if the listed ids were the applied ones.
_OLD_FAILURE_WORDING: Final = re.compile(r"\b\d+ id\(s\) not applied, the others were: ")


def _name_failures(error: ItemNotLeasedError, ids: list[str]) -> None:
    """Make a per-id failure from an older server read as today's do: how many of the ids sent
    failed, each failed id with its reason, then how many were applied. Today's wording is kept."""
    match = _OLD_FAILURE_WORDING.search(error.message)
    if match is None:
        return
    sent = len(dict.fromkeys(ids))
    failed = len(dict.fromkeys(error.failed_ids))
    applied = max(sent - failed, 0)
    error.message = (
        f"{error.message[: match.start()]}{failed} of {sent} id(s) failed and were not applied: "
        f"{error.message[match.end() :]}; "
        + (f"the other {applied} were applied" if applied else "none was applied")
    )


def _ids(args: argparse.Namespace) -> list[str]:
    ids = [i for i in args.ids if i != "-"]
    if not args.ids or "-" in args.ids:
        ids += [line.strip() for line in sys.stdin if line.strip()]
    if not ids:
        raise CliError("no item ids given", ExitCode.USAGE)
    return ids


def _done(args: argparse.Namespace, verb: str, ids: list[str], *, dead_queue: str = "") -> int:
    if args.output == "json":
        body = {"queue_name": args.queue_name, "partition": _partition(args), verb: ids}
        print_json({**body, "dead_queue": dead_queue} if dead_queue else body)
    else:
        to = f" to {dead_queue}" if dead_queue else ""
        print(f"{verb} {len(ids)} item(s) of {shown(args.queue_name)}{to}")  # noqa: T201
    return ExitCode.OK


def _complete(args: argparse.Namespace) -> int:
    ids = _ids(args)
    with make_client(args) as client:
        try:
            client.complete(args.queue_name, ids, partition=_partition(args))
        except ItemNotLeasedError as exc:
            _name_failures(exc, ids)
            _partition_hint(args, client, exc, ids)
            raise
    return _done(args, "completed", ids)


def _retry(args: argparse.Namespace) -> int:
    if args.dead and args.priority is not None:
        raise CliError(
            "--priority sets the priority an item comes back with; a dead letter keeps its own: drop "
            "--priority or --dead",
            ExitCode.USAGE,
        )
    ids = _ids(args)
    retry_at: str | None = args.at
    retry_in = parse_delay(args.delay, "--in") if args.delay else None
    with make_client(args) as client:
        dead_queue = ""
        if args.dead:
            # The server deletes an item sent "dead" from a queue without a dead-letter queue; a
            # command called --dead must not delete it and say "dead-lettered".
            dead_queue = client.queue_info(args.queue_name).dead_queue
            if not dead_queue:
                raise CliError(
                    f"queue '{args.queue_name}' has no dead-letter queue, so --dead would delete the "
                    f"item(s); nothing was done. Set one with: querator queues update {args.queue_name} "
                    f"--dead-queue NAME (or delete them with: querator complete)",
                    ExitCode.BAD_REQUEST,
                )
        try:
            client.retry(
                args.queue_name,
                [
                    RetryItem(
                        id=i,
                        retry_at=retry_at,
                        retry_in=retry_in,
                        dead=args.dead,
                        priority=args.priority,
                        reason=args.reason,
                    )
                    for i in ids
                ],
                partition=_partition(args),
            )
        except ItemNotLeasedError as exc:
            _name_failures(exc, ids)
            _partition_hint(args, client, exc, ids)
            raise
    if args.dead:
        return _done(args, "dead-lettered", ids, dead_queue=dead_queue)
    return _done(args, "retried", ids)


def _renew(args: argparse.Namespace) -> int:
    ids = _ids(args)
    with make_client(args) as client:
        try:
            renewal = client.renew(
                args.queue_name, ids, partition=_partition(args), lease_timeout=args.lease_timeout
            )
        except ItemNotLeasedError as exc:
            _name_failures(exc, ids)
            _partition_hint(args, client, exc, ids)
            raise
    rows = [[r.id, r.lease_deadline] for r in renewal.items]
    if args.output == "json":
        print_json(
            {
                "queue_name": renewal.queue_name,
                "partition": renewal.partition,
                "items": [{"id": i, "lease_deadline": d} for i, d in rows],
            }
        )
    else:
        print(table(["ID", "LEASE DEADLINE"], rows))  # noqa: T201
    return ExitCode.OK


# -- reprioritize -------------------------------------------------------------------------------------


def _register_reprioritize(commands: Any, common: argparse.ArgumentParser) -> None:
    reprioritize = add_command(
        commands,
        "reprioritize",
        common,
        _reprioritize,
        help="give items a new priority (waiting and scheduled ones get a new id)",
        description=(
            "Give items of one partition (-p) priority N (queue.reprioritize; 0-9, lower leases first).\n"
            "A waiting item moves to the tail of priority N under a new id; a scheduled one keeps its\n"
            "time under a new id; a leased one keeps its id and lease and comes back with priority N;\n"
            "one that has priority N already keeps its id. Prints each id with the id it has now.\n"
            "An unknown or gone id exits 3 naming it; the others apply (see their new ids with peek)."
        ),
    )
    reprioritize.add_argument("queue_name", metavar="QUEUE")
    reprioritize.add_argument(
        "ids", nargs="*", metavar="ID", help="item ids (peek, lease); '-' or none: read them from stdin"
    )
    _partition_option(reprioritize, "the items (as peek or lease printed it)")
    reprioritize.add_argument(
        "--priority",
        type=priority_arg,
        required=True,
        metavar="N",
        help="the new priority: 0-9, lower leases first",
    )


def _reprioritize(args: argparse.Namespace) -> int:
    ids = _ids(args)
    partition = _partition(args)
    with make_client(args) as client:
        try:
            moved = client.reprioritize(args.queue_name, ids, args.priority, partition=partition)
        except ItemNotLeasedError as exc:
            _name_failures(exc, ids)
            _partition_hint(args, client, exc, ids)
            applied = len(set(ids) - set(exc.failed_ids))
            if exc.failed_ids and applied:
                # The reply that would have named their new ids is the error: say where to find them.
                exc.message += (
                    f"; {applied} other id(s) now have priority {args.priority} (querator peek "
                    f"{args.queue_name} lists the new ids)"
                )
            raise
    if args.output == "json":
        print_json(
            {
                "queue_name": args.queue_name,
                "partition": partition,
                "items": [{"id": old, "new_id": new} for old, new in moved.items()],
            }
        )
    else:
        print(table(["ID", "NEW ID"], list(moved.items())))  # noqa: T201
    return ExitCode.OK


# -- stats and watch ----------------------------------------------------------------------------------


def _register_stats(commands: Any, common: argparse.ArgumentParser) -> None:
    stats = add_command(
        commands,
        "stats",
        common,
        _stats,
        help="counts and ages per partition",
        description="Items, leased items, scheduled items and average ages per partition, with totals.",
    )
    stats.add_argument("queue_name", metavar="QUEUE")

    watch = add_command(
        commands,
        "watch",
        common,
        _watch,
        help="live stats, refreshed every --interval",
        description="Show the stats of a queue again every --interval until Ctrl-C (or --count times).",
    )
    watch.add_argument("queue_name", metavar="QUEUE")
    watch.add_argument("--interval", default="2s", metavar="DURATION", help="refresh interval (default 2s)")
    watch.add_argument("--count", type=int, default=None, help="stop after this many refreshes")


STATS_HEADERS: Final = ["PARTITION", "ITEMS", "LEASED", "SCHEDULED", "AVG AGE", "AVG LEASED AGE"]


def stats_table(stats: QueueStats) -> str:
    rows: list[list[Any]] = [
        [p.partition, p.total, p.total_leased, p.scheduled, p.average_age, p.average_leased_age]
        for p in stats.partitions
    ]
    rows.append(["all", stats.total, stats.total_leased, stats.scheduled, "", ""])
    return table(STATS_HEADERS, rows)


def _stats_json(stats: QueueStats) -> dict[str, Any]:
    return {
        "queue_name": stats.queue_name,
        "total": stats.total,
        "total_leased": stats.total_leased,
        "scheduled": stats.scheduled,
        "partitions": [
            {
                "partition": p.partition,
                "total": p.total,
                "total_leased": p.total_leased,
                "scheduled": p.scheduled,
                "average_age": p.average_age,
                "average_leased_age": p.average_leased_age,
            }
            for p in stats.partitions
        ],
    }


def _stats(args: argparse.Namespace) -> int:
    with make_client(args) as client, Waiting(f"counting the items of {args.queue_name}"):
        stats = client.stats(args.queue_name)
    if args.output == "json":
        print_json(_stats_json(stats))
    else:
        print(stats_table(stats))  # noqa: T201
    return ExitCode.OK


def _watch(args: argparse.Namespace) -> int:
    interval = seconds(args.interval, "--interval")
    if interval <= 0:
        raise CliError("--interval must be positive", ExitCode.BAD_REQUEST)
    redraw = sys.stdout.isatty() and args.output == "table"
    refreshes = 0
    with make_client(args) as client:
        try:
            while args.count is None or refreshes < args.count:
                stats = client.stats(args.queue_name)
                refreshes += 1
                stamp = datetime.now(UTC).strftime("%H:%M:%S")
                if args.output == "json":
                    print_json({"at": datetime.now(UTC), **_stats_json(stats)})
                else:
                    if redraw:
                        # Home and clear: the table replaces itself instead of scrolling.
                        sys.stdout.write("\x1b[H\x1b[2J")
                    print(f"{shown(args.queue_name)} at {stamp} (every {args.interval}, Ctrl-C to stop)")  # noqa: T201
                    print(stats_table(stats))  # noqa: T201
                    if not redraw:
                        print()  # noqa: T201
                sys.stdout.flush()
                if args.count is not None and refreshes >= args.count:
                    break
                time.sleep(interval)
        except KeyboardInterrupt:
            # Ctrl-C is how a watch ends.
            return ExitCode.OK
    return ExitCode.OK


# -- dead letters -------------------------------------------------------------------------------------


def _register_dead_letters(commands: Any, common: argparse.ArgumentParser) -> None:
    dead = add_command(
        commands,
        "dead-letters",
        common,
        _dead_letters,
        help="list the items in a queue's dead-letter queue",
        description=(
            "List the items of QUEUE's dead-letter queue (its dead_queue setting), every partition,\n"
            "with each item's source queue and source_id (its last id there), attempts, failures and\n"
            "last reason: why it was dead-lettered ('max attempts: ValueError: ...'). With --direct,\n"
            "QUEUE is itself the dead-letter queue."
        ),
    )
    dead.add_argument("queue_name", metavar="QUEUE")
    dead.add_argument("--direct", action="store_true", help="QUEUE is the dead-letter queue itself")
    dead.add_argument("--limit", type=int, default=None, help="at most this many items (default: all)")


def _dead_letters(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        info = client.queue_info(args.queue_name)
        if args.direct:
            dead_info = info
        elif not info.dead_queue:
            raise CliError(
                f"queue '{args.queue_name}' has no dead-letter queue (set one with: querator queues update "
                f"{args.queue_name} --dead-queue NAME); use --direct to list QUEUE itself",
                ExitCode.BAD_REQUEST,
            )
        else:
            dead_info = client.queue_info(info.dead_queue)
        items = _stored_items(client, dead_info, limit=args.limit)
    if args.output == "json":
        print_json(_items_json(dead_info.queue_name, items))
    else:
        print(f"dead-letter queue {shown(dead_info.queue_name)}: {len(items)} item(s)")  # noqa: T201
        rows = [
            [
                p,
                i.id,
                i.source_queue,
                i.source_id,
                i.attempts,
                i.failures,
                i.priority,
                i.created_at,
                i.reference,
                preview(i.payload, 40),
                reason_cell(i.last_reason),
            ]
            for p, i in items
        ]
        headers = [
            "PARTITION",
            "ID",
            "SOURCE QUEUE",
            "SOURCE ID",
            "ATTEMPTS",
            "FAILURES",
            "PRIORITY",
            "CREATED",
            "REFERENCE",
            "PAYLOAD",
            "LAST REASON",
        ]
        print(table(headers, rows))  # noqa: T201
    return ExitCode.OK


def _register_redrive(commands: Any, common: argparse.ArgumentParser) -> None:
    redrive = add_command(
        commands,
        "redrive",
        common,
        _redrive,
        help="move a dead-letter queue's items back to the queues they came from",
        description=(
            "Move the items of the dead-letter queue DLQ back (queue.redrive, repeated until none\n"
            "remain): each to the queue it was dead-lettered from, or all to --to QUEUE. They keep\n"
            "payload, reference, encoding and kind, and start again at attempts 0. Interrupting and\n"
            "running it again moves each item exactly once. Items leased in DLQ stay; items whose\n"
            "queue no longer exists stay too (reported as stranded: move them with --to)."
        ),
    )
    redrive.add_argument("queue_name", metavar="DLQ")
    redrive.add_argument("--to", metavar="QUEUE", help="move every item to QUEUE instead")
    redrive.add_argument("--limit", type=int, default=None, help="at most this many items (default: all)")
    redrive.add_argument(
        "--rate", type=float, default=None, metavar="R", help="at most R items a second (default: no pacing)"
    )


def _redrive(args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit < 1:
        raise CliError("--limit must be at least 1", ExitCode.USAGE)
    if args.rate is not None and args.rate <= 0:
        raise CliError("--rate must be above 0", ExitCode.USAGE)
    moved = remaining = stranded = 0
    with make_client(args) as client:
        stats = client.stats(args.queue_name)
        total = sum(p.total + p.scheduled for p in stats.partitions)
        if args.limit is not None:
            total = min(total, args.limit)
        progress = Progress(total, label=f"redrive {args.queue_name}")
        try:
            for reply in client.redrive_all(args.queue_name, to=args.to, rate=args.rate, limit=args.limit):
                moved += reply.moved
                remaining, stranded = reply.remaining, reply.stranded
                progress.advance(moved, moved)
        finally:
            progress.close()
    if args.output == "json":
        print_json(
            {"queue_name": args.queue_name, "moved": moved, "remaining": remaining, "stranded": stranded}
        )
        return ExitCode.OK
    print(f"moved {moved} item(s) out of {shown(args.queue_name)}")  # noqa: T201
    if stranded:
        print(  # noqa: T201
            f"{stranded} item(s) stay: the queue they came from no longer exists (move them with --to QUEUE)"
        )
    if remaining:
        print(  # noqa: T201
            f"{remaining} item(s) remain"
            + (
                " (leased in the dead-letter queue: run it again once their leases end)"
                if args.limit is None
                else ""
            )
        )
    return ExitCode.OK


def _stored_items(
    client: Client,
    info: QueueInfo,
    *,
    limit: int | None,
    partition: int | None = None,
    scheduled: bool = False,
) -> list[tuple[int, StoredItem]]:
    """Items of every partition (or one), in partition then FIFO order, at most ``limit`` in all."""
    items: list[tuple[int, StoredItem]] = []
    partitions = range(info.requested_partitions) if partition is None else [partition]
    page = min(limit, 1000) if limit else 1000
    for number in partitions:
        for item in client.iter_items(info.queue_name, partition=number, scheduled=scheduled, page_size=page):
            if limit is not None and len(items) >= limit:
                return items
            items.append((number, item))
    return items


def _items_json(queue_name: str, items: list[tuple[int, StoredItem]]) -> dict[str, Any]:
    wire = []
    for partition, item in items:
        body = item.to_wire()
        text = utf8_or_none(item.payload)
        if text is not None:
            body["utf8"] = text
        wire.append({"partition": partition, **body})
    return {"queue_name": queue_name, "items": wire}


# -- peek and clear -----------------------------------------------------------------------------------


def _register_peek(commands: Any, common: argparse.ArgumentParser) -> None:
    peek = add_command(
        commands,
        "peek",
        common,
        _peek,
        help="show the items of a queue without leasing them",
        description=(
            "Show the first items of a queue in lease order (storage/items.list: priority, then FIFO),\n"
            "partition by partition, without leasing or changing them: id, whether leased, attempts,\n"
            "priority, group, created time, reference and payload, and when one of them failed, its\n"
            "failures and last reason. --scheduled shows the scheduled items (storage/scheduled.list)\n"
            "instead."
        ),
    )
    peek.add_argument("queue_name", metavar="QUEUE")
    peek.add_argument("-n", "--limit", type=int, default=10, help="at most this many items (default 10)")
    peek.add_argument("--partition", "-p", type=int, default=None, help="only this partition")
    peek.add_argument("--scheduled", action="store_true", help="the scheduled items instead")


def _peek(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise CliError("--limit must be at least 1", ExitCode.USAGE)
    with make_client(args) as client:
        info = client.queue_info(args.queue_name)
        items = _stored_items(
            client, info, limit=args.limit, partition=args.partition, scheduled=args.scheduled
        )
    if args.output == "json":
        print_json(_items_json(args.queue_name, items))
        return ExitCode.OK
    kind = "scheduled item(s)" if args.scheduled else "item(s)"
    print(f"{shown(args.queue_name)}: first {len(items)} {kind}")  # noqa: T201
    rows = [
        [
            p,
            i.id,
            i.is_leased,
            i.attempts,
            i.priority,
            i.group,
            i.enqueue_at if args.scheduled else i.created_at,
            i.reference,
            preview(i.payload, 40),
        ]
        for p, i in items
    ]
    when = "ENQUEUE AT" if args.scheduled else "CREATED"
    headers = ["PARTITION", "ID", "LEASED", "ATTEMPTS", "PRIORITY", "GROUP", when, "REFERENCE", "PAYLOAD"]
    if failure_columns([i for _, i in items]):
        headers += ["FAILURES", "LAST REASON"]
        rows = [
            [*row, i.failures, reason_cell(i.last_reason)] for row, (_, i) in zip(rows, items, strict=True)
        ]
    print(table(headers, rows))  # noqa: T201
    return ExitCode.OK


def _register_clear(commands: Any, common: argparse.ArgumentParser) -> None:
    clear = add_command(
        commands,
        "clear",
        common,
        _clear,
        help="remove the waiting items of a queue (purge)",
        description=(
            "Remove the items of a queue that wait to be leased (queue.clear); the queue stays.\n"
            "--scheduled also removes scheduled items, --leased also leased ones (their consumers'\n"
            "complete / retry then fail), --all all three. --only-scheduled leaves waiting items."
        ),
    )
    clear.add_argument("queue_name", metavar="QUEUE")
    clear.add_argument("--scheduled", action="store_true", help="also the scheduled items")
    clear.add_argument("--leased", action="store_true", help="also the leased items (destructive)")
    clear.add_argument("--all", action="store_true", help="waiting, scheduled and leased items")
    clear.add_argument(
        "--only-scheduled", action="store_true", help="only the scheduled items, not the waiting ones"
    )


def _clear(args: argparse.Namespace) -> int:
    scheduled = args.scheduled or args.all or args.only_scheduled
    waiting = not args.only_scheduled
    leased = args.leased or args.all
    if args.only_scheduled and (args.leased or args.all):
        raise CliError(
            "--only-scheduled leaves waiting and leased items: drop --leased / --all", ExitCode.USAGE
        )
    with make_client(args) as client, Waiting(f"clearing {args.queue_name}"):
        client.clear(args.queue_name, queue=waiting, scheduled=scheduled, destructive=leased)
    what = [name for name, on in (("waiting", waiting), ("scheduled", scheduled), ("leased", leased)) if on]
    if args.output == "json":
        print_json({"queue_name": args.queue_name, "cleared": what})
    else:
        print(f"cleared the {', '.join(what)} items of {shown(args.queue_name)}")  # noqa: T201
    return ExitCode.OK
