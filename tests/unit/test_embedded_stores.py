"""What only the embedded stores do, beyond the port's contract (``tests/contract``)."""

from __future__ import annotations

import contextlib
import sqlite3
from datetime import timedelta

import pytest

from querator.ports import IdempotencyRecord
from querator.storage.memory import InMemoryItemStore
from querator.storage.sqlite import SQLiteDatabase, SQLiteItemStore
from querator.testing import EPOCH

pytestmark = pytest.mark.disable_socket


def record(key: str, at) -> IdempotencyRecord:
    return IdempotencyRecord(key=key, partition=0, ids=[], done=True, started_at=at, queue_created_at=EPOCH)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_expired_idempotency_records_are_deleted_as_new_ones_come_like_dynamodbs_ttl(kind, tmp_path):
    if kind == "memory":
        store = InMemoryItemStore()

        def stored() -> int:
            return len(store._rows._idem)
    else:
        store = SQLiteItemStore(SQLiteDatabase(tmp_path / "q.db"))

        def stored() -> int:
            with contextlib.closing(sqlite3.connect(tmp_path / "q.db")) as connection:
                return connection.execute("SELECT count(*) FROM idempotency").fetchone()[0]

    ttl = timedelta(hours=24)
    for n in range(6):
        store.begin_idempotent("q", record(f"old{n}", EPOCH), stale_before=EPOCH, expires_at=EPOCH + ttl)
    assert stored() == 6
    later = EPOCH + ttl + timedelta(seconds=2)
    won, previous = store.begin_idempotent(
        "q", record("new", later), stale_before=later, expires_at=later + ttl
    )
    assert (won, previous) == (True, None)
    assert stored() == 3  # four expired records went with the new one; two are left for the next
    store.begin_idempotent("q", record("new2", later), stale_before=later, expires_at=later + ttl)
    assert stored() == 2  # only the two new ones are left
