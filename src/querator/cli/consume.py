"""``querator consume QUEUE -- COMMAND``: the consumer worker (``querator.client.worker``) running a
command per item.

Each item's payload goes to the command's stdin and its details to environment variables. Exit 0
completes the item, ``--dead-letter-exit`` sends it to the dead-letter queue, any other exit retries it
with backoff, the exit status and the tail of the command's stderr as the item's failure reason; the
worker renews the lease while the command runs and, on SIGTERM / Ctrl-C, stops leasing, lets running
commands finish for ``--shutdown-timeout`` and puts back every item it holds.
"""

from __future__ import annotations

import collections
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from querator.cli.commands import add_command, make_client, seconds
from querator.cli.output import CliError, ExitCode, print_json
from querator.client import (
    MAX_REASON_BYTES,
    DeadLetter,
    WorkerReport,
    consume,
    default_backoff,
    failure_reason,
    reason_text,
)

#: Where ``consume --stream`` connects when ``--stream-url`` is not given (a deployed stack's StreamUrl).
STREAM_URL_ENV: Final = "QUERATOR_STREAM_URL"

if TYPE_CHECKING:
    import argparse

    from querator.client import LeasedItem

#: The most a retry waits, whatever --backoff (SQS's longest visibility delay is 12 h; 5 min keeps a
#: failing item in sight).
BACKOFF_CAP: Final = 300.0
#: How long a command gets after SIGTERM before SIGKILL, once the worker has put its item back.
_KILL_GRACE: Final = 5.0
#: How long to wait, once a command exited, for the rest of its stderr (held open only by a process
#: it left running in the background).
_TAIL_WAIT: Final = 1.0
#: The environment variables each command gets (docs/cli.md).
ENV_QUEUE: Final = "QUERATOR_QUEUE"
ENV_ID: Final = "QUERATOR_ITEM_ID"
ENV_PARTITION: Final = "QUERATOR_ITEM_PARTITION"
ENV_ATTEMPTS: Final = "QUERATOR_ITEM_ATTEMPTS"
ENV_REFERENCE: Final = "QUERATOR_ITEM_REFERENCE"
ENV_KIND: Final = "QUERATOR_ITEM_KIND"
ENV_ENCODING: Final = "QUERATOR_ITEM_ENCODING"
ENV_PRIORITY: Final = "QUERATOR_ITEM_PRIORITY"
#: The item's group ("" when it has none): in a fair queue, the tenant the command works for.
ENV_GROUP: Final = "QUERATOR_ITEM_GROUP"

log = logging.getLogger(__name__)


#: Bytes of a command's stderr kept for its failure reason (its end; more than the reason takes,
#: since runs of whitespace become one space).
STDERR_TAIL_BYTES: Final = 4 * MAX_REASON_BYTES


class CommandFailedError(Exception):
    """The command exited with a status other than 0 and the dead-letter one: retry the item. Its
    message is the failure reason: the exit status and the tail of the command's stderr."""


def _reason(exc: BaseException) -> str:
    """The command's own words (``"sh exited 3: ..."``) rather than a Python type name; any other
    exception (the command could not start) by the worker's rule."""
    if isinstance(exc, CommandFailedError | DeadLetter):
        return str(exc)
    return failure_reason(exc)


def failure_text(program: str, code: int, stderr: bytes) -> str:
    """The failure reason of a command that exited ``code`` (negative: killed by that signal), with
    the tail of what it wrote on stderr: ``"sh exited 3: error: no such file"``, one line, the end of
    the stderr kept within ``MAX_REASON_BYTES``."""
    if code < 0:
        try:
            how = f"{program} was killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"{program} was killed by signal {-code}"
    else:
        how = f"{program} exited {code}"
    head = reason_text(how, limit=MAX_REASON_BYTES // 2)
    tail = reason_text(
        stderr.decode("utf-8", errors="replace"),
        keep_end=True,
        limit=MAX_REASON_BYTES - len(head.encode()) - 2,
    )
    return f"{head}: {tail}" if tail else head


class StderrTail:
    """Copies a command's stderr (``fd``) to ours (``out``) as it comes (the command's output is the
    user's to see) and keeps its last ``STDERR_TAIL_BYTES``, in a thread of its own; closes ``fd`` at
    its end."""

    def __init__(self, fd: int, out: int = 2) -> None:
        self._fd = fd
        self._out = out
        self._kept: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._copy, name="querator-stderr", daemon=True)
        self._thread.start()

    def _copy(self) -> None:
        try:
            while chunk := os.read(self._fd, 65536):
                _write_all(self._out, chunk)
                with self._lock:
                    self._kept.append(chunk)
                    self._size += len(chunk)
                    while self._size - len(self._kept[0]) >= STDERR_TAIL_BYTES:
                        self._size -= len(self._kept.popleft())
        finally:
            os.close(self._fd)

    def tail(self, wait: float) -> bytes:
        """What was kept, once the command's stderr closed or ``wait`` seconds passed (a process the
        command left running in the background may hold it open)."""
        self._thread.join(wait)
        with self._lock:
            return b"".join(self._kept)[-STDERR_TAIL_BYTES:]


