"""Spark suite fixtures: one local Spark session and one single-threaded moto server per session.

The master is ``local[1,2]``: one task at a time (as ``local[1]``), and a failed task is tried a second
time, which plain ``local[1]`` never does (it allows one failure in total). The retry test needs that;
the others never fail a task.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import pytest

from tests.spark.helpers import Store, fresh_store

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pyspark.sql import SparkSession


_FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # The executors' Python workers inherit the JVM's environment, which is this process's when the
    # JVM starts: fake credentials and loopback-only networking must be in place before that.
    for name, value in _FAKE_AWS.items():
        os.environ.setdefault(name, value)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession  # noqa: PLC0415 - only the Spark suite needs the JVM

    builder = (
        SparkSession.builder.master("local[1,2]")
        .appName("querator-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
    )
    for name, value in _FAKE_AWS.items():
        builder = builder.config(f"spark.executorEnv.{name}", value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def store(moto_server: str) -> Store:
    return fresh_store(moto_server)
