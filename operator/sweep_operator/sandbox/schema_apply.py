"""Field ownership (metadata.managedFields) and server-side apply, simplified: lists are atomic, no "." markers.

Models k8s.io/apiserver/pkg/endpoints/handlers/fieldmanager and sigs.k8s.io/structured-merge-diff merge.Updater.
"""

from __future__ import annotations

import copy
import datetime
import json
from collections.abc import Iterable
from typing import Any

Obj = dict[str, Any]
Path = tuple[str, ...]
_MISSING = object()


class ApplyConflict(Exception):
    """A 409 Conflict: an applied field another manager owns with another value (internal/conflict.go)."""

    def __init__(self, conflicts: list[tuple[Path, Obj]]) -> None:
        self.conflicts = conflicts
        super().__init__(self.message())

    def message(self) -> str:
        """fieldmanager/internal/conflict.go getConflictMessage."""
        if len(self.conflicts) == 1:
            path, entry = self.conflicts[0]
            return f"Apply failed with 1 conflict: conflict with {print_manager(entry)}: {path_text(path)}"
        by_manager: dict[str, list[Path]] = {}
        for path, entry in self.conflicts:
            by_manager.setdefault(print_manager(entry), []).append(path)
        lines = []
        for manager in sorted(by_manager):
            lines.append(f"conflicts with {manager}:")
            lines.extend(f"- {path_text(p)}" for p in by_manager[manager])
        return f"Apply failed with {len(self.conflicts)} conflicts: " + "\n".join(lines)

    def status(self) -> Obj:
        causes = [{"reason": "FieldManagerConflict", "message": f"conflict with {print_manager(e)}",
                   "field": path_text(p)} for p, e in self.conflicts]
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": self.message(),
                "reason": "Conflict", "details": {"causes": causes}, "code": 409}


def print_manager(entry: Obj) -> str:
    """conflict.go printManager: `"kubectl"` for an applier, `"x" using v1` (with its subresource) for an updater."""
    text = json.dumps(entry["manager"])
    if entry.get("operation") == "Apply":
        return text
    if entry.get("subresource"):
        text = f"{text} with subresource {json.dumps(entry['subresource'])}"
    return f"{text} using {entry.get('apiVersion', '')}"


def path_text(path: Path) -> str:
    """fieldpath.Path.String(): `.spec.tune.numSamples`."""
    return "".join(f".{p}" for p in path)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- field sets


def leaf_paths(obj: Any, prefix: Path = ()) -> set[Path]:
    """Every owned leaf: scalars, lists (atomic here) and empty maps."""
    if isinstance(obj, dict) and obj:
        result: set[Path] = set()
        for key, value in obj.items():
            result |= leaf_paths(value, (*prefix, str(key)))
        return result
    return {prefix} if prefix else set()


def scoped_paths(obj: Obj, subresource: str | None) -> set[Path]:
    """The fields a write to the object (or its /status) can own: spec and the like, labels and annotations."""
    if subresource == "status":
        return leaf_paths(obj.get("status"), ("status",)) if "status" in obj else set()
    result: set[Path] = set()
    for key, value in obj.items():
        if key in ("apiVersion", "kind", "status"):
            continue
        if key == "metadata":
            for meta_key in ("labels", "annotations"):
                if isinstance(value, dict) and value.get(meta_key):
                    result |= leaf_paths(value[meta_key], ("metadata", meta_key))
            if isinstance(value, dict) and value.get("finalizers"):
                result.add(("metadata", "finalizers"))
            continue
        result |= leaf_paths(value, (key,))
    return result


def get_path(obj: Any, path: Path) -> Any:
    current = obj
    for key in path:
        if not isinstance(current, dict) or key not in current:
            return _MISSING
        current = current[key]
    return current


def set_path(obj: Obj, path: Path, value: Any) -> None:
    current = obj
    for key in path[:-1]:
        if not isinstance(current.get(key), dict):
            current[key] = {}
        current = current[key]
    current[path[-1]] = copy.deepcopy(value)


def remove_path(obj: Obj, path: Path) -> None:
    """Drop a field, and the maps it leaves empty."""
    parents = []
    current: Any = obj
    for key in path[:-1]:
        if not isinstance(current, dict) or key not in current:
            return
        parents.append((current, key))
        current = current[key]
    if isinstance(current, dict):
        current.pop(path[-1], None)
    for parent, key in reversed(parents):
        if isinstance(parent[key], dict) and not parent[key] and key not in ("spec", "metadata"):
            del parent[key]
        else:
            break


def fields_v1(paths: Iterable[Path]) -> Obj:
    """managedFields[].fieldsV1: {"f:spec": {"f:image": {}}}."""
    tree: Obj = {}
    for path in sorted(paths):
        node = tree
        for key in path:
            node = node.setdefault(f"f:{key}", {})
    return tree


