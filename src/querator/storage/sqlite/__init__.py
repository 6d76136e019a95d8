"""Storage layer: the SQLite store and catalog, one file on this machine (stdlib ``sqlite3``).

For ``querator serve`` (its default store) and ``querator.embedded``. Adapter notes, where it differs
from the ``ItemStore`` port or the DynamoDB reference:

- The port's semantics are ``storage.embedded``'s, over tables keyed like the reference's rows:
  items by ``(queue, partition, id)``, so a range read is an index range, O(log n + k)
  (``WITHOUT ROWID``: the primary key is the clustered index, no second lookup).
- Every port call is one transaction; writes start with ``BEGIN IMMEDIATE``, so a guarded write's
  check and write cannot interleave with another writer, in this process (threads, each transaction
  on a pooled connection of its own) or another one on the machine (the file lock).
  ``busy_timeout`` makes a writer wait for the lock instead of failing. WAL lets readers run beside
  the writer.
- Engine v3's claim log (``SQLiteClaimLog``: ``storage.embedded.log`` over the ``log_*`` tables of
  schema 7, beside v2's in the same file). An append whose items are due now and fit one row is one
  ``INSERT`` in a transaction of its own: its positions start at the log's tail, the larger of the
  head's (which only reservations and larger appends move) and the end of its rows, so it writes no
  head row; ``LogHead.produced`` is derived the same way (the head's notes). A claim's
  fetch-and-add is one ``UPDATE ... RETURNING`` of the head.
- The write-ahead log is checkpointed every ``WAL_CHECKPOINT_PAGES`` pages rather than SQLite's
  1,000: a checkpoint's disk flushes were a fifth of a small write's cost.
- Durability is the store URL's choice (``sqlite:PATH?sync=full``): ``synchronous=NORMAL`` in WAL
  mode by default, where a committed write survives the process being killed but the last writes
  before an OS crash or a power cut may be lost; ``FULL`` flushes the log to disk at every commit,
  so an acknowledged write survives those too. On this project's machines FULL cost one disk flush
  (about 4 ms) per commit: a commit of one 100 B row went from 18,000-33,000 a second to 240-270,
  of 100 rows from 167,000 rows a second to 24,000 (docs/adr/0060-embedded-stores.md).
- The file is identified by ``PRAGMA application_id`` and carries its schema version in
  ``querator_meta``. ``SQLiteDatabase`` checks both on a read-only connection before writing
  anything, so a file that is not a Querator database, or one from a newer Querator, is refused and
  left as it was.

The store's own part of each role is in a module named after it (``items``, ``leasing``,
``lanes``, ``upkeep``, ``idempotency``, ``bulk``): the statements that role runs, as mixins of the
rows (composed in ``store._SQLiteRows``) and of the store where SQLite does a step in fewer
statements than ``querator.storage.embedded``; ``log`` is engine v3's claim log, split the same way.
``database`` is the file (schema, migrations, connections, transactions), ``catalog`` the queues.
"""

from __future__ import annotations

from querator.storage.sqlite.catalog import SQLiteQueueCatalog
from querator.storage.sqlite.database import APPLICATION_ID, SCHEMA_VERSION, DatabaseFileError, SQLiteDatabase
from querator.storage.sqlite.log import SQLiteClaimLog
from querator.storage.sqlite.store import SQLiteItemStore

__all__ = [
    "APPLICATION_ID",
    "SCHEMA_VERSION",
    "DatabaseFileError",
    "SQLiteClaimLog",
    "SQLiteDatabase",
    "SQLiteItemStore",
    "SQLiteQueueCatalog",
]
