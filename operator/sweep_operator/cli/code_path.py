"""Where a sweep's own train loop is found on this machine (`run-local --code`, `sandbox --code`), decided before
Ray starts: the directories searched for spec.trainLoop's module, without importing it."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .common import UsageError

INSTALLED = "this Python's installed packages and PYTHONPATH"


@dataclass(frozen=True)
class CodeDirs:
    """Directories to put on PYTHONPATH ahead of the default ones, and a line saying why (None: nothing to say)."""

    dirs: tuple[Path, ...] = ()
    note: str | None = None


def code_dir(value: str | None, option: str = "--code") -> Path | None:
    """`--code DIR` as an absolute directory; UsageError naming the option when it is not one."""
    if value is None:
        return None
    path = Path(value).expanduser().resolve()
    if not path.is_dir():
        raise UsageError(f"{option} {value}: not a directory (the directory that holds your train loop's package)")
    return path


def module_location(module: str, dirs: Sequence[Path] | None = None) -> str | None:
    """Where `module` (dotted) would be imported from, searching `dirs` only (None: this Python's own path, installed
    packages included); None when it is not there. Nothing is imported: each package level is looked up on disk."""
    parts = module.split(".")
    if not all(part.isidentifier() for part in parts):
        return None
    if dirs is None:
        importlib.invalidate_caches()
        try:
            spec = importlib.util.find_spec(parts[0])  # a top-level name: its lookup imports nothing
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        origin = spec.origin if spec.has_location else None
        locations = list(spec.submodule_search_locations or [])
    else:
        origin, locations = _lookup(parts[0], [str(d) for d in dirs])
    for part in parts[1:]:
        if not locations:
            return None  # a plain module, or nothing: no submodules under it
        origin, locations = _lookup(part, locations)
    return origin or next(iter(locations), None)


def _lookup(name: str, dirs: Sequence[str]) -> tuple[str | None, list[str]]:
    """`name` in `dirs` as Python's path finder looks: the first directory holding a package (`name/__init__.py`)
    or a module (`name.py`) wins, giving (its file, the package's directory); else every `name/` directory is a part
    of one namespace package, (None, those directories)."""
    suffixes = importlib.machinery.all_suffixes()
    namespace = []
    for folder in map(Path, dirs):
        package = folder / name
        init = next((package / f"__init__{s}" for s in suffixes if (package / f"__init__{s}").is_file()), None)
        if init is not None:
            return str(init), [str(package)]
        plain = next((folder / f"{name}{s}" for s in suffixes if (folder / f"{name}{s}").is_file()), None)
        if plain is not None:
            return str(plain), []
        if package.is_dir():
            namespace.append(str(package))
    return None, namespace


def train_loop_dirs(train_loop: str, *, first: Path | None, first_label: str, manifest: str | None) -> CodeDirs:
    """The directories that make spec.trainLoop's module importable: none beyond the default when it is in `first`
    (the `--code` directory, else the caller's default) or already on this Python's path; else the manifest's own
    directory when it is there. UsageError naming spec.trainLoop and every place searched when it is nowhere."""
    module = train_loop.partition(":")[0]
    searched: list[str] = []
    if first is not None:
        if module_location(module, [first]):
            return CodeDirs()
        searched.append(f"{first} ({first_label})")
    if module_location(module):
        return CodeDirs()
    searched.append(INSTALLED)
    if manifest and manifest != "-":
        beside = Path(manifest).expanduser().resolve().parent
        if beside != first:
            if module_location(module, [beside]):
                note = f"spec.trainLoop's module {module} found in {beside} (the manifest's directory): on PYTHONPATH"
                return CodeDirs((beside,), note)
            searched.append(f"{beside} (the manifest's directory)")
    raise UsageError(
        f"spec.trainLoop: {train_loop}: module {module} is not importable from {'; '.join(searched)}. "
        "Name the directory that holds its package with --code DIR"
    )
