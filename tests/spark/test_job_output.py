"""The jobs' stdout holds only the JSON summary, so ``... | jq`` reads it: the product's log lines go
to stderr, also under ``spark-submit``, whose Python driver has its stderr merged into its stdout."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from querator.client import Client
from querator.spark.cli import DriverLogHandler
from querator.testing import serve_process

ROOT = Path(__file__).resolve().parents[2]


def _spark_version() -> tuple[int, int]:
    import pyspark  # noqa: PLC0415 - only for the slow test

    major, minor = pyspark.__version__.split(".")[:2]
    return int(major), int(minor)


class _Log4j:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def __getattr__(self, level: str):  # info, warn, error
        return lambda text: self.lines.append((level, text))


def _session(log4j: _Log4j) -> SimpleNamespace:
    logger_of = SimpleNamespace(getLogger=lambda name: log4j)
    jvm = SimpleNamespace(
        org=SimpleNamespace(
            apache=SimpleNamespace(logging=SimpleNamespace(log4j=SimpleNamespace(LogManager=logger_of)))
        )
    )
    return SimpleNamespace(sparkContext=SimpleNamespace(_jvm=jvm))


def _record(level: int, message: str) -> logging.LogRecord:
    return logging.LogRecord("querator.spark.job", level, __file__, 1, message, None, None)


def test_under_a_jvm_the_lines_wait_for_the_session_then_go_through_log4j(capfd) -> None:
    handler = DriverLogHandler(through_jvm=True)
    handler.emit(_record(logging.INFO, "ignoring arguments"))
    log4j = _Log4j()

    handler.attach(_session(log4j))  # type: ignore[arg-type]
    handler.emit(_record(logging.WARNING, "slow"))
    handler.emit(_record(logging.ERROR, "failed"))

    assert log4j.lines == [("info", "ignoring arguments"), ("warn", "slow"), ("error", "failed")]
    assert capfd.readouterr() == ("", "")


def test_started_by_python_the_lines_go_to_its_stderr(capfd) -> None:
    handler = DriverLogHandler(through_jvm=False)
    handler.emit(_record(logging.INFO, "staged a plan"))
    out, err = capfd.readouterr()
    assert out == "" and err.endswith("INFO querator.spark.job: staged a plan\n")


@pytest.mark.slow
def test_spark_submit_prints_only_the_summary_on_stdout(tmp_path) -> None:
    spark_submit = Path(sys.executable).parent / "spark-submit"
    if not spark_submit.exists():
        pytest.fail(f"no spark-submit beside {sys.executable}: pyspark ships it")
    source = tmp_path / "source.csv"
    source.write_text("id,body\n1,a\n2,b\n")
    with serve_process() as url:
        with Client(url) as client:
            client.create_queue("spark-stdout", lease_timeout="30s", expire_timeout="1h")
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
        env["SPARK_LOCAL_IP"] = "127.0.0.1"
        argv = [str(spark_submit), "--master", "local[1]", str(ROOT / "jobs" / "produce.py")]
        argv += ["--source", str(source), "--format", "csv", "--queue", "spark-stdout", "--job-id", "j1"]
        argv += ["--payload", "body", "--key", "id", "--write-path", "http", "--base-url", url]
        argv += ["--staging-dir", str(tmp_path / "staging"), "--JOB_ID", "glue-adds-this"]
        done = subprocess.run(  # noqa: S603 - spark-submit of this checkout's job
            argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240, check=False
        )
    assert done.returncode == 0, done.stderr[-3000:]
    if _spark_version() < (3, 4):
        # Spark 3.3's spark-submit writes everything, its JVM's stderr too, to stdout (measured: an
        # empty stderr). The summary is still one whole line of its own among Spark's log lines.
        [line] = [text for text in done.stdout.splitlines() if text.startswith('{"')]
        logs = done.stdout
    else:
        [line] = done.stdout.splitlines()  # nothing but the summary
        logs = done.stderr
    assert json.loads(line)["written"] == 2
    assert "INFO querator: produce job j1 into spark-stdout" in logs
    assert "ignoring arguments this job does not define" in logs
