"""Spark producer, driver side: the job record and the staged plan under ``<staging dir>/<job id>/``.

A produce job's chunks must be the same on every attempt, every recomputation and every re-run, or
idempotency keys stop matching and rows are lost or stored twice (docs/adr/0022-spark-exactly-once.md).
Two things are made durable on the first run, before any item is written:

- ``plan/``: every source row, mapped and keyed (logical bucket, row key, item digest, the item or
  why the row is invalid), as Parquet. Every later stage, and every re-run, reads these files
  instead of the source, so a source that changes or reads back in another order cannot move a row
  from one chunk to another.
- ``job.json``: the job record, written once after the plan is complete (its presence is the commit
  of the plan): the queue, the number of logical buckets, the chunk size, the mapping and the row
  count. A re-run whose plan differs from it is refused; the Spark partition count is not part of
  it, so a re-run may use any.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Layout under ``<staging dir>/<job id>/``.
RECORD_NAME = "job.json"
PLAN_NAME = "plan"
#: Bumped when the meaning of a plan changes; a record of another version is refused.
PLAN_VERSION = 1


#: A re-run later than this after the first run is refused: the chunk records that make it store
#: nothing twice live 24 hours (``querator.storage.dynamodb.bulk.RECORD_TTL``, the service's window), and a
#: re-run must finish before they go.
RERUN_WINDOW_SECONDS = 23 * 3600


class PlanMismatchError(ValueError):
    """A re-run asked for a plan other than the one its job record fixed on the first run."""


class RerunTooLateError(PlanMismatchError):
    """A re-run came after the window in which the store still remembers the job's chunks."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRecord:
    """What a job's first run fixed; a re-run must ask for the same (``check``)."""

    job_id: str
    queue: str
    buckets: int
    chunk_items: int
    #: ``ColumnMap`` as a dict: another mapping makes other items and other row keys.
    columns: dict[str, Any]
    #: Rows the plan holds (valid and invalid); the job fails unless every one is accounted for.
    rows: int
    #: When the plan was staged, in seconds since the epoch.
    staged_at: float = 0.0
    version: int = PLAN_VERSION

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> JobRecord:
        return cls(**json.loads(text))

    def check_window(self, now: float) -> None:
        """Raise ``RerunTooLateError`` when the first run is older than ``RERUN_WINDOW_SECONDS``."""
        age = now - self.staged_at
        if age > RERUN_WINDOW_SECONDS:
            raise RerunTooLateError(
                f"job {self.job_id} was staged {age / 3600:.0f} hours ago; the store remembers a job's "
                f"chunks for 24 hours, so this re-run could store rows twice and is refused. Load the "
                "rows that are missing under a new job id."
            )

    def check(self, wanted: JobRecord) -> None:
        """Raise ``PlanMismatchError`` naming every fixed setting ``wanted`` asks to change."""
        fixed = ("version", "queue", "buckets", "chunk_items", "columns")
        changed = [
            f"{name}: {getattr(self, name)!r} on the first run, {getattr(wanted, name)!r} now"
            for name in fixed
            # A bucket count of 0 asks for none in particular: the record's is used.
            if getattr(self, name) != getattr(wanted, name) and not (name == "buckets" and not wanted.buckets)
        ]
        if changed:
            raise PlanMismatchError(
                f"job {self.job_id} was planned differently on its first run ({'; '.join(changed)}). "
                "A re-run must keep them so that it finds the chunks already stored; use a new job id "
                "for a different load (the Spark partition count may change freely)."
            )


def job_dir(staging_dir: str, job_id: str) -> str:
    return f"{staging_dir.rstrip('/')}/{job_id}"


def read_record(spark: SparkSession, staging_dir: str, job_id: str) -> JobRecord | None:
    """The job's record, or ``None`` when no earlier run completed its plan."""
    path = f"{job_dir(staging_dir, job_id)}/{RECORD_NAME}"
    fs, hadoop_path = filesystem(spark, path)
    if not fs.exists(hadoop_path):
        return None
    text = "\n".join(spark.sparkContext.textFile(path, 1).collect())
    return JobRecord.from_json(text)


def write_record(spark: SparkSession, staging_dir: str, record: JobRecord) -> None:
    """Write the record once; a concurrent first run that got there first makes this one fail."""
    path = f"{job_dir(staging_dir, record.job_id)}/{RECORD_NAME}"
    fs, hadoop_path = filesystem(spark, path)
    # overwrite=False: two first runs of one job cannot both commit a plan.
    stream = fs.create(hadoop_path, False)
    try:
        stream.write(bytearray(record.to_json().encode()))
    finally:
        stream.close()


def filesystem(spark: SparkSession, path: str) -> tuple[Any, Any]:
    """Hadoop's file system for ``path`` (local, HDFS, S3 through EMRFS or S3A), from the driver's JVM."""
    context = spark.sparkContext
    jvm: Any = context._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    return hadoop_path.getFileSystem(context._jsc.hadoopConfiguration()), hadoop_path


__all__ = [
    "PLAN_NAME",
    "RERUN_WINDOW_SECONDS",
    "JobRecord",
    "PlanMismatchError",
    "RerunTooLateError",
    "filesystem",
    "job_dir",
    "read_record",
    "write_record",
]
