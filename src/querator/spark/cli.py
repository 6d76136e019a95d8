"""Spark producer: the command lines of the ready-to-run jobs (``jobs/produce.py``, ``jobs/export_queue.py``).

Each job is ``main(argv) -> exit status``: parse the arguments, get (or create) the Spark session,
run one function of ``querator.spark``, print the counts as one JSON line. Glue passes arguments of
its own (``--JOB_ID``, ``--TempDir`` …); those are logged and ignored. Nothing here derives a job id
from the platform's run id: a re-run must reuse the load's job id to store nothing twice.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from querator.config import DEFAULT_ENGINE, ENGINES, EnvVar, settings_from
from querator.spark.export import export_queue
from querator.spark.job import MAX_BUCKETS, ProduceFailedError, produce_dataframe
from querator.spark.mapping import MAX_CHUNK_ITEMS, ColumnMap
from querator.spark.plan import PlanMismatchError
from querator.spark.producer import DirectTarget, HttpTarget
from querator.spark.retry import RetryPolicy

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pyspark.sql import DataFrame, SparkSession

    from querator.spark.job import ProduceCounts
    from querator.spark.producer import Target

log = logging.getLogger(__name__)

#: Exit statuses of the jobs (argparse uses 2 for a bad command line).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_PLAN_MISMATCH = 2
EXIT_INVALID_ROWS = 3
SOURCE_FORMATS = ("parquet", "json", "csv")
#: The DynamoDB endpoint variable boto3 honours; read here only to pass it on to the executors.
_ENDPOINT_ENV = "AWS_ENDPOINT_URL_DYNAMODB"


def _flag(value: str) -> bool:
    """A flag's optional value: Glue passes every job parameter as a key and a value."""
    if value.lower() in {"true", "1", "yes"}:
        return True
    if value.lower() in {"false", "0", "no"}:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


#: An on/off option given alone (``--allow-invalid``) or with a value (``--allow-invalid true``, Glue).
_FLAG: dict[str, Any] = {"nargs": "?", "const": True, "default": False, "type": _flag}


def _add_store_arguments(parser: argparse.ArgumentParser) -> None:
    store = parser.add_argument_group("direct write path (the product's DynamoDB tables)")
    store.add_argument("--items-table", default=os.environ.get(EnvVar.ITEMS_TABLE), help="items table name")
    store.add_argument(
        "--catalog-table", default=os.environ.get(EnvVar.CATALOG_TABLE), help="queue catalog table name"
    )
    store.add_argument("--region", default=os.environ.get(EnvVar.REGION), help="AWS region of the tables")
    store.add_argument(
        "--payload-bucket",
        default=os.environ.get(EnvVar.PAYLOAD_BUCKET),
        help="the stack's payload bucket (PayloadBucketName): payloads over 64 KiB, up to 1 MiB",
    )
    store.add_argument(
        "--endpoint-url",
        default=os.environ.get(_ENDPOINT_ENV),
        help="DynamoDB endpoint other than AWS's (a local store); passed on to the executors",
    )


def produce_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jobs/produce.py",
        allow_abbrev=False,
        description="Produce every row of a Parquet / JSON / CSV source into a queue, exactly once per row.",
    )
    parser.add_argument("--source", required=True, help="path or URI (s3://…, file://…) of the source")
    parser.add_argument("--format", choices=SOURCE_FORMATS, default="parquet", help="source format")
    parser.add_argument(
        "--csv-no-header",
        **_FLAG,
        help="CSV files have no header line (columns are _c0, _c1 …)",
    )
    parser.add_argument("--queue", required=True, help="the queue to produce into")
    parser.add_argument(
        "--job-id",
        required=True,
        help="names this load; re-running with the same job id stores nothing twice",
    )
    parser.add_argument(
        "--staging-dir",
        required=True,
        help="durable location (s3://bucket/prefix, hdfs://…) for the job's staged plan and record: "
        "<staging-dir>/<job-id>/; keep it for re-runs",
    )
    parser.add_argument(
        "--expect-rows",
        type=int,
        help="rows the source holds; the job fails unless exactly these are accounted for "
        "(default: the source is counted once before it is staged)",
    )
    columns = parser.add_argument_group("columns")
    columns.add_argument(
        "--payload",
        action="append",
        required=True,
        help="payload column; repeat it (or separate with commas) for a JSON object of several columns",
    )
    columns.add_argument("--key", help="column identifying a row (default: the row's content)")
    columns.add_argument("--reference", help="reference column")
    columns.add_argument("--kind", help="kind column")
    columns.add_argument("--encoding", help="encoding column")
    columns.add_argument("--enqueue-at", help="schedule column: a timestamp or RFC 3339 text")
    columns.add_argument(
        "--priority", help="priority column: an integer 0-9, lower leases first (null or empty: 5)"
    )
    columns.add_argument(
        "--group", help="group column: the item's group, a tenant or customer; null or empty: none"
    )
    columns.add_argument("--default-kind", default="", help="kind when there is no kind column or it is null")
    columns.add_argument(
        "--default-encoding", default="", help="encoding when there is no encoding column or it is null"
    )
    parser.add_argument("--write-path", choices=("direct", "http"), default="direct")
    _add_store_arguments(parser)
    parser.add_argument(
        "--engine",
        type=int,
        choices=ENGINES,
        default=DEFAULT_ENGINE,
        help="direct path: the storage engine new chunks are written for: 2, a row per item; 3, the "
        "queue partitions' claim logs, packed (default: %(default)s, the product's)",
    )
    http = parser.add_argument_group("http write path (the queue's API)")
    http.add_argument(
        "--base-url", help="the API's URL, e.g. https://abc.execute-api.eu-west-1.amazonaws.com/prod"
    )
    http.add_argument("--sigv4-region", help="sign requests with SigV4 for this region (IAM-authorized APIs)")
    tuning = parser.add_argument_group("tuning")
    tuning.add_argument(
        "--partitions",
        type=int,
        help="concurrent writers (Spark partitions); may change between runs "
        "(default: the cluster's cores, at most 2 per queue partition)",
    )
    tuning.add_argument(
        "--buckets",
        type=int,
        help=f"logical buckets (1 to {MAX_BUCKETS}; default: from the row count, 4 chunks each); "
        "fixed by the job's first run, like --chunk-items",
    )
    tuning.add_argument(
        "--chunk-items",
        type=int,
        default=MAX_CHUNK_ITEMS,
        help="items per produce call; fixed by the job's first run",
    )
    tuning.add_argument("--max-items-per-second", type=float, help="average rate limit per Spark partition")
    tuning.add_argument(
        "--max-write-units-per-second",
        type=float,
        help="pacing per Spark partition in write units (default: 80%% of 1,000 per queue partition, "
        "shared by the writers)",
    )
    tuning.add_argument(
        "--max-attempts", type=int, default=RetryPolicy().max_attempts, help="calls per chunk"
    )
    parser.add_argument(
        "--allow-invalid",
        **_FLAG,
        help="exit 0 even when some rows were invalid (they are listed)",
    )
    return parser


