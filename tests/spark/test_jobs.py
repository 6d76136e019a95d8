"""The ready-to-run jobs end to end: read a file source, produce it (direct or over HTTP), export a queue."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from querator.config import EnvVar, Settings
from querator.domain.model import NewItem, RetryRequest
from querator.spark.cli import EXIT_INVALID_ROWS, EXIT_OK, export_main, produce_main
from querator.spark.producer import DirectTarget, HttpTarget
from querator.testing import serve_process
from tests.spark.helpers import Store, count_items, create_queue, stored

#: ``datetime.UTC`` is Python 3.11+; the package supports 3.10 (docs/adr/0021-python-and-spark-versions.md).
UTC = timezone.utc

pytestmark = [pytest.mark.spark, pytest.mark.server]


def store_arguments(store: Store) -> list[str]:
    settings = store.target.settings
    return [
        "--items-table",
        settings.items_table,
        "--catalog-table",
        settings.catalog_table,
        "--region",
        "us-east-1",
        "--endpoint-url",
        store.endpoint,
    ]


def last_json_line(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


@pytest.mark.parametrize("source_format", ["parquet", "json", "csv"])
def test_the_produce_job_reads_each_source_format_and_a_rerun_adds_nothing(
    spark, store: Store, tmp_path, capsys, source_format
):
    queue = create_queue(store.service, f"from-{source_format}", partitions=2)
    rows = [(f"id-{i}", f'{{"n": {i}}}', "event") for i in range(250)]
    frame = spark.createDataFrame(rows, "id string, body string, kind string")
    path = str(tmp_path / f"source.{source_format}")
    writer = frame.write.option("header", "true") if source_format == "csv" else frame.write
    writer.format(source_format).save(path)
    argv = [
        "--source",
        path,
        "--format",
        source_format,
        "--queue",
        queue,
        "--job-id",
        "file-load",
        "--payload",
        "body",
        "--key",
        "id",
        "--kind",
        "kind",
        "--partitions",
        "2",
        "--staging-dir",
        store.staging,
        *store_arguments(store),
        "--JOB_RUN_ID",
        "jr_ignored",  # Glue's own arguments are ignored
    ]

    assert produce_main(argv, spark=spark) == EXIT_OK
    first = last_json_line(capsys.readouterr().out)
    assert produce_main(argv, spark=spark) == EXIT_OK
    second = last_json_line(capsys.readouterr().out)

    assert (first["status"], first["rows"], first["written"]) == ("ok", 250, 250)
    assert (second["written"], second["skipped_duplicates"]) == (0, 250)
    items = stored(store.service, queue)
    assert sorted(json.loads(item.payload)["n"] for item in items) == list(range(250))
    assert {item.kind for item in items} == {"event"}


def test_the_produce_job_exits_3_and_lists_invalid_rows(spark, store: Store, tmp_path, capsys):
    queue = create_queue(store.service, "csv-invalid", partitions=1)
    path = tmp_path / "source.csv"
    path.write_text("id,body,at\na,ok,\nb,fine,2099-01-01T00:00:00Z\nc,bad,yesterday-ish\n")
    argv = ["--source", str(path), "--format", "csv", "--queue", queue, "--job-id", "csv"]
    argv += ["--payload", "body", "--key", "id", "--enqueue-at", "at", "--partitions", "1"]
    argv += ["--staging-dir", store.staging, *store_arguments(store)]

    assert produce_main(argv, spark=spark) == EXIT_INVALID_ROWS
    report = last_json_line(capsys.readouterr().out)
    assert (report["status"], report["written"], report["invalid"]) == ("invalid_rows", 2, 1)
    assert report["invalid_rows"][0]["row"] == "id='c'"
    assert report["invalid_rows"][0]["column"] == "at"
    # As Glue passes it: every job parameter with a value.
    assert produce_main([*argv, "--allow-invalid", "true"], spark=spark) == EXIT_OK
    assert count_items(store, queue) == 2


def test_the_produce_job_reads_priorities_from_csv_text_and_lists_bad_ones(
    spark, store: Store, tmp_path, capsys
):
    queue = create_queue(store.service, "csv-priority", partitions=1)
    path = tmp_path / "source.csv"
    path.write_text("id,body,prio\na,later,7\nb,default,\nc,too-low,12\nd,words,high\ne,first,0\n")
    argv = ["--source", str(path), "--format", "csv", "--queue", queue, "--job-id", "csv-prio"]
    argv += ["--payload", "body", "--key", "id", "--priority", "prio", "--partitions", "1"]
    argv += ["--staging-dir", store.staging, *store_arguments(store)]

    assert produce_main(argv, spark=spark) == EXIT_INVALID_ROWS
    report = last_json_line(capsys.readouterr().out)
    assert (report["status"], report["written"], report["invalid"]) == ("invalid_rows", 3, 2)
    invalid = {row["row"]: row for row in report["invalid_rows"]}
    assert set(invalid) == {"id='c'", "id='d'"}
    assert {row["column"] for row in invalid.values()} == {"prio"}
    assert "between 0 and 9, got '12'" in invalid["id='c'"]["reason"]
    assert "got 'high'" in invalid["id='d'"]["reason"]
    # Lower priorities lease first; an empty priority is 5
    leased = store.service.lease(queue, batch_size=10, client_id="c").items
    assert [(item.payload, item.priority) for item in leased] == [
        (b"first", 0),
        (b"default", 5),
        (b"later", 7),
    ]


def test_the_produce_job_reads_groups_from_csv_text_and_lists_bad_ones(spark, store: Store, tmp_path, capsys):
    queue = create_queue(store.service, "csv-group", partitions=1)
    path = tmp_path / "source.csv"
    too_long = "g" * 129
    rows = ["id,body,grp", "a,first,acme", "b,second,", f"c,third,{too_long}", "d,fourth,tab\there"]
    rows += ["e,fifth,globex corp"]
    path.write_text("\n".join(rows) + "\n")
    argv = ["--source", str(path), "--format", "csv", "--queue", queue, "--job-id", "csv-group"]
    argv += ["--payload", "body", "--key", "id", "--group", "grp", "--partitions", "1"]
    argv += ["--staging-dir", store.staging, *store_arguments(store)]

    assert produce_main(argv, spark=spark) == EXIT_INVALID_ROWS
    report = last_json_line(capsys.readouterr().out)
    assert (report["status"], report["written"], report["invalid"]) == ("invalid_rows", 3, 2)
    invalid = {row["row"]: row for row in report["invalid_rows"]}
    assert set(invalid) == {"id='c'", "id='d'"}
    assert {row["column"] for row in invalid.values()} == {"grp"}
    assert "longer than 128 bytes" in invalid["id='c'"]["reason"]
    assert "control characters" in invalid["id='d'"]["reason"]
    # An empty CSV field is no group
    items = stored(store.service, queue)
    assert {item.payload: item.group for item in items} == {
        b"first": "acme",
        b"second": "",
        b"fifth": "globex corp",
    }
    # A re-run regenerates the same items: nothing is stored twice
    assert produce_main(argv, spark=spark) == EXIT_INVALID_ROWS
    again = last_json_line(capsys.readouterr().out)
    assert (again["written"], again["skipped_duplicates"], again["invalid"]) == (0, 3, 2)
    assert count_items(store, queue) == 3


def test_the_export_job_writes_every_item_of_every_partition_to_parquet(
    spark, store: Store, tmp_path, capsys
):
    queue = create_queue(store.service, "dead", partitions=3)
    for batch in range(6):
        store.service.produce(queue, [NewItem(payload=f"{batch}-{i}".encode(), kind="k") for i in range(10)])
    later = datetime.now(UTC) + timedelta(days=1)
    store.service.produce(queue, [NewItem(payload=b"scheduled", enqueue_at=later)])
    # One dead letter, with its source queue and why it failed.
    source = create_queue(store.service, "source", partitions=1, dead_queue=queue)
    store.service.produce(source, [NewItem(payload=b"poison")])
    (poison,) = store.service.lease(source, batch_size=1, client_id="c").items
    store.service.retry(source, 0, [RetryRequest(id=poison.id, dead=True, reason="KeyError: 'sku'")])
    output = str(tmp_path / "export")

    assert (
        export_main(["--queue", queue, "--output", output, *store_arguments(store)], spark=spark) == EXIT_OK
    )

    assert last_json_line(capsys.readouterr().out)["items"] == 62
    exported = spark.read.parquet(output).collect()
    payloads = sorted(bytes(row.payload) for row in exported)
    expected = sorted([f"{b}-{i}".encode() for b in range(6) for i in range(10)] + [b"scheduled", b"poison"])
    assert payloads == expected
    assert {row.partition for row in exported} == {0, 1, 2}
    (scheduled,) = [row for row in exported if row.scheduled]
    assert bytes(scheduled.payload) == b"scheduled"
    assert len({row.id for row in exported}) == 62
    (dead,) = [row for row in exported if bytes(row.payload) == b"poison"]
    assert (dead.source_queue, dead.last_reason, dead.failures, dead.source_id) == (
        source,
        "KeyError: 'sku'",
        1,
        poison.id,
    )
    assert {(row.source_queue, row.last_reason, row.failures) for row in exported if row is not dead} == {
        (None, None, None)
    }

    # Appending reports the rows this run wrote, not what the path holds after it.
    store.service.produce(queue, [NewItem(payload=b"one more")])
    append = ["--queue", queue, "--output", output, "--mode", "append", *store_arguments(store)]
    assert export_main(append, spark=spark) == EXIT_OK
    assert last_json_line(capsys.readouterr().out)["items"] == 63
    assert spark.read.parquet(output).count() == 62 + 63


def test_the_http_write_path_produces_through_querator_serve(spark, moto_server: str, tmp_path, capsys):
    prefix = f"h{uuid.uuid4().hex[:8]}"
    settings = Settings(items_table=f"{prefix}-items", catalog_table=f"{prefix}-queues", region="us-east-1")
    env = {
        "AWS_ENDPOINT_URL_DYNAMODB": moto_server,
        EnvVar.ITEMS_TABLE: settings.items_table,
        EnvVar.CATALOG_TABLE: settings.catalog_table,
        EnvVar.REGION: "us-east-1",
    }
    with serve_process(env=env) as base_url:
        store = Store(
            service=DirectTarget(settings=settings, endpoint_url=moto_server).service(),
            target=DirectTarget(settings=settings, endpoint_url=moto_server),
            endpoint=moto_server,
            staging=str(tmp_path / "staging"),
        )
        queue = create_queue(store.service, "over-http", partitions=2)
        # Every 5th row has no group; the others one of four tenants, one name not ASCII.
        groups = {
            i: None if i % 5 == 4 else ["acme", "globex", "initech", "ünïcode"][i % 5] for i in range(300)
        }
        frame = spark.createDataFrame(
            [(i, f"http {i}", None if i % 3 else "2099-01-01T00:00:00Z", groups[i]) for i in range(300)],
            "id long, body string, at string, grp string",
        )
        source = str(tmp_path / "source")
        frame.write.parquet(source)
        argv = ["--source", source, "--queue", queue, "--job-id", "over-http", "--payload", "body"]
        argv += ["--key", "id", "--enqueue-at", "at", "--write-path", "http", "--base-url", base_url]
        argv += ["--group", "grp", "--chunk-items", "50", "--staging-dir", store.staging]

        assert produce_main([*argv, "--partitions", "4"], spark=spark) == EXIT_OK
        first = last_json_line(capsys.readouterr().out)
        # The re-run on "another cluster": other Spark partitions, the same chunks.
        assert produce_main([*argv, "--partitions", "2"], spark=spark) == EXIT_OK
        second = last_json_line(capsys.readouterr().out)

        # The produce reply's Idempotency-Replayed header tells new items from replays.
        assert (first["rows"], first["written"], first["confirmed"], first["failed"]) == (300, 300, 0, 0)
        assert (second["written"], second["skipped_duplicates"], second["confirmed"]) == (0, 300, 0)
        items = stored(store.service, queue)
        assert sorted(item.payload for item in items) == sorted(f"http {i}".encode() for i in range(300))
        assert sum(1 for item in items if item.enqueue_at is not None) == 100
        # Each item carries its row's group over HTTP; a null group is none.
        assert {item.payload: item.group for item in items} == {
            f"http {i}".encode(): groups[i] or "" for i in range(300)
        }
        assert HttpTarget(base_url=base_url).connect().check_queue(queue) == 2
