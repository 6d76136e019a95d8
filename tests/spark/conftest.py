"""Spark suite fixtures: one local Spark session and one single-threaded moto server per session.

The master is ``local[1,2]``: one task at a time (as ``local[1]``), and a failed task is tried a second
time, which plain ``local[1]`` never does (it allows one failure in total). The retry test needs that;
the others never fail a task.
"""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

import pytest

from querator.testing import local_spark_session
from tests.spark.helpers import Store, fresh_store

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pyspark.sql import SparkSession


def pytest_configure(config: pytest.Config) -> None:
    import pyspark  # noqa: PLC0415 - only to read its version

    if tuple(int(part) for part in pyspark.__version__.split(".")[:2]) < (3, 4):
        # PySpark 3.3 leaves the socket it reads a job's results from to the garbage collector
        # (closed explicitly from 3.4 on); "warnings are errors" would fail whichever test is running.
        config.addinivalue_line(
            "filterwarnings",
            "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning",
        )


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = local_spark_session(
        master="local[1,2]",
        app="querator-spark-tests",
        config={"spark.sql.shuffle.partitions": "2", "spark.sql.session.timeZone": "UTC"},
    )
    yield session
    session.stop()


@pytest.fixture
def store(moto_server: str) -> Iterator[Store]:
    created = fresh_store(moto_server)
    yield created
    shutil.rmtree(created.staging, ignore_errors=True)
