"""Spark suite fixtures: one local Spark session and one single-threaded moto server per session.

The master is ``local[1,2]``: one task at a time (as ``local[1]``), and a failed task is tried a second
time, which plain ``local[1]`` never does (it allows one failure in total). The retry test needs that;
the others never fail a task.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from querator.testing import local_spark_session
from tests.spark.helpers import Store, fresh_store

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pyspark.sql import SparkSession


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
def store(moto_server: str) -> Store:
    return fresh_store(moto_server)
