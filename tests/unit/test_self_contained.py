"""What a user reads stays inside the repository: no source comment or doc points at files that only
the project's authors have (a design note or an API contract beside the repository)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ["README.md", "docs", "src", "functions", "infra", "jobs", "layers", "localstack"]
OUTSIDE = re.compile(r"DESIGN\.md|STYLE\.md|contract/API\.md|\bAPI\.md|shared/contract")
NOT_YET: set[str] = set()


def test_nothing_points_outside_the_repository() -> None:
    found = []
    for top in SCANNED:
        paths = [ROOT / top] if (ROOT / top).is_file() else sorted((ROOT / top).rglob("*"))
        for path in paths:
            relative = path.relative_to(ROOT).as_posix()
            if not path.is_file() or path.suffix not in {".md", ".py", ".sh", ".json", ".yml", ".txt"}:
                continue
            if relative in NOT_YET or "/node_modules/" in relative or "/dist/" in relative:
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
                if OUTSIDE.search(line):
                    found.append(f"{relative}:{number}: {line.strip()}")
    assert not found, "\n".join(found)
