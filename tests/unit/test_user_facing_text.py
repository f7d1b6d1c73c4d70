"""What users read names no internal ids: no rule ids (`R22`) and no issue numbers in the docs, the README, the chart,
the examples and the CLI's help; and every file `pyproject.toml` cites exists."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from sweep_operator.cli import build_parser
from sweep_operator.cli.kubectl_plugin import USAGE as PLUGIN_USAGE

REPO = Path(__file__).resolve().parents[2]

# Rule ids (`R22`, `(R6, R20)`) and issue numbers (`issue 25`, `Issue 30's`, `issues #4`). Rule ids may stay in code
# comments and tests, which users do not read.
INTERNAL_ID = re.compile(r"\bR\d{1,2}\b|\b(?i:issues?) #?\d+")

USER_FACING = ("README.md", "docs", "charts", "examples")
# Files under those folders that are not prose a user reads, each with its reason.
EXCLUDED: dict[str, str] = {
    # Byte-identical copies of crds/ (tests/unit/test_chart.py compares them); their descriptions are checked by
    # the scan of crds/ below, so the copy needs no second look.
    "charts/trainingsweep-operator/crds": "copies of crds/",
}
TEXT_SUFFIXES = {".md", ".yaml", ".yml", ".json", ".tpl", ".txt", ""}


def user_facing_files() -> list[Path]:
    files: list[Path] = []
    for entry in USER_FACING:
        root = REPO / entry
        candidates = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in candidates:
            rel = path.relative_to(REPO).as_posix()
            if any(rel == ex or rel.startswith(ex + "/") for ex in EXCLUDED):
                continue
            if path.suffix in TEXT_SUFFIXES:
                files.append(path)
    files += sorted((REPO / "crds").glob("*.yaml"))
    return files


def internal_ids(text: str, where: str) -> list[str]:
    return [
        f"{where}:{text.count(chr(10), 0, match.start()) + 1}: {match.group(0)!r}"
        for match in INTERNAL_ID.finditer(text)
    ]


def test_the_pattern_finds_rule_ids_and_issue_numbers_and_nothing_else() -> None:
    assert internal_ids("verifies before any deletion (R22)", "x")
    assert internal_ids("startup diagnosis (R6, R20)", "x")
    assert internal_ids("The guard's finalizer (issue 25): a", "x")
    assert internal_ids("### Issue 30: the cost", "x")
    assert not internal_ids("R2D2, R100, IRSA, RayJob, r5.xlarge, an issue with 2 causes", "x")


def test_docs_readme_chart_and_examples_name_no_rule_ids_or_issue_numbers() -> None:
    files = user_facing_files()
    assert len(files) > 40  # the scan reaches the tree
    found = [hit for path in files for hit in internal_ids(path.read_text(), path.relative_to(REPO).as_posix())]
    assert not found, "\n".join(found)


def _help_texts(parser: argparse.ArgumentParser, prog: str) -> list[tuple[str, str]]:
    texts = [(prog, parser.format_help())]
    for action in parser._actions:  # argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                texts += _help_texts(sub, f"{prog} {name}")
    return texts


def test_the_cli_help_names_no_rule_ids_or_issue_numbers() -> None:
    texts = [*_help_texts(build_parser(), "sweepctl"), ("kubectl sweep", PLUGIN_USAGE)]
    assert len(texts) > 10
    found = [hit for prog, text in texts for hit in internal_ids(text, prog)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("document", ["pyproject.toml"])
def test_every_file_a_comment_in_pyproject_cites_exists(document: str) -> None:
    comments = "\n".join(line.split("#", 1)[1] for line in (REPO / document).read_text().splitlines() if "#" in line)
    cited = set(re.findall(r"[\w./-]*\w\.(?:md|toml|py|ini|json|yaml)\b|\.importlinter\b", comments))
    assert "docs/testing.md" in cited  # the pattern reads the comments
    missing = [
        name
        for name in sorted(cited)
        if not any((REPO / base / name).exists() for base in ("", "operator", "operator/sweep_operator"))
    ]
    assert not missing, f"{document} cites files that do not exist: {missing}"