def _write_all(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError:
        pass  # our own stderr is gone (closed, a broken pipe): the tail is still kept


def register(commands: Any, common: argparse.ArgumentParser) -> None:
    parser = add_command(
        commands,
        "consume",
        common,
        _consume,
        help="run a command for each item (payload on stdin) until stopped",
        usage="querator consume [options] QUEUE -- COMMAND [ARG ...]",
        description=(
            "Lease items of QUEUE and run COMMAND once per item, the payload on its stdin and the\n"
            f"item in ${ENV_QUEUE}, ${ENV_ID}, ${ENV_PARTITION}, ${ENV_ATTEMPTS},\n"
            f"${ENV_REFERENCE}, ${ENV_KIND}, ${ENV_ENCODING}, ${ENV_PRIORITY}, ${ENV_GROUP}.\n"
            "Put COMMAND after '--'.\n"
            "Exit 0 completes the item; --dead-letter-exit CODE sends it to the dead-letter queue\n"
            "(deleted when the queue has none); any other exit puts it back after a backoff that\n"
            "doubles per attempt (--backoff, up to 5m, half of it random), and the queue's\n"
            "max_attempts dead-letters it in the end. Each failure gives the item its reason: the\n"
            "exit status and the end of COMMAND's stderr ('sh exited 3: error: ...'), which\n"
            "peek, lease and dead-letters show. COMMAND's stderr is passed through as it comes.\n"
            "Leases are renewed while COMMAND runs.\n"
            "SIGTERM or Ctrl-C: stop leasing, let running commands finish for --shutdown-timeout,\n"
            "then put back every item still held (a second signal: at once) and exit 0.\n"
            "A summary goes to stderr (-o json: to stdout, after the commands' own output)."
        ),
    )
    # Without "--", an option of COMMAND ("sh -c ...") would be read as one of consume's.
    parser.set_defaults(
        usage_hint="; put COMMAND after '--': querator consume QUEUE [options] -- COMMAND [ARG...]"
    )
    parser.add_argument("queue_name", metavar="QUEUE")
    parser.add_argument(
        "command", nargs="+", metavar="COMMAND", help="the command and its arguments, after --"
    )
    parser.add_argument(
        "--concurrency", type=int, default=1, metavar="N", help="commands running at once (default 1)"
    )
    parser.add_argument(
        "--batch-size",
        "-n",
        type=int,
        default=None,
        metavar="N",
        help="most items per lease call (default: --concurrency)",
    )
    parser.add_argument(
        "--wait",
        default="5s",
        metavar="DURATION",
        help="how long each lease call waits for items (default 5s)",
    )
    parser.add_argument(
        "--dead-letter-exit",
        type=int,
        default=None,
        metavar="CODE",
        help="this exit status sends the item to the dead-letter queue at once",
    )
    parser.add_argument(
        "--backoff", default="1s", metavar="DURATION", help="delay before the first retry (default 1s)"
    )
    parser.add_argument(
        "--shutdown-timeout",
        default="10s",
        metavar="DURATION",
        help="how long a stop lets running commands finish (default 10s)",
    )
    parser.add_argument("--max-items", type=int, default=None, metavar="N", help="stop after this many items")
    parser.add_argument(
        "--idle", default=None, metavar="DURATION", help="stop once nothing was leasable for this long"
    )
    parser.add_argument(
        "--idle-backoff",
        default="1s",
        metavar="DURATION",
        help="pause after a lease call that found nothing, doubling per empty call (default 1s; 0s: none)",
    )
    parser.add_argument(
        "--idle-backoff-max",
        default="15s",
        metavar="DURATION",
        help="the longest such pause (default 15s)",
    )
    parser.add_argument(
        "--stream-url",
        default=os.environ.get(STREAM_URL_ENV) or None,
        metavar="URL",
        help=f"the stream's WebSocket URL: a deployed stack's StreamUrl output (default: ${STREAM_URL_ENV}, "
        "or the server's own /v1/stream)",
    )
    parser.add_argument(
        "--stream",
        action="store_true",
        help="have items pushed over the server's stream (credit: --concurrency) instead of "
        "long-polling; long-polls where the server has none",
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="log each failed item on stderr")


def _consume(args: argparse.Namespace) -> int:
    if args.concurrency < 1 or (args.batch_size is not None and not 1 <= args.batch_size <= 1000):
        raise CliError("--concurrency must be at least 1 and --batch-size 1-1000", ExitCode.USAGE)
    program = args.command[0]
    if shutil.which(program) is None:
        raise CliError(f"command not found: {program}", ExitCode.ERROR)
    wait = seconds(args.wait, "--wait")
    base = seconds(args.backoff, "--backoff")
    shutdown = seconds(args.shutdown_timeout, "--shutdown-timeout")
    idle = seconds(args.idle, "--idle") if args.idle else None
    idle_backoff = seconds(args.idle_backoff, "--idle-backoff")
    idle_backoff_max = max(idle_backoff, seconds(args.idle_backoff_max, "--idle-backoff-max"))
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="querator consume: %(message)s")
    if args.verbose:
        logging.getLogger("querator.client.worker").setLevel(logging.INFO)
    runner = _Runner(args.queue_name, list(args.command), args.dead_letter_exit)
    with make_client(args) as client:
        client.stream_url = args.stream_url
        info = client.queue_info(args.queue_name)
        if args.dead_letter_exit is not None and not info.dead_queue:
            print(  # noqa: T201
                f"querator consume: note: {args.queue_name} has no dead-letter queue, so an item whose "
                f"command exits {args.dead_letter_exit} is deleted",
                file=sys.stderr,
            )
        try:
            report = consume(
                client,
                args.queue_name,
                runner.run,
                batch_size=args.batch_size or args.concurrency,
                concurrency=args.concurrency,
                request_timeout=wait,
                backoff=lambda attempts: default_backoff(attempts, base=base, cap=BACKOFF_CAP),
                shutdown_timeout=shutdown,
                max_items=args.max_items,
                idle_timeout=idle,
                idle_backoff=idle_backoff,
                idle_backoff_max=idle_backoff_max,
                mode="stream" if args.stream else "poll",
                reason=_reason,
            )
        finally:
            # Items of commands still running were put back; their commands must not go on.
            runner.stop_all()
    _summary(args, report)
    return ExitCode.OK


