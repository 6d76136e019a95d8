"""The ``querator`` package as a ``.zip`` for ``spark-submit --py-files`` (and Glue's ``--extra-py-files``).

PySpark puts only ``.zip``, ``.egg`` and ``.jar`` files given to ``--py-files`` on the executors'
``sys.path``; a ``.whl`` is shipped but never importable there. The zip holds the wheel's
``querator/`` tree and nothing else (no metadata, no other top-level package). The runtime
dependencies (boto3, pynamodb, pydantic, aws-lambda-powertools) must still be installed on the nodes:
pydantic-core is compiled, so it cannot travel in a zip (docs/spark.md).

    uv build --wheel && python -m querator.spark.pyfiles dist/querator-0.1.0-py3-none-any.whl
    # -> dist/querator-0.1.0-pyfiles.zip
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from pathlib import Path

#: The one package the zip carries.
PACKAGE = "querator/"


def pyfiles_zip(wheel: Path, output: Path | None = None) -> Path:
    """Write the ``querator/`` tree of ``wheel`` to a zip beside it (or at ``output``); return its path.

    Raises
    ------
    ValueError
        ``wheel`` holds no ``querator/`` package.
    """
    name = wheel.name.split("-")
    target = output or wheel.with_name(f"{name[0]}-{name[1]}-pyfiles.zip")
    with zipfile.ZipFile(wheel) as source:
        members = [info for info in source.infolist() if info.filename.startswith(PACKAGE)]
        if not members:
            raise ValueError(f"{wheel} has no {PACKAGE} package")
        with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as zipped:
            for info in members:
                zipped.writestr(info, source.read(info))
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m querator.spark.pyfiles", description=__doc__)
    parser.add_argument("wheel", type=Path, help="the querator wheel (uv build --wheel)")
    parser.add_argument("-o", "--output", type=Path, help="the zip to write (default: beside the wheel)")
    args = parser.parse_args(argv)
    sys.stdout.write(f"{pyfiles_zip(args.wheel, args.output)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["pyfiles_zip"]
