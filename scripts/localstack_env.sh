#!/usr/bin/env bash
# LocalStack on the host, for the LocalStack deploy test (tests/infra/test_localstack_deploy.py): builds
# .venv-localstack with localstack-core on CPython 3.13 (4.10 needs 3.13 outside its image), its
# dependencies resolved as of its release date so a later release of one of them cannot break it.
# `./run test` calls it before the slow suites (QUERATOR_TEST_SUITES=all, as CI does); the test calls it
# too, so running that file alone works. A second run reinstalls nothing (the stamp below).
#
# Needs: uv, a CPython 3.13 (PYTHON313, else pyenv's newest 3.13.x under `pyenv root`) and the package
# registry (or uv's cache) for the first build. Anything missing stops it with a message saying what.
set -euo pipefail
cd "$(dirname "$0")/.."

ENV_DIR="${LOCALSTACK_ENV:-.venv-localstack}"
LOCALSTACK_CORE="localstack-core[runtime]==4.10.0"
# 4.10.0's release day (PyPI, 2025-10-30): nothing newer than the next day is resolved.
EXCLUDE_NEWER="2025-10-31"

fail() { echo "localstack_env: $*" >&2; exit 1; }

command -v uv >/dev/null 2>&1 || fail "uv is not on PATH (./run test installs it)"

python313="${PYTHON313:-}"
if [ -z "$python313" ]; then
    root="$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")"
    candidate="$(ls -d "$root"/versions/3.13.* 2>/dev/null | sort -V | tail -n 1 || true)"
    [ -n "$candidate" ] && python313="$candidate/bin/python3.13"
fi
[ -n "$python313" ] && [ -x "$python313" ] || fail "no CPython 3.13 found: set PYTHON313=/path/to/python3.13 \
or install one with 'pyenv install 3.13' (localstack-core 4.10 runs on 3.13 outside its image)"
"$python313" -c 'import sys; assert sys.version_info[:2] == (3, 13), sys.version' \
    || fail "$python313 is not Python 3.13"

stamp="$ENV_DIR/.querator-stamp"
want="$(sha256sum "$0" | cut -d' ' -f1) $LOCALSTACK_CORE $EXCLUDE_NEWER"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "localstack_env: building $ENV_DIR ($LOCALSTACK_CORE on $python313, packages as of $EXCLUDE_NEWER)..." >&2
    started=$SECONDS
    rm -rf "$ENV_DIR"
    uv venv --quiet --python "$python313" "$ENV_DIR"
    uv pip install --quiet --compile-bytecode --python "$ENV_DIR/bin/python" --exclude-newer "$EXCLUDE_NEWER" \
        "$LOCALSTACK_CORE"
    echo "$want" >"$stamp"
    echo "localstack_env: built in $((SECONDS - started)) s" >&2
fi
