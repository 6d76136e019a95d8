"""Storage layer, the SQLite store's bulk load role: nothing of its own. An import reads the source
ids through ``querator.storage.embedded.bulk`` and writes with ``put_new``, whose rows go in one
statement (``items.SQLiteItemRows.put_all``); there is no bulk path into SQLite (the Spark producer
writes to DynamoDB)."""
