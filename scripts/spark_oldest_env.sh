#!/usr/bin/env bash
# The Spark tests on the oldest supported Python and PySpark (docs/adr/0021-python-and-spark-versions.md):
# builds .venv-spark-oldest (Python 3.10 + PySpark 3.3, the other dependencies as uv.lock pins them for
# 3.10) and runs tests/spark there. `./run test` calls it after the main suite; on its own:
#   scripts/spark_oldest_env.sh [pytest options]
#
# Needs: uv, a CPython 3.10 (PYTHON310, else pyenv's newest 3.10.x under `pyenv root`), Java 17 or 11
# for Spark 3.3, and the package registry (or uv's cache) for the first build. Anything missing stops
# it with a message saying what; nothing is skipped silently.
set -euo pipefail
cd "$(dirname "$0")/.."

ENV_DIR="${SPARK_OLDEST_ENV:-.venv-spark-oldest}"
PYSPARK_OLDEST="${PYSPARK_OLDEST:-pyspark>=3.3,<3.4}"

fail() { echo "spark_oldest_env: $*" >&2; exit 1; }

command -v uv >/dev/null 2>&1 || fail "uv is not on PATH (./run test installs it)"
command -v java >/dev/null 2>&1 || fail "no java on PATH: PySpark 3.3 needs Java 11 or 17"

python310="${PYTHON310:-}"
if [ -z "$python310" ]; then
    # pyenv's root, or where pyenv keeps it when pyenv itself is not on PATH.
    root="$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")"
    # The newest 3.10.x pyenv has built (version-sorted).
    candidate="$(ls -d "$root"/versions/3.10.* 2>/dev/null | sort -V | tail -n 1 || true)"
    [ -n "$candidate" ] && python310="$candidate/bin/python"
fi
[ -n "$python310" ] && [ -x "$python310" ] || fail "no CPython 3.10 found: set PYTHON310=/path/to/python3.10 \
or install one with 'pyenv install 3.10' (the oldest Python the package supports, ADR 0021)"
"$python310" -c 'import sys; assert sys.version_info[:2] == (3, 10), sys.version' \
    || fail "$python310 is not Python 3.10"

# Rebuilt when uv.lock, pyproject.toml or this script change; otherwise reused as it is.
stamp="$ENV_DIR/.querator-stamp"
want="$(cat uv.lock pyproject.toml "$0" | sha256sum | cut -d' ' -f1) $PYSPARK_OLDEST"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "spark_oldest_env: building $ENV_DIR (Python 3.10 from $python310, $PYSPARK_OLDEST)..." >&2
    rm -rf "$ENV_DIR"
    uv venv --quiet --python "$python310" "$ENV_DIR"
    reqs="$(mktemp)"
    trap 'rm -f "$reqs"' EXIT
    # The lock's pins for 3.10: runtime, the embedded store and the test tools; PySpark is the oldest
    # supported instead of the lock's.
    uv export --quiet --frozen --no-hashes --no-emit-project --extra local --extra spark \
        --no-default-groups --group dev --format requirements-txt \
        | grep -v -i -E '^(pyspark|py4j)==' >"$reqs"
    uv pip install --quiet --compile-bytecode --python "$ENV_DIR/bin/python" -r "$reqs" "$PYSPARK_OLDEST"
    uv pip install --quiet --python "$ENV_DIR/bin/python" --no-deps -e .
    echo "$want" >"$stamp"
fi

"$ENV_DIR/bin/python" -c 'import sys, pyspark; print(f"spark_oldest_env: Python {sys.version.split()[0]}, PySpark {pyspark.__version__}")' >&2
# Only the Spark suite (and its pure parts); the rest of the product is tested on the main environment.
exec "$ENV_DIR/bin/python" -m pytest tests/spark -p no:cacheprovider -q "$@"
