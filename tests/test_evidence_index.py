"""docs/evidence.md's table names every folder of results/, and only folders that exist: the index a reader
starts from stays whole as evidence is added."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_results_folder_has_a_row_and_every_row_a_folder():
    text = (ROOT / "docs" / "evidence.md").read_text(encoding="utf-8")
    table = text.split("## The folders", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"^\| `([^`/]+)/", table, flags=re.MULTILINE))
    folders = {p.name for p in (ROOT / "results").iterdir() if p.is_dir()}
    assert folders - named == set(), "results folders without a row in docs/evidence.md"
    assert named - folders == set(), "rows of docs/evidence.md naming no results folder"
