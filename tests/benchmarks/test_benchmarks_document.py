"""``python -m benchmarks`` rewrites docs/benchmarks.md sections 1-7 and keeps the ones after them,
which other benchmark modules' runs wrote (a full run used to drop them)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.__main__ import KEPT_FROM, kept_sections

DOCUMENT = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"


def test_the_sections_after_the_generated_ones_are_kept_whole() -> None:
    generated = "# Benchmarks\n\n## 1. Cost\n\nold figures\n\n## 7. Capacity\n\nmodel\n\n"
    old = generated + "## 8. Spark\n\nrows/s\n\n## 10. Stream\n\n$\n"
    assert kept_sections(old) == "## 8. Spark\n\nrows/s\n\n## 10. Stream\n\n$\n"


def test_a_document_without_them_keeps_nothing() -> None:
    assert kept_sections("# Benchmarks\n\n## 1. Cost\n\nfigures\n") == ""


def test_the_repositorys_document_has_the_sections_this_keeps() -> None:
    kept = kept_sections(DOCUMENT.read_text(encoding="utf-8"))
    assert kept.startswith(KEPT_FROM)
    assert "## 10. The stream on AWS" in kept and "## 11. Priorities and redrive" in kept
