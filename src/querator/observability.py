"""Edge: Powertools Logger, Metrics and Tracer, created once for every function.

The domain, the service and the adapters log through the standard library
(``logging.getLogger(__name__)``). Powertools' Logger *is* the standard logger named ``querator``
(the service name), so every ``querator.*`` logger propagates into it: each line comes out as JSON
with the correlation id of the request, and the core never imports Powertools. Metrics are emitted
from the results the service returns, never from inside it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import sys
from typing import TYPE_CHECKING, Any, Final

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.metrics.functions import is_metrics_disabled

from querator.config import METRICS_NAMESPACE, SERVICE_NAME, EnvVar, in_lambda

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from aws_lambda_powertools.utilities.typing import LambdaContext

# stderr: Lambda sends both streams to CloudWatch, and locally stdout stays free for the URL line.
logger = Logger(service=SERVICE_NAME, stream=sys.stderr)
metrics = Metrics(namespace=METRICS_NAMESPACE, service=SERVICE_NAME)
if _stage := os.environ.get(EnvVar.STAGE):
    # Kept across flushes: every metric of the process carries its stage (the alarms select on it).
    metrics.set_default_dimensions(stage=_stage)


#: Logged when a handler's warm-up at init raised; the first request makes the clients again and
#: reports whatever failed in the contract's envelope.
WARM_UP_FAILED: Final = "warm-up at init failed; the first request will try again"


def tracing_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Powertools' own rule for when its tracer is active: in Lambda (``LAMBDA_TASK_ROOT``), not in
    SAM's or Chalice's emulators, and ``POWERTOOLS_TRACE_DISABLED`` not set to a true value."""
    disabled = environ.get(EnvVar.POWERTOOLS_TRACE_DISABLED, "false").lower() in {
        "1",
        "true",
        "y",
        "yes",
        "on",
    }
    return in_lambda(environ) and not disabled


#: Set while the API layer runs inside someone else's program (``Embedded``): no metric is recorded.
_quiet: contextvars.ContextVar[bool] = contextvars.ContextVar("querator_quiet_metrics", default=False)


@contextlib.contextmanager
def quiet_metrics() -> Iterator[None]:
    """Record no metric in this context. Powertools writes a metric set as CloudWatch EMF JSON to
    stdout once it holds 100 metrics, which in a host program is its own stdout (``Embedded``)."""
    token = _quiet.set(True)
    try:
        yield
    finally:
        _quiet.reset(token)


def count(name: str, value: float) -> None:
    """Add ``value`` to the metric ``name`` (a Count) of this invocation; zero is not published."""
    if value and not _quiet.get():
        metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)


def seconds(name: str, value: float) -> None:
    """Record a duration metric in seconds."""
    if not _quiet.get():
        metrics.add_metric(name=name, unit=MetricUnit.Seconds, value=value)


def flush() -> None:
    """Publish this invocation's metrics, if any (an empty flush would only warn).

    With metrics disabled (``POWERTOOLS_METRICS_DISABLED``, as ``querator serve`` sets) they are
    dropped instead: Powertools' flush then keeps them, and once one metric holds 100 values its
    ``add_metric`` prints them to stdout itself, disabled or not. Under ``querator serve`` that print
    blocked every handler thread for good once a parent that reads only the first line of stdout let
    the pipe fill (a load of 3,000 consumers did, measured).
    """
    if not metrics.metric_set:
        return
    if is_metrics_disabled():
        metrics.clear_metrics()
    else:
        metrics.flush_metrics()


def lambda_entry(
    resolve: Callable[[dict[str, Any], LambdaContext], dict[str, Any]],
    *,
    correlation_id_path: str | None = correlation_paths.API_GATEWAY_REST,
    prepare: Callable[[], object] | None = None,
) -> Callable[[dict[str, Any], LambdaContext], dict[str, Any]]:
    """Wrap a function's entry point with structured logging, tracing and metrics.

    The metrics are flushed here rather than by ``Metrics.log_metrics`` because that decorator
    warns on every invocation that published nothing, which most of them are.

    ``prepare`` runs now when this is Lambda's init phase (the handler module's import): it makes
    the clients and builds the wire models the first request would otherwise make. AWS's guidance
    is to create SDK clients outside the handler; the init phase also runs with a whole vCPU, where
    an invocation of a 512 MB function gets about a third of one (docs/adr/0013-cold-start.md).
    Outside Lambda (tests, the local server) nothing runs at import.
    """
    if prepare is not None and in_lambda():
        try:
            prepare()
        # Any error: an init that raises fails the invocation outside the contract's envelope; then
        # the first request, making the clients again, reports it inside.
        except Exception:
            logger.warning(WARM_UP_FAILED, exc_info=True)

    def flushing(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
        try:
            return resolve(event, context)
        finally:
            flush()

    traced = flushing
    if tracing_enabled():
        # Here, not at the top: see the module docstring. Still at import (Lambda's init phase).
        from aws_lambda_powertools import Tracer  # noqa: PLC0415

        traced = Tracer(service=SERVICE_NAME).capture_lambda_handler(capture_response=False)(flushing)
    lambda_handler = logger.inject_lambda_context(correlation_id_path=correlation_id_path, clear_state=True)(
        traced
    )
    return functools.wraps(resolve)(lambda_handler)
