"""docs/security.md's threat model (issue 15): one table, each row naming tests that exist."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "security.md"


def rows() -> list[list[str]]:
    table = [line for line in DOC.read_text().splitlines() if line.startswith("|")]
    assert table[0].split("|")[1:-1] == [
        " actor ",
        " what they can do (or try) ",
        " what stops them ",
        " which test proves it ",
    ]
    return [[cell.strip() for cell in line.split("|")[1:-1]] for line in table[2:]]


def test_the_threat_model_is_one_table_whose_every_row_names_a_test() -> None:
    text = DOC.read_text()
    assert text.count("| actor |") == 1
    found = rows()
    assert len(found) >= 10
    for actor, can, stops, proof in found:
        assert actor and can and stops and "tests/" in proof, actor


def test_every_named_test_exists() -> None:
    missing, checked = [], 0
    for *_, proof in rows():
        current = None
        for ref in re.findall(r"`([^`]+)`", proof):
            path, _, name = ref.partition("::")
            if path.startswith("tests/"):
                current = REPO / path
                assert current.is_file(), ref
            if name:
                assert current is not None, ref
                checked += 1
                if not re.search(rf"^(async )?def {re.escape(name)}\(", current.read_text(), re.MULTILINE):
                    missing.append(f"{current.relative_to(REPO)}::{name}")
    assert not missing, missing
    assert checked >= 20
