"""docs/guard.md names a test for each rule: every test it names exists (a renamed or deleted test fails here)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_test_docs_guard_names_exists() -> None:
    text = (REPO / "docs" / "guard.md").read_text()
    named = re.findall(r"`((?:tests/\w+/)?test_\w+\.py)(?:::(\w+))?", text)
    assert len(named) >= 20
    files = {path.name: path for path in (REPO / "tests").rglob("test_*.py")}
    for file, test in named:
        path = REPO / file if "/" in file else files.get(file)
        assert path is not None and path.exists(), file
        if test:
            assert re.search(rf"^(async )?def {test}\b", path.read_text(), re.M), f"{file}::{test}"
    rows = [line for line in text.splitlines() if re.match(r"\| \d+ \|", line)]
    assert rows and all("test" in row for row in rows), "every rule names its test"
