"""``querator serve`` on a SQLite file, as a user meets it: stopped with SIGTERM and started again on
the same file, queues and items are there and leases keep running on the wall clock; a bad
``--store`` is one line, exit 2, and the file is left as it was."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time

import pytest

from querator.client import Client
from querator.testing import serve_process

pytestmark = pytest.mark.server


def test_queues_items_and_valid_leases_survive_a_restart(tmp_path):
    store = f"sqlite:{tmp_path / 'querator.db'}"
    with serve_process("--store", store) as url, Client(url) as client:
        client.create_queue("kept", lease_timeout="4s", expire_timeout="1h")
        client.produce("kept", [b"a", b"b", b"c"])
        leased = client.lease("kept", 2, request_timeout="1s")
    deadline = time.monotonic() + 4  # the lease ends about here (it started a little earlier)
    assert [i.payload for i in leased.items] == [b"a", b"b"]

    with serve_process("--store", store) as url, Client(url) as client:
        assert [q.queue_name for q in client.list_queues()] == ["kept"]
        assert [i.payload for i in client.list_items("kept")] == [b"a", b"b", b"c"]
        # Still valid after the restart: completing a works, and b stays leased.
        client.complete("kept", [leased.items[0]])
        assert [i.payload for i in client.lease("kept", 10, request_timeout="0s").items] == [b"c"]
        # Once its deadline has passed, b is leasable again (put back by its lease record).
        time.sleep(max(0.0, deadline - time.monotonic()) + 0.2)
        again = client.lease("kept", 10, request_timeout="2s").items
        assert [(i.payload, i.attempts) for i in again] == [(b"b", 2)]


@pytest.mark.parametrize(
    "store",
    [
        "postgres://localhost/q",
        "sqlite:{tmp}/plain/querator.db",
        "sqlite:{tmp}/notes.txt",
        "sqlite:{tmp}/newer.db",
    ],
)
def test_a_bad_store_is_one_line_exit_2_and_the_file_is_untouched(tmp_path, store):
    (tmp_path / "plain").write_text("a file where a directory would have to be")
    notes = tmp_path / "notes.txt"
    notes.write_text("not a database\n" * 50)
    newer = tmp_path / "newer.db"
    _newer_database(newer)
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.iterdir() if p.is_file()}

    child = subprocess.run(  # noqa: S603 - our own module
        [sys.executable, "-m", "querator.cli", "serve", "--port", "0", "--store", store.format(tmp=tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert child.returncode == 2, child.stderr
    assert child.stdout == ""
    assert len(child.stderr.strip().splitlines()) == 1, child.stderr
    assert child.stderr.startswith("querator serve: ")
    after = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.iterdir() if p.is_file()}
    assert after == before


def _newer_database(path) -> None:
    import sqlite3  # noqa: PLC0415

    from querator.storage.sqlite import SCHEMA_VERSION, SQLiteDatabase  # noqa: PLC0415

    SQLiteDatabase(path).close()
    connection = sqlite3.connect(path)
    connection.execute(
        "UPDATE querator_meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),)
    )
    connection.commit()
    connection.close()
