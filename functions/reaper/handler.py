"""Lambda entry point: the reaper, invoked by an EventBridge schedule (``rate(1 minute)``).

It runs ``QueueService.reap`` within the time the invocation has left (less a margin to save its
bookmark) and publishes the report as metrics; the next run resumes where this one stopped.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from querator.bootstrap import get_service
from querator.config import Metric, load_settings
from querator.observability import count, lambda_entry, logger, seconds

#: ``datetime.UTC`` is Python 3.11+; the package supports 3.10 (docs/adr/0021-python-and-spark-versions.md).
UTC = timezone.utc
#: A run whose oldest waiting item is older than this logs at info level, naming its queue.
LOG_OLDEST_AFTER = timedelta(minutes=1)


def reap(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    left = timedelta(milliseconds=context.get_remaining_time_in_millis())
    budget = max(timedelta(0), left - load_settings().reaper_margin)
    report = get_service().reap(datetime.now(UTC), budget)
    count(Metric.DEAD_LETTERED, report.dead_lettered)
    count(Metric.EXPIRED_DELETED, report.deleted)
    count(Metric.REAPER_SCANNED, report.scanned)
    count(Metric.REAPER_UNFINISHED, 0 if report.finished else 1)
    count(Metric.DEAD_LETTER_DEPTH, report.dead_letter_depth)
    seconds(Metric.OLDEST_ITEM_AGE, report.oldest_item_age.total_seconds())
    summary = {
        "queues": report.queues,
        "partitions": report.partitions,
        "scanned": report.scanned,
        "dead_lettered": report.dead_lettered,
        "deleted": report.deleted,
        "skipped": report.skipped,
        "queues_deleted": report.queues_deleted,
        "recovered": report.recovered,
        "requeued": report.requeued,
        "stragglers": report.stragglers,
        "recounted": report.recounted,
        "bands_dropped": report.bands_dropped,
        "finished": report.finished,
        "oldest_item_age_seconds": round(report.oldest_item_age.total_seconds(), 3),
        "oldest_item_queue": report.oldest_item_queue,
        "dead_letter_depth": report.dead_letter_depth,
    }
    # A run that changed nothing is the common case (every minute); log it only at debug level.
    # The oldest item's queue is logged whenever the OldestItemAge alarm could be on, so its alarm
    # can be traced to a queue in Logs Insights without a metric per queue.
    late = report.oldest_item_age >= LOG_OLDEST_AFTER
    acted = report.dead_lettered or report.deleted or report.queues_deleted or not report.finished or late
    (logger.info if acted else logger.debug)("reaper run", extra=summary)
    return summary


lambda_handler = lambda_entry(reap, correlation_id_path=None, prepare=get_service)