def parse_fields_v1(tree: Obj, prefix: Path = ()) -> set[Path]:
    result: set[Path] = set()
    children = {k: v for k, v in tree.items() if k.startswith("f:")}
    if not children:
        return {prefix} if prefix else set()
    for key, value in children.items():
        result |= parse_fields_v1(value if isinstance(value, dict) else {}, (*prefix, key[2:]))
    return result


def _entries(obj: Obj) -> list[Obj]:
    return list((obj.get("metadata") or {}).get("managedFields") or [])


def _write_entries(obj: Obj, entries: list[Obj]) -> None:
    kept = [e for e in entries if e.get("fieldsV1")]
    meta = obj.setdefault("metadata", {})
    if kept:
        meta["managedFields"] = kept
    else:
        meta.pop("managedFields", None)


def _overlaps(a: Path, b: Path) -> bool:
    shorter = min(len(a), len(b))
    return a[:shorter] == b[:shorter]


# ---- updates and applies


def record(new: Obj, old: Obj | None, manager: str, api_version: str, subresource: str | None = None) -> None:
    """An Update operation: `manager` takes the fields it changed from everyone (fieldmanager's update path)."""
    now_paths = scoped_paths(new, subresource)
    if old is None:
        changed = now_paths
    else:
        changed = {p for p in now_paths if get_path(old, p) != get_path(new, p)}
    entries = []
    for entry in _entries(old if old is not None else new):
        owned = parse_fields_v1(entry.get("fieldsV1") or {})
        entry_scope_status = entry.get("subresource") == "status"
        if entry_scope_status == (subresource == "status"):
            owned = {p for p in owned if p not in changed and get_path(new, p) is not _MISSING}
        entries.append({**entry, "fieldsV1": fields_v1(owned)})
    if changed:
        mine = next((e for e in entries if e["manager"] == manager and e.get("operation") == "Update"
                     and e.get("subresource") == subresource), None)
        if mine is None:
            mine = {"manager": manager, "operation": "Update", "apiVersion": api_version, "time": _now(),
                    "fieldsType": "FieldsV1", "fieldsV1": {}}
            if subresource:
                mine["subresource"] = subresource
            entries.append(mine)
        mine["fieldsV1"] = fields_v1(parse_fields_v1(mine["fieldsV1"]) | changed)
        mine["time"] = _now()
    _write_entries(new, entries)


def apply(
    old: Obj, applied: Obj, manager: str, api_version: str, force: bool, subresource: str | None,
    strip_defaults: Any = None,
) -> Obj:
    """Merge an applied configuration into `old` by ownership; raises ApplyConflict unless `force`.

    The applier owns exactly the fields it sent; fields it owned before and no longer sends are removed unless
    another manager owns them too; a field another manager owns with another value is a conflict.
    """
    mine_paths = scoped_paths(applied, subresource)
    entries = _entries(old)
    conflicts: list[tuple[Path, Obj]] = []
    for entry in entries:
        if entry["manager"] == manager and entry.get("operation") == "Apply":
            continue
        owned = parse_fields_v1(entry.get("fieldsV1") or {})
        for path in sorted(mine_paths):
            for theirs in owned:
                if _overlaps(path, theirs) and get_path(old, path) != get_path(applied, path):
                    conflicts.append((path, entry))
                    break
    if conflicts and not force:
        raise ApplyConflict(conflicts)
    previous: set[Path] = set()
    for entry in entries:
        if entry["manager"] == manager and entry.get("operation") == "Apply" and \
                entry.get("subresource") == subresource:
            previous = parse_fields_v1(entry.get("fieldsV1") or {})
    others_own: set[Path] = set()
    new_entries = []
    for entry in entries:
        if entry["manager"] == manager and entry.get("operation") == "Apply" and \
                entry.get("subresource") == subresource:
            continue
        owned = parse_fields_v1(entry.get("fieldsV1") or {})
        if force:
            owned = {p for p in owned if not any(_overlaps(p, m) for m in mine_paths)}
        else:  # equal values are shared; a differing one was a conflict
            owned = {p for p in owned if not any(_overlaps(p, m) and get_path(applied, p) != get_path(old, p)
                                                 for m in mine_paths)}
        others_own |= owned
        new_entries.append({**entry, "fieldsV1": fields_v1(owned)})
    result = copy.deepcopy(old)
    for path in previous - mine_paths:
        if path not in others_own:
            remove_path(result, path)
    for path in mine_paths:
        set_path(result, path, get_path(applied, path))
    entry = {"manager": manager, "operation": "Apply", "apiVersion": api_version, "time": _now(),
             "fieldsType": "FieldsV1", "fieldsV1": fields_v1(mine_paths)}
    if subresource:
        entry["subresource"] = subresource
    new_entries.append(entry)
    _write_entries(result, new_entries)
    if strip_defaults is not None:
        strip_defaults.apply_defaults(result)
    return result