def _summary(args: argparse.Namespace, report: WorkerReport) -> None:
    if args.output == "json":
        print_json(report.as_dict())
        return
    print(  # noqa: T201
        f"querator consume: stopped ({report.stopped_by}) after {report.elapsed:.1f} s: "
        f"{report.leased} leased, {report.completed} completed, {report.retried} retried, "
        f"{report.dead_lettered} dead-lettered, {report.returned} put back, {report.lost} lost, "
        f"{report.unsettled} unsettled",
        file=sys.stderr,
    )


class _Runner:
    """Runs the command for one item; called from the worker's handler threads."""

    def __init__(self, queue_name: str, command: list[str], dead_letter_exit: int | None) -> None:
        self.queue_name = queue_name
        self.command = command
        self.dead_letter_exit = dead_letter_exit
        self._running: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()

    def run(self, item: LeasedItem) -> None:
        env = {
            **os.environ,
            ENV_QUEUE: self.queue_name,
            ENV_ID: item.id,
            ENV_PARTITION: str(item.partition),
            ENV_ATTEMPTS: str(item.attempts),
            ENV_REFERENCE: item.reference,
            ENV_KIND: item.kind,
            ENV_ENCODING: item.encoding,
            ENV_PRIORITY: str(item.priority),
            ENV_GROUP: item.group,
        }
        # Its stderr through a pipe of ours, copied to our stderr as it comes, so its tail can go
        # with a failure (a pipe rather than Popen's, which communicate() would read to the end).
        read_end, write_end = os.pipe()
        try:
            # Its own session: Ctrl-C in the terminal stops the consumer, which lets the command
            # finish (--shutdown-timeout) instead of the terminal killing it mid-item.
            child = subprocess.Popen(  # noqa: S603 - the user's own command, by design
                self.command, stdin=subprocess.PIPE, stderr=write_end, env=env, start_new_session=True
            )
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        stderr = StderrTail(read_end)
        with self._lock:
            self._running.add(child)
        try:
            # Writes the payload, closes stdin (a command that does not read it is fine) and waits.
            child.communicate(item.payload)
        finally:
            with self._lock:
                self._running.discard(child)
        code = child.returncode
        if code == 0:
            stderr.tail(_TAIL_WAIT)  # what it wrote reaches our stderr before the next item's
            return
        # The program's name, not its path: the reason's 1,024 bytes are for what went wrong.
        reason = failure_text(Path(self.command[0]).name, code, stderr.tail(_TAIL_WAIT))
        if self.dead_letter_exit is not None and code == self.dead_letter_exit:
            raise DeadLetter(reason)
        raise CommandFailedError(reason)

    def stop_all(self) -> None:
        """SIGTERM, then SIGKILL after a grace period, to every command still running."""
        with self._lock:
            running = list(self._running)
        for child in running:
            child.terminate()
        for child in running:
            try:
                child.wait(timeout=_KILL_GRACE)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