def export_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jobs/export_queue.py",
        allow_abbrev=False,
        description="Export every item of a queue (e.g. a dead-letter queue) to Parquet.",
    )
    parser.add_argument("--queue", required=True)
    parser.add_argument("--output", required=True, help="path or URI of the Parquet output")
    parser.add_argument(
        "--mode", choices=("errorifexists", "overwrite", "append"), default="errorifexists", help="save mode"
    )
    _add_store_arguments(parser)
    return parser


def direct_target(args: argparse.Namespace) -> DirectTarget:
    """The direct write path from the arguments, validated like the functions' own settings."""
    environ = {
        EnvVar.ITEMS_TABLE: args.items_table or "",
        EnvVar.CATALOG_TABLE: args.catalog_table or "",
        EnvVar.REGION: args.region or "",
        EnvVar.PAYLOAD_BUCKET: getattr(args, "payload_bucket", None) or "",
    }
    return DirectTarget(
        settings=settings_from(environ),
        endpoint_url=args.endpoint_url or None,
        engine=getattr(args, "engine", DEFAULT_ENGINE),
    )


def column_map(args: argparse.Namespace) -> ColumnMap:
    payload = tuple(name.strip() for value in args.payload for name in value.split(",") if name.strip())
    return ColumnMap(
        payload=payload,
        key=args.key,
        reference=args.reference,
        kind=args.kind,
        encoding=args.encoding,
        enqueue_at=args.enqueue_at,
        priority=args.priority,
        group=args.group,
        default_kind=args.default_kind,
        default_encoding=args.default_encoding,
    )


def read_source(spark: SparkSession, args: argparse.Namespace) -> DataFrame:
    reader = spark.read
    if args.format == "csv":
        # Every CSV column stays a string: guessing types would change payloads ("007" → 7).
        reader = reader.option("header", str(not args.csv_no_header).lower())
    return reader.format(args.format).load(args.source)


def run_produce(spark: SparkSession, args: argparse.Namespace) -> ProduceCounts:
    """Produce the source named by ``args``; raises ``ProduceFailedError`` like ``produce_dataframe``."""
    target: Target
    if args.write_path == "http":
        if not args.base_url:
            raise SystemExit("--base-url is required with --write-path http")
        target = HttpTarget(base_url=args.base_url, sigv4_region=args.sigv4_region)
    else:
        target = direct_target(args)
    return produce_dataframe(
        read_source(spark, args),
        queue=args.queue,
        columns=column_map(args),
        target=target,
        job_id=args.job_id,
        staging_dir=args.staging_dir,
        partitions=args.partitions,
        buckets=args.buckets,
        chunk_items=args.chunk_items,
        retry=RetryPolicy(max_attempts=args.max_attempts),
        max_items_per_second=args.max_items_per_second,
        max_write_units_per_second=args.max_write_units_per_second,
        expect_rows=args.expect_rows,
    )


