"""The operator's and the contracts' sources explain themselves: comments and docstrings say why without naming the
issue that asked for it, and each module opens with a docstring of one or two sentences saying what it is for."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("operator/sweep_operator", "contracts/sweep_contracts")
# "issue 16", "(Issue 28)", "issues 14 and 29", "#41", "defect 5"; an HTML colour (#555) has no word boundary after
# letters, and a character reference (&#39;) is preceded by "&".
ISSUE_TAG = re.compile(r"\bissues? #?\d+|(?<![\w&])#\d+\b|\bdefect \d+", re.IGNORECASE)
RULE_ID = re.compile(r"\bR(?:[1-9]|1\d|2[0-2])\b")
OPENING_CHARS = 200
OPENING_SENTENCES = 2


def sources(root: Path = ROOT) -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((root / package).rglob("*.py"))


def explanations(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and every module, class and function docstring in `path`."""
    source = path.read_text()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield getattr(node, "lineno", 1), doc


def issue_tags(root: Path = ROOT) -> list[str]:
    return [
        f"{path.relative_to(root)}:{line}: {match.group(0)}"
        for path in sources(root)
        for line, text in explanations(path)
        for match in ISSUE_TAG.finditer(text)
    ]


def opening(doc: str) -> str:
    return " ".join(doc.strip().split("\n\n", 1)[0].split())


def sentence_count(text: str) -> int:
    return len(re.findall(r"[.!?](?=\s+[A-Z`(\"']|$)", text))


def long_openings(root: Path = ROOT) -> list[str]:
    found = []
    for path in sources(root):
        doc = ast.get_docstring(ast.parse(path.read_text()))
        first = opening(doc or "")
        if not first or len(first) > OPENING_CHARS or sentence_count(first) > OPENING_SENTENCES:
            found.append(f"{path.relative_to(root)}: {len(first)} characters, {sentence_count(first)} sentences")
    return found


def test_comments_say_why_without_issue_numbers_and_cite_only_rules_a_test_cites() -> None:
    assert issue_tags() == [], "say why in the comment; the issue that asked for it is in the history"
    cited_by_tests = {
        rule
        for path in (ROOT / "tests").rglob("*.py")
        if path.resolve() != Path(__file__).resolve()
        for rule in RULE_ID.findall(path.read_text())
    }
    cited_in_code = {rule for path in sources() for _, text in explanations(path) for rule in RULE_ID.findall(text)}
    assert sorted(cited_in_code - cited_by_tests) == [], "a rule id in a comment names a rule a test proves"


def test_every_module_opens_with_one_or_two_sentences_saying_what_it_is_for() -> None:
    assert long_openings() == [], (
        f"a module docstring opens with at most {OPENING_SENTENCES} sentences and {OPENING_CHARS} characters; "
        "detail goes in a later paragraph, a comment where it matters, or the docs"
    )
