"""README.md against the tree: the Layout names what exists and every operator module; the features, phases and
documents a reader needs are there."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

from sweep_contracts.api import Phase

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def layout_block() -> str:
    section = README.split("\n## Layout\n", 1)[1]
    return section.split("```", 2)[1]


def _expand_braces(token: str) -> list[str]:
    match = re.search(r"\{([^}]*)\}", token)
    if not match:
        return [token]
    return [token[: match.start()] + part + token[match.end() :] for part in match.group(1).split(",")]


def layout_paths() -> set[Path]:
    """Every `name.py` and `dir/` the Layout names, resolved against the folder its indentation puts it in: a line's
    first `dir/` is the folder of the files after it on its line and of the lines indented below it (other folders
    on that line are its siblings); a line at the margin starts from the repository."""
    named: set[Path] = set()
    stack: list[tuple[int, Path]] = []
    for line in layout_block().splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        base = stack[-1][1] if stack else REPO
        within = base
        first = True
        for raw in line.split():
            word = raw.strip("(),;:`")
            if not (word.endswith("/") or word.endswith(".py")) or "://" in word:
                first = False
                continue
            for token in _expand_braces(word):
                folder = base if token.endswith("/") else within
                matches = list(folder.glob(token.rstrip("/"))) if "*" in token else [folder / token.rstrip("/")]
                assert matches, f"README Layout: {token} (under {folder.relative_to(REPO)}) matches nothing"
                named.update(matches)
                if first and token.endswith("/"):
                    within = base / token.rstrip("/")
                    stack.append((indent, within))
            first = False
    return named


def test_every_path_the_layout_names_exists() -> None:
    """Issue 28: the Layout named controller.py and guard.py where they no longer were."""
    missing = sorted(str(p.relative_to(REPO)) for p in layout_paths() if not p.exists())
    assert missing == []


def test_the_layout_names_every_operator_module_and_tools() -> None:
    named = layout_paths()
    package = REPO / "operator" / "sweep_operator"
    modules = {p for p in package.rglob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    assert sorted(str(p.relative_to(package)) for p in modules - named) == []
    for path in ("tools", "sandbox/sweep_sandbox/kueue", "contracts/sweep_contracts/api.py"):
        assert REPO / path in named, path


def test_features_phases_and_documents_are_there() -> None:
    """Kueue and GPU-hour budgets were missing from the features, BudgetExhausted from the phases, and four
    documents were linked from nowhere."""
    features = README.split("\n## ", 1)[0]
    assert "**GPU-hour budgets.**" in features and "**Kueue mode.**" in features
    phases = next(p for p in README.split("\n\n") if p.startswith("Status phases:"))
    assert sorted(set(re.findall(r"\w+", phases)) & set(get_args(Phase))) == sorted(get_args(Phase))
    for doc in sorted((REPO / "docs").glob("*.md")):
        assert f"](docs/{doc.name})" in README, f"docs/{doc.name} is not linked from README.md"
