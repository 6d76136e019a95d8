"""Storage layer, the in-memory store's lanes role: nothing of its own. Bands, group lanes, rings
and group ledgers are fields of the partition's head row (``PartitionHead``, kept whole in
``base._Partition``); what they mean is ``querator.storage.embedded.lanes``."""
