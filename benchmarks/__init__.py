"""Benchmarks for querator: throughput and DynamoDB cost per delivered item."""

from __future__ import annotations
