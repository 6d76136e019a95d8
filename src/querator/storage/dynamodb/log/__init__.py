"""Storage layer: engine v3's claim log on DynamoDB (``store.DynamoDBClaimLog``; ADR 0100, L-spill), a
module per role of the port (``items``, ``leasing``, ``upkeep``) over ``base``."""

from __future__ import annotations

from querator.storage.dynamodb.log.leasing import HEAD_RECORDS, SPILL
from querator.storage.dynamodb.log.store import DynamoDBClaimLog

__all__ = ["HEAD_RECORDS", "SPILL", "DynamoDBClaimLog"]
