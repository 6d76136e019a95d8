"""Storage layer, the SQLite store's lanes role: the head row keeps the bands other than priority 5's,
the group lanes, the rings and the group ledgers as JSON in one column (``heads.bands``); this is
its encoding. What they mean is ``querator.storage.embedded.lanes``."""

from __future__ import annotations

import json
from typing import Any

from querator.domain.model import timestamp_us, utc_from_timestamp_us
from querator.ports import GroupLedger, PartitionHead


def _encode_bands(head: PartitionHead) -> str | None:
    """The head's bands other than priority 5's and group lanes, rings and ledgers of fair
    delivery, as JSON (``None`` when there are none)."""
    if not (head.band_registered or head.band_cursors or head.band_sweeps or head.has_lanes):
        return None
    data: dict[str, Any] = {
        "cursors": dict(head.band_cursors),
        "sweeps": dict(head.band_sweeps),
        "registered_us": {band: timestamp_us(at) for band, at in head.band_registered.items()},
    }
    if head.has_lanes:
        data["lanes"] = True
        data["rings"] = dict(head.rings)
        data["ledgers"] = {
            group: {"v": ledger.version, "l": {i: timestamp_us(d) for i, d in ledger.leases.items()}}
            for group, ledger in head.group_ledgers.items()
        }
    return json.dumps(data)


def _decode_bands(value: str | None) -> dict[str, Any]:
    if value is None:
        return {}
    data = json.loads(value)
    return {
        "band_cursors": data["cursors"],
        "band_sweeps": data["sweeps"],
        "band_registered": {
            band: utc_from_timestamp_us(us) for band, us in data.get("registered_us", {}).items()
        },
        "has_lanes": data.get("lanes", False),
        "rings": data.get("rings", {}),
        "group_ledgers": {
            group: GroupLedger(
                version=ledger["v"], leases={i: utc_from_timestamp_us(us) for i, us in ledger["l"].items()}
            )
            for group, ledger in data.get("ledgers", {}).items()
        },
    }