def produce_main(argv: Sequence[str] | None = None, *, spark: SparkSession | None = None) -> int:
    """``jobs/produce.py``: 0 all rows stored, 1 some not stored (re-run) or rows unaccounted for,
    2 a re-run that asks for another plan than its first run's, 3 invalid rows found."""
    args = _parse(produce_parser(), argv)
    session = spark or _session("querator-produce")
    _logs_past_spark_submit(session)
    try:
        counts = run_produce(session, args)
    except PlanMismatchError as exc:
        log.error("%s", exc)
        sys.stdout.write(json.dumps({"status": "plan_mismatch", "error": str(exc)}) + "\n")
        return EXIT_PLAN_MISMATCH
    except ProduceFailedError as exc:
        log.error("%s", exc)
        _print_counts(exc.counts, status="failed")
        return EXIT_FAILED
    invalid = counts.invalid and not args.allow_invalid
    _print_counts(counts, status="invalid_rows" if invalid else "ok")
    return EXIT_INVALID_ROWS if invalid else EXIT_OK


def export_main(argv: Sequence[str] | None = None, *, spark: SparkSession | None = None) -> int:
    """``jobs/export_queue.py``: writes the queue's items to Parquet and prints how many it wrote."""
    args = _parse(export_parser(), argv)
    session = spark or _session("querator-export")
    _logs_past_spark_submit(session)
    count = export_queue(
        session, queue=args.queue, target=direct_target(args), path=args.output, mode=args.mode
    )
    # "items": the rows this run wrote, also in append mode (not what the path holds in total).
    sys.stdout.write(
        json.dumps({"status": "ok", "queue": args.queue, "items": count, "output": args.output}) + "\n"
    )
    return EXIT_OK


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    _log_to_stderr()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        log.info("ignoring arguments this job does not define (Glue adds its own): %s", " ".join(unknown))
    return args


class DriverLogHandler(logging.Handler):
    """The product's log lines on stderr, also under ``spark-submit``, so stdout holds only the JSON
    summary (``| jq`` reads it).

    ``spark-submit`` runs the Python driver with its stderr merged into its stdout (Spark's
    ``PythonRunner``), so a line written to Python's stderr there lands beside the summary. Under a
    JVM that launched this process (``PYSPARK_GATEWAY_PORT`` set at start: spark-submit, Glue), the
    lines go through the JVM's log4j instead, whose console appender writes to the real stderr; the
    lines logged before the session exists are held until ``attach`` and then sent. Started by
    ``python jobs/produce.py``, Python's stderr is the process's own, and the lines go there.
    """

    def __init__(self, *, through_jvm: bool) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self._through_jvm = through_jvm
        self._jvm_logger: Any = None
        self._held: list[logging.LogRecord] = []

    def attach(self, session: SparkSession) -> None:
        """Send the lines through ``session``'s JVM from now on (and the ones held so far)."""
        if self._through_jvm and self._jvm_logger is None:
            try:
                jvm = session.sparkContext._jvm
                self._jvm_logger = jvm.org.apache.logging.log4j.LogManager.getLogger("querator")  # type: ignore[union-attr]
            except Exception:
                self._through_jvm = False
        held, self._held = self._held, []
        for record in held:
            self.emit(record)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if not self._through_jvm:
                sys.stderr.write(self.format(record) + "\n")
            elif self._jvm_logger is None:
                self._held.append(record)
            else:
                # log4j's own line carries the time, level and logger: the message is enough.
                text = record.getMessage()
                if record.exc_info:
                    text += "\n" + logging.Formatter().formatException(record.exc_info)
                level = (
                    "error"
                    if record.levelno >= logging.ERROR
                    else "warn"
                    if record.levelno >= logging.WARNING
                    else "info"
                )
                getattr(self._jvm_logger, level)(text)
        except Exception:
            self.handleError(record)


def _log_to_stderr() -> None:
    """The product's own INFO lines (the summary) on the driver's stderr (``DriverLogHandler``);
    Spark's and py4j's stay as Spark configures them."""
    logger = logging.getLogger("querator")
    if not any(isinstance(h, DriverLogHandler) for h in logger.handlers):
        logger.addHandler(DriverLogHandler(through_jvm="PYSPARK_GATEWAY_PORT" in os.environ))
    logger.setLevel(logging.INFO)


def _logs_past_spark_submit(session: SparkSession) -> None:
    for handler in logging.getLogger("querator").handlers:
        if isinstance(handler, DriverLogHandler):
            handler.attach(session)


def _session(name: str) -> SparkSession:
    from pyspark.sql import SparkSession  # noqa: PLC0415 - pyspark only where Spark runs

    return SparkSession.builder.appName(name).getOrCreate()


def _print_counts(counts: ProduceCounts, *, status: str) -> None:
    record: dict[str, Any] = {"status": status, **dataclasses.asdict(counts)}
    sys.stdout.write(json.dumps(record, default=str) + "\n")


__all__ = [
    "EXIT_FAILED",
    "EXIT_INVALID_ROWS",
    "EXIT_OK",
    "EXIT_PLAN_MISMATCH",
    "export_main",
    "export_parser",
    "produce_main",
    "produce_parser",
    "run_produce",
]
