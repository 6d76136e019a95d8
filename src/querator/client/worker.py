"""Python client: the consumer worker, ``consume(client, queue_name, handler)``.

One thread leases (the caller's, so it can own the signal handlers), ``concurrency`` threads run the
handler once per item, one thread renews the leases of items whose handler is still running, and one
sends the completes and retries in batches.
An item is completed when its handler returns, retried with backoff when it raises, and sent to the
dead-letter queue when it raises one of ``dead_letter_on``. On SIGTERM / SIGINT (or ``stop``) the
worker stops leasing, lets running handlers finish for up to ``shutdown_timeout`` and puts back at
once every item it still holds, so none waits for its lease to run out. See docs/client.md and
docs/adr/0033-consumer-worker.md.

With ``mode="stream"`` the items are pushed over a WebSocket (``querator.client.stream``) instead of
long-polled: the worker subscribes with a credit of ``concurrency`` and settles and renews over the
same connection, which gives the credit back. Where the endpoint has no stream it long-polls
instead. When the stream goes away (the server stops or restarts, the network drops, API Gateway's
two-hour limit) it subscribes again at once and, while that fails, long-polls and tries again with
back-off, streaming again as soon as a subscribe succeeds.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import random
import signal
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Final

from querator.client.errors import (
    ApiError,
    AuthError,
    BadRequestError,
    ConnectionFailedError,
    DuplicateClientError,
    ItemNotLeasedError,
    RetryError,
    ServerError,
    UnknownMethodError,
    UnsupportedContentError,
)
from querator.client.models import (
    Duration,
    LeasedItem,
    Renewal,
    RetryItem,
    duration_seconds,
    duration_to_wire,
    reason_text,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from types import FrameType

    from querator.client.client import Client
    from querator.client.stream import SharedStream

#: ``datetime.UTC`` is Python 3.11+; the package supports 3.10 (docs/adr/0021-python-and-spark-versions.md).
UTC = timezone.utc

log = logging.getLogger(__name__)

#: Errors of ``lease`` that another try cannot fix: the worker stops and raises them.
_FATAL: Final = (BadRequestError, AuthError, UnsupportedContentError, UnknownMethodError)
#: Most ids per complete / retry call (the API's limit).
MAX_IDS: Final = 1000
#: How often the waits of the lease loop look at the stop flag, in seconds.
_POLL: Final = 0.2
#: The longest a worker waits for a rate limit's ``next_lease_at`` before leasing again.
NEXT_LEASE_WAIT_MAX = 30.0
#: Pause after the first empty lease call, and the most it grows to (``consume``'s ``idle_backoff``).
DEFAULT_IDLE_BACKOFF: Final = 1.0
DEFAULT_IDLE_BACKOFF_MAX: Final = 15.0
#: How ``consume`` gets its items: long-polled ``queue.lease`` calls, or pushed over a stream.
MODES: Final = ("poll", "stream")
#: Pauses between tries to subscribe again once the stream went away (a server stopping or
#: restarting, a dropped network). The first try is at once (API Gateway ends every connection
#: after two hours, and a new subscribe works then); after the n-th failure in a row the next comes
#: ``RESUBSCRIBE_BACKOFF * 2**(n-1)`` seconds later, capped at ``RESUBSCRIBE_BACKOFF_MAX``, half of
#: it random (equal jitter) so the consumers of a restarted server do not all come back in the same
#: instant. The worker long-polls meanwhile, so the cap costs no work, only the stream's latency:
#: 5 s is how long a worker may keep polling a server whose stream is back; 0.1 s makes the tries
#: of a quick restart cheap (about 6 in the first 3 s).
RESUBSCRIBE_BACKOFF: Final = 0.1
RESUBSCRIBE_BACKOFF_MAX: Final = 5.0
#: ``pushed_by``'s mark for an item leased by polling in ``mode="stream"``: settled over HTTP, and
#: its handler thread, once free, gives its credit to the stream, as one pushed by an ended one.
_POLLED: Final = -1


class DeadLetter(Exception):  # noqa: N818 - an instruction to the worker, not an error report
    """Raise from a handler to send the item to the dead-letter queue now, without more attempts."""


class RetryLater(Exception):  # noqa: N818 - an instruction to the worker, not an error report
    """Raise from a handler to put the item back for another attempt after ``delay`` (a ``timedelta``,
    seconds or a duration string such as ``"30s"``), counted from the server's clock, instead of
    after the worker's backoff: ``raise RetryLater("30s")`` when the handler knows when to come back
    (a rate limit's ``Retry-After``). It uses an attempt, like any failure."""

    def __init__(self, delay: Duration, message: str = "") -> None:
        if duration_seconds(delay) < 0:
            raise ValueError(f"RetryLater takes a delay of 0 or more, not {delay!r}")
        super().__init__(message or f"retry in {duration_to_wire(delay)}")
        self.delay = delay


def failure_reason(exc: BaseException) -> str:
    """The reason the worker sends with the retry or dead letter of an item whose handler raised
    ``exc`` (the server keeps it as the item's ``last_reason``): a ``DeadLetter`` or ``RetryLater``
    says its own message (``DeadLetter("cannot handle it")``: ``"cannot handle it"``); any other
    exception its type and message (``"ValueError: bad input"``; the type alone when it has no
    message). On one line and cut to ``MAX_REASON_BYTES`` (``reason_text``)."""
    try:
        text = str(exc)
    # The exception is the user's: one whose __str__ fails still fails only its item, by its type.
    except Exception:
        text = ""
    if isinstance(exc, DeadLetter | RetryLater):
        return reason_text(text or type(exc).__name__)
    return reason_text(f"{type(exc).__name__}: {text}" if text.strip() else type(exc).__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerReport:
    """What a ``consume`` run did; every leased item is counted in exactly one of the outcome fields
    (``completed``, ``retried``, ``dead_lettered``, ``returned``, ``lost``, ``unsettled``)."""

    #: Items leased.
    leased: int = 0
    #: Handler returned; item completed.
    completed: int = 0
    #: Handler raised; item put back with a backoff (``retry_at``).
    retried: int = 0
    #: Handler raised ``dead_letter_on``, or raised on the last of ``max_attempts``.
    dead_lettered: int = 0
    #: Put back at once, unprocessed or still running, because the worker stopped.
    returned: int = 0
    #: The server said the lease was no longer ours (expired and re-leased): nothing was applied.
    lost: int = 0
    #: complete / retry failed for another reason; the lease will run out and the item come back.
    unsettled: int = 0
    #: Handler calls that raised (retried + dead-lettered, before the server had its say).
    failures: int = 0
    #: Successful lease renewals (per item).
    renewed: int = 0
    #: Failed API calls the worker survived (lease, renew, complete, retry), by backing off.
    errors: int = 0
    #: Seconds from start to return.
    elapsed: float = 0.0
    #: Why it stopped: ``"SIGTERM"``, ``"SIGINT"``, ``"stop"``, ``"max_items"``, ``"idle"``, ``"error"``,
    #: or (``stream_consume`` only) ``"closed"``: the server closed the stream.
    stopped_by: str = ""
    #: How items arrived: ``"poll"``, ``"stream"``, or ``"stream, then poll"``: streamed, and
    #: long-polled too while the stream was away (``subscribed`` says how often it came back).
    transport: str = "poll"
    #: Stream subscriptions opened: 1 when one connection lasted the whole run, one more each time
    #: the worker subscribed again after the stream went away; 0 when it never streamed.
    subscribed: int = 0
    #: How the server last ended the stream: its close code and reason (``"1001 server stopping"``),
    #: ``"1006"`` for a connection that ended without a close frame; ``""`` if it never did.
    closed_by: str = ""

    @property
    def settled(self) -> int:
        return self.completed + self.retried + self.dead_lettered + self.returned + self.lost + self.unsettled

    def as_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__} | {"settled": self.settled}


@dataclass(slots=True, eq=False)
class _Job:
    item: LeasedItem
    renew_at: float
    started: bool = False
    lost: bool = False
    #: complete / retry is on its way: neither renew it nor put it back.
    settling: bool = False


@dataclass(frozen=True, slots=True, eq=False)
class _Settlement:
    """A finished handler's verdict on its item: complete it (``retry`` is None) or retry it."""

    job: _Job
    retry: RetryItem | None
    outcome: str


@dataclass(slots=True, eq=False)
class _State:
    """Everything the threads share; guarded by ``lock``."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    idle: threading.Condition = field(init=False)
    jobs: dict[str, _Job] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    #: Set when the worker stops: queued jobs are put back instead of being started.
    stopping: bool = False

    def __post_init__(self) -> None:
        self.idle = threading.Condition(self.lock)

    def count(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.counts[key] += n


def resubscribe_pause(failures: int) -> float:
    """Seconds until the next try to subscribe after ``failures`` failed tries in a row (see
    ``RESUBSCRIBE_BACKOFF``)."""
    ceiling = min(RESUBSCRIBE_BACKOFF_MAX, RESUBSCRIBE_BACKOFF * 2.0 ** max(0, failures - 1))
    return ceiling / 2 + random.uniform(0, ceiling / 2)  # noqa: S311 - jitter, not security


def default_backoff(attempts: int, *, base: float = 1.0, cap: float = 300.0) -> timedelta:
    """Delay before the next attempt of an item whose handler raised on lease number ``attempts``:
    ``base * 2**(attempts-1)`` seconds, capped, with half of it random so failures spread out."""
    ceiling = min(cap, base * 2.0 ** max(0, attempts - 1))
    return timedelta(seconds=ceiling / 2 + random.uniform(0, ceiling / 2))  # noqa: S311 - jitter


def consume(
    client: Client,
    queue_name: str,
    handler: Callable[[LeasedItem], object],
    *,
    batch_size: int = 10,
    concurrency: int = 4,
    request_timeout: float = 5.0,
    backoff: Callable[[int], Duration] | None = None,
    dead_letter_on: type[BaseException] | tuple[type[BaseException], ...] = DeadLetter,
    renew_every: float | None = None,
    shutdown_timeout: float = 10.0,
    stop: threading.Event | None = None,
    max_items: int | None = None,
    idle_timeout: float | None = None,
    handle_signals: bool = True,
    idle_backoff: float = DEFAULT_IDLE_BACKOFF,
    idle_backoff_max: float = DEFAULT_IDLE_BACKOFF_MAX,
    mode: str = "poll",
    reason: Callable[[BaseException], str] = failure_reason,
) -> WorkerReport:
    """Lease items of ``queue_name`` and run ``handler(item)`` for each until stopped.

    Parameters
    ----------
    batch_size
        Most items per lease call (never more than the free handler threads).
    concurrency
        Handler threads, hence the most items leased at once.
    request_timeout
        Seconds a lease call waits for items (at most ``idle_timeout`` when that is set); also bounds
        how long a stop waits for the lease loop.
    backoff
        ``attempts -> delay`` before a failed item may be leased again (a ``timedelta``, seconds or a
        duration string such as ``"30s"``, counted from the server's clock); ``default_backoff`` if
        None. A handler that raises ``RetryLater(delay)`` sets the delay of its item itself.
    dead_letter_on
        Exception type(s) that send the item to the dead-letter queue at once.
    renew_every
        Seconds between renewals of a running item's lease; default half the queue's lease timeout.
    shutdown_timeout
        How long a stop lets running handlers finish before their items are put back.
    stop
        Set it (from any thread) to stop the worker; SIGTERM / SIGINT set it too.
    max_items
        Stop leasing after this many items and return once they are settled.
    idle_timeout
        Return once nothing was leasable for this many seconds and nothing is running.
    handle_signals
        Install SIGTERM / SIGINT handlers (main thread only) for the duration of the call; a second
        signal skips the wait for running handlers.
    idle_backoff, idle_backoff_max
        Seconds to pause after a lease call that found nothing, before the next one: the pause after
        the n-th empty call in a row is random in ``[0, min(idle_backoff_max, idle_backoff *
        2**(n-1))]`` (full jitter); the first item resets it. Behind API Gateway every lease call is
        a Lambda invocation, so an idle consumer that pauses costs a fraction of one that polls back
        to back (docs/capacity.md); ``0`` polls without pausing. An item produced during a pause
        waits for its end.
    mode
        ``"poll"`` (long-polled ``queue.lease`` calls) or ``"stream"``: items pushed over the
        endpoint's WebSocket stream with a credit of ``concurrency`` (``batch_size`` and the idle
        backoff do not apply; nothing is called while the queue is empty), settled and renewed over
        the same connection. Where the endpoint has no stream the worker long-polls instead. When
        the stream goes away (the server stopping or restarting: close 1001, or a connection ended
        without a close frame) it subscribes again at once and, while that fails, long-polls and
        tries again after 0.1 s doubling to 5 s (``RESUBSCRIBE_BACKOFF``), so it streams again
        soon after the server is back (``WorkerReport.transport``, ``subscribed``, ``closed_by``).
    reason
        ``exception -> text``: the reason sent with the retry or dead letter of an item whose
        handler raised (the server keeps it as the item's ``last_reason``); ``failure_reason`` (the
        type and message) by default. Its text is put on one line and cut to ``MAX_REASON_BYTES``
        (``reason_text``); if it raises, ``failure_reason`` is sent instead.

    Raises
    ------
    ApiError
        For an error that retrying cannot fix (unknown queue, not allowed), after putting back every
        item the worker held.
    """
    worker = _Worker(
        client,
        queue_name,
        handler,
        batch_size=batch_size,
        concurrency=concurrency,
        request_timeout=request_timeout,
        backoff=backoff or default_backoff,
        dead_letter_on=dead_letter_on,
        renew_every=renew_every,
        shutdown_timeout=shutdown_timeout,
        stop=stop or threading.Event(),
        max_items=max_items,
        idle_timeout=idle_timeout,
        idle_backoff=idle_backoff,
        idle_backoff_max=idle_backoff_max,
        mode=mode,
        reason=reason,
    )
    return worker.run(handle_signals=handle_signals)


class _Worker:
    def __init__(
        self,
        client: Client,
        queue_name: str,
        handler: Callable[[LeasedItem], object],
        *,
        batch_size: int,
        concurrency: int,
        request_timeout: float,
        backoff: Callable[[int], Duration],
        dead_letter_on: type[BaseException] | tuple[type[BaseException], ...],
        renew_every: float | None,
        shutdown_timeout: float,
        stop: threading.Event,
        max_items: int | None,
        idle_timeout: float | None,
        idle_backoff: float = 0.0,
        idle_backoff_max: float = 0.0,
        mode: str = "poll",
        reason: Callable[[BaseException], str] = failure_reason,
    ) -> None:
        self.reason = reason
        if batch_size < 1 or concurrency < 1:
            raise ValueError("batch_size and concurrency must be at least 1")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        self.mode = mode
        #: The stream the items come from in ``mode="stream"`` (None: long-polling).
        self.stream: SharedStream | None = None
        #: Settle and renew over the stream (which gives its credit back): only while taking items
        #: from it, so a stopping worker is pushed nothing more.
        self.streaming = False
        #: Long-polled at some time of a ``mode="stream"`` run (``WorkerReport.transport``).
        self.polled = False
        #: When to try to subscribe next (monotonic seconds); ``None``: no try planned (streaming,
        #: ``mode="poll"``, or an endpoint without a stream).
        self.resubscribe_at: float | None = None
        #: Failed tries to subscribe in a row (the back-off's exponent).
        self.resubscribe_failures = 0
        #: The server's last close of the stream (``WorkerReport.closed_by``).
        self.closed_by = ""
        self.last_item_at = time.monotonic()
        self.leased_total = 0
        #: Which subscription pushed each item it holds (``generation``, bumped at each reconnect).
        self.pushed_by: dict[str, int] = {}
        self.generation = 0
        #: Credit for the next connection, from items settled while it was being opened.
        self.owed_credit = 0
        if idle_backoff < 0 or idle_backoff_max < idle_backoff:
            raise ValueError("idle_backoff must be >= 0 and idle_backoff_max >= idle_backoff")
        self.idle_backoff = idle_backoff
        self.idle_backoff_max = idle_backoff_max
        self.client = client
        self.queue_name = queue_name
        self.handler = handler
        self.batch_size = batch_size
        self.concurrency = concurrency
        self.request_timeout = request_timeout
        self.backoff = backoff
        self.dead_letter_on = dead_letter_on
        self.renew_every = renew_every
        self.shutdown_timeout = shutdown_timeout
        self.stop = stop
        self.max_items = max_items
        self.idle_timeout = idle_timeout
        self.max_attempts = 0
        #: Set by a second signal: put back running items without waiting for their handlers.
        self.hurry = threading.Event()
        self.stopped_by = ""
        self.state = _State()
        self.work: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.renewer_done = threading.Event()
        self.settlements: queue.SimpleQueue[_Settlement] = queue.SimpleQueue()
        self.settler_done = threading.Event()

    # -- the run --------------------------------------------------------------------------------------

    def run(self, *, handle_signals: bool) -> WorkerReport:
        started = time.monotonic()
        # Fails fast on an unknown queue, and tells how long a lease lasts (the renew cadence).
        info = self.client.queue_info(self.queue_name)
        self.max_attempts = info.max_attempts
        if self.renew_every is None:
            self.renew_every = max(0.05, info.lease_timeout.total_seconds() / 2)
        if self.mode == "stream":
            self.stream = self._open_stream()
            self.streaming = self.stream is not None
        self.last_item_at = time.monotonic()
        previous = self._install_signals() if handle_signals else {}
        threads = [
            threading.Thread(target=self._run_handlers, name=f"querator-handler-{n}", daemon=True)
            for n in range(self.concurrency)
        ]
        renewer = threading.Thread(target=self._renew_loop, name="querator-renewer", daemon=True)
        settler = threading.Thread(target=self._settle_loop, name="querator-settler", daemon=True)
        for thread in [*threads, renewer, settler]:
            thread.start()
        fatal: ApiError | None = None
        try:
            self._lease_loop()
        except _FATAL as exc:
            fatal = exc
            self.stopped_by = "error"
        finally:
            self._shut_down(threads)
            self.renewer_done.set()
            self.settler_done.set()
            renewer.join(timeout=self.client.timeout)
            settler.join(timeout=self.client.timeout)
            self._close_stream()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        with self.state.lock:
            counts = dict(self.state.counts)
        report = WorkerReport(
            elapsed=time.monotonic() - started,
            stopped_by=self.stopped_by,
            transport=self._transport(counts.get("subscribed", 0)),
            closed_by=self.closed_by,
            **counts,
        )
        log.info("worker on %s stopped (%s): %s", self.queue_name, self.stopped_by, report.as_dict())
        if fatal is not None:
            raise fatal
        return report

    def _install_signals(self) -> dict[int, Callable[[int, FrameType | None], object] | int | None]:
        if threading.current_thread() is not threading.main_thread():
            return {}

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            if self.stop.is_set():
                self.hurry.set()
            self.stopped_by = self.stopped_by or signal.Signals(signum).name
            self.stop.set()

        previous: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, on_signal)
        return previous

    # -- the stream (mode="stream") ----------------------------------------------------------------

    def _transport(self, subscribed: int) -> str:
        if subscribed == 0:
            return "poll"
        return "stream, then poll" if self.polled else "stream"

    def _stream_ticket(self) -> str | None:
        """A fresh ``stream.ticket`` of the queue for a deployed stack's stream (its ``$connect``
        grant names no queue; the ticket does), or ``None`` when the server gives none: it then
        says itself, at the subscribe, whether it needs one."""
        ask = getattr(self.client, "stream_ticket", None)
        if ask is None:
            return None
        try:
            ticket, _ = ask(self.queue_name)
        except (ApiError, ConnectionFailedError) as exc:
            log.warning("no stream ticket for %s (%s); subscribing without", self.queue_name, exc)
            return None
        return str(ticket)

    def _open_stream(self, credit: int | None = None) -> SharedStream | None:
        """Subscribe with a credit of ``concurrency`` (never more than ``max_items``); ``None`` where
        that failed (the worker long-polls): for good where the endpoint has no stream, else with
        the next try planned (``resubscribe_at``)."""
        from querator.client.stream import SharedStream, StreamUnavailableError  # noqa: PLC0415 - imports us

        base_url = getattr(self.client, "base_url", None)
        url = getattr(self.client, "stream_url", None)
        if url is None and (
            not isinstance(base_url, str) or not base_url.startswith(("http://", "https://"))
        ):
            # The embedded library (in process: no socket to push over) or a client of its own.
            log.warning(
                "%s has no stream endpoint; long-polling %s", type(self.client).__name__, self.queue_name
            )
            self.resubscribe_at = None
            return None
        if credit is None:
            credit = self.concurrency
        if self.max_items is not None:
            credit = min(credit, self.max_items - self.leased_total)
        credit = max(1, credit)  # the protocol's least
        stream = SharedStream(
            str(base_url),
            self.queue_name,
            credit=credit,
            url=url,
            signer=getattr(self.client, "signer", None),
            ticket=self._stream_ticket() if url is not None else None,
        )
        try:
            stream.open()
        except StreamUnavailableError as exc:
            if exc.status is None or exc.status < 500:
                # An answer instead of the upgrade: this endpoint has no stream, and trying again
                # will not give it one (a 5xx, say a server past its ceiling, is tried again).
                log.warning("%s; long-polling %s", exc, self.queue_name)
                self.resubscribe_at = None
                stream.close()
                return None
            self._plan_resubscribe(exc)
        except AuthError as exc:
            # The stream is not granted for this queue (no ticket, or not one of this queue's); its
            # REST routes may be: long-poll, for good.
            log.warning("the stream refused %s (%s); long-polling", self.queue_name, exc)
            self.resubscribe_at = None
        except (ConnectionFailedError, ServerError, RetryError) as exc:
            # The server is away (stopping, restarting, not up yet) or busy: long-poll meanwhile.
            self._plan_resubscribe(exc)
        else:
            self.state.count("subscribed")
            self.resubscribe_at = None
            self.resubscribe_failures = 0
            return stream
        stream.close()
        return None

    def _plan_resubscribe(self, failure: Exception) -> None:
        self.resubscribe_failures += 1
        pause = resubscribe_pause(self.resubscribe_failures)
        self.resubscribe_at = time.monotonic() + pause
        # One warning per outage; the tries after it every few seconds would only repeat it.
        level = logging.WARNING if self.resubscribe_failures == 1 else logging.DEBUG
        log.log(
            level,
            "cannot open the stream of %s (%s); long-polling, next try in %.1f s",
            self.queue_name,
            failure,
            pause,
        )

    def _stream_went_away(self, stream: SharedStream) -> None:
        """The connection ended (the server stopped, restarted or dropped it; API Gateway ends every
        one after two hours): the items it pushed are settled over HTTP from now on, and the next
        subscribe is tried at once."""
        stream.close()
        with self.state.lock:
            # From now on the items the old connection pushed are "earlier" ones.
            self.generation += 1
            self.stream = None
            self.streaming = False
        from querator.client.stream import describe_close  # noqa: PLC0415 - imports us

        if stream.closed_by is not None:
            self.closed_by = describe_close(stream.closed_by)
        log.warning(
            "the stream of %s ended (%s); subscribing again",
            self.queue_name,
            stream.closed_by or "closed on this side",
        )
        self.resubscribe_failures = 0
        self.resubscribe_at = time.monotonic()

    def _resubscribe(self) -> bool:
        """One try to subscribe again, with the credit of the handler threads not busy: True when
        the worker streams again. Each busy one (an item an ended connection pushed, or one leased
        by polling) gives its credit to the new connection once it is settled."""
        with self.state.lock:
            # Settles from here until the new connection is open are owed to it (_both_ways).
            self.streaming = True
            busy = len(self.state.jobs)
        stream = self._open_stream(self.concurrency - busy)
        with self.state.lock:
            self.stream = stream
            self.streaming = stream is not None
            owed, self.owed_credit = self.owed_credit, 0
        if stream is None:
            return False
        if owed:
            with contextlib.suppress(ConnectionFailedError):
                stream.give_credit(owed)
        log.info("subscribed again to the stream of %s", self.queue_name)
        return True

    def _stream_loop(self, stream: SharedStream) -> bool:
        """Take pushed leases until the run ends (True) or the stream does (False: subscribe again,
        long-polling while that fails)."""
        while not self.stop.is_set():
            if self.max_items is not None and self.leased_total >= self.max_items:
                self.stopped_by = "max_items"
                return True
            try:
                lease = stream.pushed.get(timeout=_POLL)
            except queue.Empty:
                idle_for = time.monotonic() - self.last_item_at
                if self.idle_timeout is not None and idle_for >= self.idle_timeout:
                    with self.state.lock:
                        running = len(self.state.jobs)
                    if running == 0:
                        self.stopped_by = "idle"
                        return True
                continue
            if lease is None:
                if stream.failure is not None:
                    raise stream.failure  # the subscription itself failed (unknown queue, …)
                self._stream_went_away(stream)
                return False
            items = list(lease.items)
            keep = len(items) if self.max_items is None else max(0, self.max_items - self.leased_total)
            if len(items) > keep:
                # Pushed past max_items (the credit came back before the last one was counted).
                self._put_back(lease.partition, [item.id for item in items[keep:]])
                items = items[:keep]
            if not items:
                continue
            self.last_item_at = time.monotonic()
            self.leased_total += len(items)
            self.state.count("leased", len(items))
            with self.state.lock:
                self.pushed_by.update((item.id, self.generation) for item in items)
            self._accept(items)
        self.stopped_by = self.stopped_by or "stop"
        return True

    def _close_stream(self) -> None:
        stream, self.stream = self.stream, None
        if stream is None:
            return
        stream.close()  # the reader has ended: whatever was pushed is in ``pushed``
        # Pushed after the worker stopped taking items: leased to us, so put back at once (over HTTP).
        # An item the server sent as the connection closed is never read; its lease runs out.
        while True:
            try:
                lease = stream.pushed.get_nowait()
            except queue.Empty:
                break
            if lease is not None and lease.items:
                self._put_back(lease.partition, list(lease.ids))

    def _put_back(self, partition: int, ids: list[str]) -> None:
        try:
            self._retry(partition, [RetryItem(id=item_id) for item_id in ids])
        except (ApiError, ConnectionFailedError) as exc:
            log.warning("could not put back %d item(s) of %s (%s)", len(ids), self.queue_name, exc)

    # The calls on leased items go over the stream that pushed them while it is open (which gives
    # their credit back and keeps its deadlines true) and over HTTP otherwise: items leased by
    # polling, pushed by a connection that has ended, or when the stream could not send the call.

    def _split(self, ids: Sequence[str]) -> tuple[SharedStream | None, list[str], list[str]]:
        """The stream to use, the ids it pushed, and the rest."""
        stream = self.stream if self.streaming else None
        with self.state.lock:
            ours = [i for i in ids if stream is not None and self.pushed_by.get(i) == self.generation]
        mine = set(ours)
        return stream, ours, [i for i in ids if i not in mine]

    def _both_ways(
        self,
        ids: Sequence[str],
        on_stream: Callable[[SharedStream, list[str]], object],
        on_http: Callable[[list[str]], object],
        *,
        settles: bool,
    ) -> None:
        """``on_stream`` for the current stream's ids, ``on_http`` for the rest; failed ids of both
        are raised together as one ``ItemNotLeasedError``. A settle of an item an ended connection
        pushed gives its credit to the current one (its handler thread is free again)."""
        stream, current, rest = self._split(ids)
        failed: list[str] = []
        refusal: ItemNotLeasedError | None = None
        if current and stream is not None:
            try:
                on_stream(stream, current)
            except ItemNotLeasedError as exc:
                failed += exc.failed_ids
                refusal = exc
            except ConnectionFailedError as exc:
                if exc.sent:
                    raise
                rest += current
        try:
            if rest:
                on_http(rest)
        except ItemNotLeasedError as exc:
            failed += exc.failed_ids
            refusal = exc
        finally:
            if settles:
                with self.state.lock:
                    earlier = [i for i in rest if self.pushed_by.get(i, self.generation) != self.generation]
                    for item_id in ids:
                        self.pushed_by.pop(item_id, None)
                    stream = self.stream if self.streaming else None
                    if earlier and stream is None and self.streaming:
                        self.owed_credit += len(earlier)  # a reconnect is under way: it pays them
                if earlier and stream is not None:
                    with contextlib.suppress(ConnectionFailedError):
                        stream.give_credit(len(earlier))
        if refusal is not None:
            raise ItemNotLeasedError(
                refusal.code, refusal.code_text, refusal.message, failed_ids=tuple(failed), body=refusal.body
            )

    def _complete(self, partition: int, ids: list[str]) -> None:
        self._both_ways(
            ids,
            lambda stream, chosen: stream.complete(partition, chosen),
            lambda chosen: self.client.complete(self.queue_name, chosen, partition=partition),
            settles=True,
        )

    def _retry(self, partition: int, items: Sequence[RetryItem]) -> None:
        by_id = {item.id: item for item in items}
        self._both_ways(
            list(by_id),
            lambda stream, chosen: stream.retry(partition, [by_id[i] for i in chosen]),
            lambda chosen: self.client.retry(
                self.queue_name, [by_id[i] for i in chosen], partition=partition
            ),
            settles=True,
        )

    def _renewal(self, partition: int, ids: list[str]) -> Renewal:
        renewed: list[Renewal] = []
        self._both_ways(
            ids,
            lambda stream, chosen: renewed.append(Renewal.from_wire(stream.renew(partition, chosen))),
            lambda chosen: renewed.append(self.client.renew(self.queue_name, chosen, partition=partition)),
            settles=False,
        )
        return Renewal(
            queue_name=self.queue_name,
            partition=partition,
            items=tuple(item for renewal in renewed for item in renewal.items),
        )

    # -- leasing --------------------------------------------------------------------------------------

    def _lease_loop(self) -> None:
        while True:
            if self.stream is not None:
                try:
                    if self._stream_loop(self.stream):
                        return
                finally:
                    self.streaming = False
            if self._poll_loop():
                return

    def _poll_loop(self) -> bool:
        """Long-poll until the run ends (True) or, in ``mode="stream"``, a try to subscribe again
        succeeds (False: take pushed items again). Waits end at the next try's time."""
        error_streak = 0
        empty_streak = 0
        while not self.stop.is_set():
            if self.max_items is not None and self.leased_total >= self.max_items:
                self.stopped_by = "max_items"
                return True
            free = self._wait_for_free_handler()
            if free == 0:
                continue
            if (
                self.resubscribe_at is not None
                and time.monotonic() >= self.resubscribe_at
                and not self.stop.is_set()
                and self._resubscribe()
            ):
                return False
            wanted = min(self.batch_size, free)
            if self.max_items is not None:
                wanted = min(wanted, self.max_items - self.leased_total)
            if self.mode == "stream":
                self.polled = True
            try:
                lease = self.client.lease(
                    self.queue_name, wanted, request_timeout=self._until_resubscribe(self._lease_wait())
                )
            except DuplicateClientError as exc:
                # Our previous lease call is still waiting on the server (its reply was lost to a
                # timeout): wait for it to end there, then lease again.
                self.state.count("errors")
                log.warning("lease on %s: %s; backing off", self.queue_name, exc)
                self.stop.wait(self._until_resubscribe(self.request_timeout))
                continue
            except _FATAL:
                raise
            except (ApiError, ConnectionFailedError) as exc:
                error_streak += 1
                self.state.count("errors")
                log.warning("lease on %s failed (%s); backing off", self.queue_name, exc)
                self.stop.wait(self._until_resubscribe(self.client.backoff(min(error_streak, 8))))
                continue
            error_streak = 0
            # The queue's rate limit has no lease left until then: a lease before it gets nothing.
            held_back = self._until_next_lease(lease.next_lease_at)
            if not lease.items:
                if held_back > 0:
                    self.stop.wait(self._until_resubscribe(held_back))
                    continue
                idle_for = time.monotonic() - self.last_item_at
                if self.idle_timeout is not None and idle_for >= self.idle_timeout:
                    with self.state.lock:
                        running = len(self.state.jobs)
                    if running == 0:
                        self.stopped_by = "idle"
                        return True
                empty_streak += 1
                pause = self.idle_pause(empty_streak)
                if self.idle_timeout is not None:
                    # Never pause past the moment the worker would stop for being idle.
                    pause = min(pause, max(0.0, self.idle_timeout - idle_for))
                pause = self._until_resubscribe(pause)
                if pause > 0:
                    self.stop.wait(pause)
                continue
            empty_streak = 0
            self.last_item_at = time.monotonic()
            self.leased_total += len(lease.items)
            self.state.count("leased", len(lease.items))
            if self.mode == "stream":
                with self.state.lock:
                    self.pushed_by.update((item.id, _POLLED) for item in lease.items)
            self._accept(lease.items)
            if held_back > 0:
                self.stop.wait(self._until_resubscribe(held_back))
        self.stopped_by = self.stopped_by or "stop"
        return True

    @staticmethod
    def _until_next_lease(next_lease_at: datetime | None) -> float:
        """Seconds until a rate limit's ``next_lease_at`` (0: none, or passed), by this machine's
        clock, at most ``NEXT_LEASE_WAIT_MAX`` (a clock far behind the server's must not park the
        worker: the server's long-poll waits for the time itself)."""
        if next_lease_at is None:
            return 0.0
        wait = (next_lease_at - datetime.now(timezone.utc)).total_seconds()
        return min(max(wait, 0.0), NEXT_LEASE_WAIT_MAX)

    def _until_resubscribe(self, wait: float) -> float:
        """``wait``, but no longer than until the next try to subscribe (a long-poll or a pause that
        outlasted it would keep the worker off a stream that is back)."""
        if self.resubscribe_at is None:
            return wait
        return max(0.0, min(wait, self.resubscribe_at - time.monotonic()))

    def idle_pause(self, empty_streak: int) -> float:
        """The pause after the ``empty_streak``-th lease call in a row that found nothing."""
        if self.idle_backoff <= 0:
            return 0.0
        ceiling = min(self.idle_backoff_max, self.idle_backoff * 2.0 ** (empty_streak - 1))
        return random.uniform(0, ceiling)  # noqa: S311 - jitter, so idle consumers do not poll in step

    def _lease_wait(self) -> float:
        """Seconds one lease call waits: ``request_timeout``, but no longer than ``idle_timeout``, so
        an idle worker stops about ``idle_timeout`` after its last item rather than after a whole
        ``request_timeout`` (``idle_timeout=0.5`` took 5.2 s with the default 5 s wait)."""
        if self.idle_timeout is None:
            return self.request_timeout
        return max(0.0, min(self.request_timeout, self.idle_timeout))

    def _wait_for_free_handler(self) -> int:
        with self.state.idle:
            while len(self.state.jobs) >= self.concurrency and not self.stop.is_set():
                self.state.idle.wait(_POLL)
            return max(0, self.concurrency - len(self.state.jobs))

    def _accept(self, items: Iterable[LeasedItem]) -> None:
        with self.state.lock:
            jobs = [_Job(item=item, renew_at=self._next_renewal(item.lease_deadline)) for item in items]
            for job in jobs:
                self.state.jobs[job.item.id] = job
        for job in jobs:
            # A lease that returned after a stop still hands its items over; the handler threads
            # put them back at once (stopping is set) instead of running them.
            self.work.put(job)

    # -- handling -------------------------------------------------------------------------------------

    def _run_handlers(self) -> None:
        while True:
            job = self.work.get()
            if job is None:
                return
            with self.state.lock:
                if job.item.id not in self.state.jobs:
                    continue
                if self.state.stopping:
                    run = False
                else:
                    job.started = True
                    run = True
            if not run:
                self._give_back([job])
                continue
            self._handle(job)

    def _handle(self, job: _Job) -> None:
        item = job.item
        try:
            self.handler(item)
        except RetryLater as exc:
            self.state.count("failures")
            last = self.max_attempts > 0 and item.attempts >= self.max_attempts
            log.info("item %s of %s: retry in %s", item.id, self.queue_name, exc.delay)
            self._settle(
                job,
                RetryItem(id=item.id, retry_in=exc.delay, reason=self._reason(exc)),
                "dead_lettered" if last else "retried",
            )
        except self.dead_letter_on as exc:
            self.state.count("failures")
            log.info("item %s of %s: dead letter (%r)", item.id, self.queue_name, exc)
            self._settle(job, RetryItem(id=item.id, dead=True, reason=self._reason(exc)), "dead_lettered")
        # The handler is the user's code: whatever it raises (even SystemExit) is that item's
        # failure, never the worker's, so this is the one place that catches everything; a thread
        # that died here would leave its item held until the worker stops.
        except BaseException as exc:
            self.state.count("failures")
            last = self.max_attempts > 0 and item.attempts >= self.max_attempts
            # A delay, not a time: the server counts it from its own clock, so a consumer whose clock
            # is off does not bring its items back early or late.
            delay = self.backoff(item.attempts)
            log.info("item %s of %s failed on attempt %d (%r)", item.id, self.queue_name, item.attempts, exc)
            # The server dead-letters a retried item that used its max_attempts; count it as such.
            self._settle(
                job,
                RetryItem(id=item.id, retry_in=delay, reason=self._reason(exc)),
                "dead_lettered" if last else "retried",
            )
        else:
            self._settle(job, None, "completed")

    def _reason(self, exc: BaseException) -> str:
        """What the server records as the failure of ``exc``: ``reason``'s text, one line within the
        limit; ``failure_reason``'s when it fails (the caller's code must not cost the item its retry)."""
        if self.reason is failure_reason:
            return failure_reason(exc)
        try:
            return reason_text(self.reason(exc))
        except Exception:
            log.exception(
                "the reason= function of the worker on %s failed; sending the exception's", self.queue_name
            )
            return failure_reason(exc)

    def _settle(self, job: _Job, retry: RetryItem | None, outcome: str) -> None:
        with self.state.lock:
            # Gone when the worker put it back during a stop: the item is no longer ours to settle.
            if job.item.id not in self.state.jobs:
                return
            job.settling = True
        self.settlements.put(_Settlement(job, retry, outcome))

    def _settle_loop(self) -> None:
        """Send the verdicts in batches: whatever finished while the previous call was under way goes
        in the next one, one call per partition and kind, so a busy worker sends far fewer requests
        than one per item and an idle one adds no delay."""
        while True:
            try:
                batch = [self.settlements.get(timeout=_POLL)]
            except queue.Empty:
                if self.settler_done.is_set():
                    return
                continue
            while len(batch) < MAX_IDS:
                try:
                    batch.append(self.settlements.get_nowait())
                except queue.Empty:
                    break
            groups: dict[tuple[int, bool], list[_Settlement]] = defaultdict(list)
            for settlement in batch:
                groups[(settlement.job.item.partition, settlement.retry is None)].append(settlement)
            for (partition, completing), group in groups.items():
                self._apply(partition, completing, group)

    def _apply(self, partition: int, completing: bool, group: list[_Settlement]) -> None:
        ids = [s.job.item.id for s in group]
        failed: set[str] = set()
        unsettled = False
        try:
            if completing:
                self._complete(partition, ids)
            else:
                self._retry(partition, [s.retry for s in group if s.retry is not None])
        except ItemNotLeasedError as exc:
            # The others were applied; these leases ran out and the items went to someone else.
            failed = set(exc.failed_ids)
            log.warning("%d item(s) of %s: lease lost before settling", len(failed), self.queue_name)
        except (ApiError, ConnectionFailedError) as exc:
            log.warning(
                "settling %d item(s) of %s failed (%s); their leases will run out",
                len(ids),
                self.queue_name,
                exc,
            )
            self.state.count("errors")
            self.state.count("unsettled", len(ids))
            unsettled = True
        with self.state.idle:
            if not unsettled:
                for settlement in group:
                    key = "lost" if settlement.job.item.id in failed else settlement.outcome
                    self.state.counts[key] += 1
            # Only now: a stop waits for settling items, so no complete is cut off by the exit.
            for item_id in ids:
                self.state.jobs.pop(item_id, None)
            self.state.idle.notify_all()

    # -- renewing -------------------------------------------------------------------------------------

    def _next_renewal(self, deadline: datetime | None) -> float:
        """When to renew a lease next (monotonic seconds): after ``renew_every``, or sooner, at half of
        what the server says is left; a reply that came late leaves less than a whole lease."""
        assert self.renew_every is not None  # noqa: S101 - set in run()
        now = time.monotonic()
        due = now + self.renew_every
        if deadline is not None:
            left = (deadline - datetime.now(UTC)).total_seconds()
            due = min(due, now + max(0.0, left / 2))
        return due

    def _renew_loop(self) -> None:
        assert self.renew_every is not None  # noqa: S101 - set in run()
        tick = min(0.5, self.renew_every / 4)
        while not self.renewer_done.wait(tick):
            now = time.monotonic()
            by_partition: dict[int, list[_Job]] = defaultdict(list)
            with self.state.lock:
                for job in self.state.jobs.values():
                    if job.renew_at <= now and not (job.lost or job.settling):
                        by_partition[job.item.partition].append(job)
            for partition, jobs in by_partition.items():
                self._renew(partition, jobs)

    def _renew(self, partition: int, jobs: list[_Job]) -> None:
        assert self.renew_every is not None  # noqa: S101 - set in run()
        ids = [job.item.id for job in jobs]
        failed: set[str] = set()
        deadlines: dict[str, datetime | None] = {}
        try:
            renewal = self._renewal(partition, ids)
            deadlines = {renewed.id: renewed.lease_deadline for renewed in renewal.items}
        except ItemNotLeasedError as exc:
            # Completed meanwhile (harmless), or lost: expired and leased by someone else.
            failed = set(exc.failed_ids)
        except (ApiError, ConnectionFailedError) as exc:
            log.warning("renew on %s failed (%s); trying again", self.queue_name, exc)
            self.state.count("errors")
            return
        with self.state.lock:
            for job in jobs:
                if job.item.id in failed:
                    if job.item.id in self.state.jobs:
                        job.lost = True
                        log.warning(
                            "item %s of %s: lease lost while its handler runs", job.item.id, self.queue_name
                        )
                else:
                    job.renew_at = self._next_renewal(deadlines.get(job.item.id))
                    self.state.counts["renewed"] += 1

    # -- stopping -------------------------------------------------------------------------------------

    def _shut_down(self, threads: list[threading.Thread]) -> None:
        graceful = self.stopped_by in ("max_items", "idle")
        with self.state.idle:
            # After a normal end every leased item is still handled; after a stop, items not yet
            # started go back at once.
            self.state.stopping = not graceful
        # Finish what runs: for as long as it takes after a normal end, for shutdown_timeout after a
        # stop, not at all after a second signal.
        deadline = None if graceful else time.monotonic() + self.shutdown_timeout
        with self.state.idle:
            while (
                any(graceful or job.started for job in self.state.jobs.values()) and not self.hurry.is_set()
            ):
                if graceful and self.stop.is_set():
                    # A signal during a normal end: from now on it is a stop like any other.
                    graceful = False
                    self.state.stopping = True
                    deadline = time.monotonic() + self.shutdown_timeout
                remaining = _POLL if deadline is None else min(_POLL, deadline - time.monotonic())
                if remaining <= 0:
                    break
                self.state.idle.wait(remaining)
            leftovers = list(self.state.jobs.values())
        self._give_back(leftovers)
        with self.state.idle:
            # complete / retry calls under way are short; let them land rather than cut them off.
            settle_deadline = time.monotonic() + self.client.timeout
            while self.state.jobs and time.monotonic() < settle_deadline:
                self.state.idle.wait(_POLL)
        for _ in threads:
            self.work.put(None)
        join_deadline = time.monotonic() + 1.0
        for thread in threads:
            # Bounded: a handler still running after its item was put back is left behind (daemon).
            thread.join(timeout=max(0.0, join_deadline - time.monotonic()))

    def _give_back(self, jobs: list[_Job]) -> None:
        """Put items back at once (retry, no ``retry_at``), so none waits for its lease to run out."""
        by_partition: dict[int, list[_Job]] = defaultdict(list)
        with self.state.idle:
            for job in jobs:
                if job.item.id in self.state.jobs and not job.settling:
                    del self.state.jobs[job.item.id]
                    by_partition[job.item.partition].append(job)
            self.state.idle.notify_all()
        for partition, owned in by_partition.items():
            ids = [job.item.id for job in owned]
            lost: set[str] = set()
            try:
                self._retry(partition, [RetryItem(id=item_id) for item_id in ids])
            except ItemNotLeasedError as exc:
                lost = set(exc.failed_ids)
            except (ApiError, ConnectionFailedError) as exc:
                log.warning(
                    "could not put back %d item(s) of %s (%s); their leases will run out",
                    len(ids),
                    self.queue_name,
                    exc,
                )
                self.state.count("errors")
                self.state.count("unsettled", len(ids))
                continue
            self.state.count("lost", len(lost & set(ids)))
            self.state.count("returned", len(set(ids) - lost))
