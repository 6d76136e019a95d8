"""The shipped ``.zip`` on ``--py-files`` is importable on executors whose Python lacks querator."""

# ruff: noqa: S603 - the commands are this test's own: uv, venv and this Python

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from querator.spark.pyfiles import pyfiles_zip

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]

#: The driver: a local session whose Python workers run ``executor_python`` with the zip on
#: ``spark.submit.pyFiles``; each task maps rows with querator and says where it imported it from.
DRIVER = """
import json, sys
from pyspark.sql import SparkSession
pyfiles = sys.argv[2]  # sys.argv[1]: the workers' Python, also in PYSPARK_PYTHON
spark = (
    SparkSession.builder.master("local[2]").appName("pyfiles")
    .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
    .config("spark.driver.bindAddress", "127.0.0.1")
    .config("spark.submit.pyFiles", pyfiles)
    .getOrCreate()
)

def on_executor(n):
    import querator
    from querator.spark.mapping import ColumnMap, row_to_item
    item = row_to_item({"body": f"row {n}"}, ColumnMap(payload=("body",)))
    return (querator.__file__, item.payload.decode())

print(json.dumps(spark.sparkContext.parallelize(range(4), 2).map(on_executor).collect()))
spark.stop()
"""


def executor_python(where: Path) -> Path:
    """A Python with this environment's packages but not querator (no editable ``.pth`` processed)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # A directory named in a .pth is added as it is: the .pth files inside it (querator's editable
    # install among them) are not read.
    Path(site, "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def test_the_pyfiles_zip_reaches_executors_that_do_not_have_querator(tmp_path):
    uv = shutil.which("uv")
    assert uv is not None, "uv builds the wheel the zip is made from; it must be on PATH"
    subprocess.run(
        [uv, "build", "--wheel", "--quiet", "--out-dir", str(tmp_path / "dist"), str(ROOT)],
        check=True,
        timeout=300,
    )
    (wheel,) = (tmp_path / "dist").glob("querator-*.whl")
    zipped = pyfiles_zip(wheel)
    names = zipfile.ZipFile(zipped).namelist()
    assert {name.split("/")[0] for name in names} == {"querator"}

    python = executor_python(tmp_path / "executor")
    lacking = subprocess.run(
        [str(python), "-c", "import querator"], capture_output=True, cwd=tmp_path, check=False
    )
    assert lacking.returncode != 0, "the executors' Python must not have querator of its own"

    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYSPARK_PYTHON"}}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    # The workers' Python (PySpark 3.3 reads only the variable when not started by spark-submit).
    env["PYSPARK_PYTHON"] = str(python)
    result = subprocess.run(
        [sys.executable, "-c", DRIVER, str(python), str(zipped)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(result.stdout.strip().splitlines()[-1])
    assert sorted(payload for _, payload in rows) == [f"row {n}" for n in range(4)]
    assert all(zipped.name in origin for origin, _ in rows), rows
