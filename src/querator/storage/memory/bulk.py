"""Storage layer, the in-memory store's bulk load role: nothing of its own. An import reads the
source ids through ``querator.storage.embedded.bulk`` and writes with ``put_new``; there is no
bulk path into memory (the Spark producer writes to DynamoDB)."""
