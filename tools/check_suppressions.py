"""Every `# noqa` and `# type: ignore` names its codes and says why (issue 14): `# type: ignore[x]  # why`.

Run by `make lint` over the files given (default: the repository's Python files that ruff checks).
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

NOQA = re.compile(r"#\s*noqa\b(?P<codes>:\s*[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*)?(?P<rest>.*)", re.IGNORECASE)
TYPE_IGNORE = re.compile(r"#\s*type:\s*ignore\b(?P<codes>\[[^\]]*\])?(?P<rest>.*)")
REASON = re.compile(r"[A-Za-z]{2,}")


def findings(path: Path) -> list[str]:
    found = []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline))
    except (tokenize.TokenError, SyntaxError, UnicodeDecodeError) as exc:
        return [f"{path}: cannot be read as Python: {exc}"]
    for token in tokens:
        if token.type != tokenize.COMMENT:
            continue
        for kind, pattern in (("noqa", NOQA), ("type: ignore", TYPE_IGNORE)):
            match = pattern.search(token.string)
            if match is None:
                continue
            where = f"{path}:{token.start[0]}"
            if not match.group("codes"):
                found.append(f"{where}: `{kind}` without codes: name the rule(s) it silences")
            elif not REASON.search(match.group("rest")):
                found.append(f"{where}: `{kind}{match.group('codes')}` without a reason: add `  # why`")
    return found


def python_files() -> list[Path]:
    # ruff's own file discovery, so the excludes of ruff.toml apply here too.
    listed = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--show-files", "."], capture_output=True, text=True, check=True
    ).stdout
    here = Path.cwd()
    return [Path(line).relative_to(here) for line in listed.splitlines() if line.endswith(".py")]


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or python_files()
    problems = [line for path in paths for line in findings(path)]
    for line in problems:
        print(line)
    if problems:
        print(f"{len(problems)} suppression(s) without codes or a reason", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
