"""Field ownership (metadata.managedFields) and server-side apply, simplified: lists are atomic, no "." markers.

Models k8s.io/apiserver/pkg/endpoints/handlers/fieldmanager and sigs.k8s.io/structured-merge-diff merge.Updater.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from typing import Any

from sweep_contracts.timestamps import rfc3339

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
        causes = [
            {"reason": "FieldManagerConflict", "message": f"conflict with {print_manager(e)}", "field": path_text(p)}
            for p, e in self.conflicts
        ]
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message(),
            "reason": "Conflict",
            "details": {"causes": causes},
            "code": 409,
        }


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
    return rfc3339()


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


def _tree_of(value: Any) -> Obj:
    """fieldsV1 of a whole value (a create): the object's shape, maps as f: keys, everything else a leaf."""
    if isinstance(value, dict) and value:
        return {f"f:{k}": _tree_of(v) for k, v in value.items()}
    return {}


def _scoped_tree(obj: Obj, subresource: str | None) -> Obj:
    if subresource == "status":
        return {"f:status": _tree_of(obj["status"])} if "status" in obj else {}
    tree: Obj = {}
    for key, value in obj.items():
        if key in ("apiVersion", "kind", "status"):
            continue
        if key == "metadata":
            meta: Obj = {}
            for meta_key in ("labels", "annotations"):
                if isinstance(value, dict) and value.get(meta_key):
                    meta[f"f:{meta_key}"] = _tree_of(value[meta_key])
            if isinstance(value, dict) and value.get("finalizers"):
                meta["f:finalizers"] = {}
            if meta:
                tree["f:metadata"] = meta
            continue
        tree[f"f:{key}"] = _tree_of(value)
    return tree


def _diff(old: Any, new: Any, prefix: Path, changed: set[Path], gone: set[Path]) -> None:
    """Leaves set or changed (`changed`) and leaves removed (`gone`) between two values, equal subtrees skipped."""
    if old is new or (type(old) is type(new) and old == new):
        return
    if isinstance(old, dict) and isinstance(new, dict) and old and new:
        for key, value in new.items():
            if key in old:
                _diff(old[key], value, (*prefix, key), changed, gone)
            else:
                changed |= leaf_paths(value, (*prefix, key))
        for key in old.keys() - new.keys():
            gone |= leaf_paths(old[key], (*prefix, key))
        return
    if new is _MISSING:
        gone |= leaf_paths(old, prefix) if old is not _MISSING else set()
        return
    if isinstance(old, dict) and old:
        gone |= leaf_paths(old, prefix)
    changed |= leaf_paths(new, prefix) or {prefix}


def _scoped_diff(old: Obj, new: Obj, subresource: str | None) -> tuple[set[Path], set[Path]]:
    changed: set[Path] = set()
    gone: set[Path] = set()
    if subresource == "status":
        _diff(old.get("status", _MISSING), new.get("status", _MISSING), ("status",), changed, gone)
        return changed, gone
    for key in (new.keys() | old.keys()) - {"apiVersion", "kind", "status", "metadata"}:
        _diff(old.get(key, _MISSING), new.get(key, _MISSING), (key,), changed, gone)
    old_meta, new_meta = old.get("metadata") or {}, new.get("metadata") or {}
    for meta_key in ("labels", "annotations"):
        _diff(
            old_meta.get(meta_key) or _MISSING,
            new_meta.get(meta_key) or _MISSING,
            ("metadata", meta_key),
            changed,
            gone,
        )
    old_finalizers, new_finalizers = old_meta.get("finalizers") or [], new_meta.get("finalizers") or []
    if old_finalizers != new_finalizers:
        (changed if new_finalizers else gone).add(("metadata", "finalizers"))
    return changed, gone


def _trie(paths: Iterable[Path]) -> Obj:
    trie: Obj = {}
    for path in paths:
        node = trie
        for key in path:
            node = node.setdefault(key, {})
        node[None] = True
    return trie


def _tree_without(tree: Obj, trie: Obj) -> Obj:
    """A fieldsV1 tree less the paths of `trie` (a removed path takes what is below it)."""
    result: Obj = {}
    for key, sub in tree.items():
        branch = trie.get(key[2:]) if key.startswith("f:") else None
        if branch is None:
            result[key] = sub
        elif None in branch:
            continue
        elif not sub:
            result[key] = sub  # an atomic leaf owned whole: a deeper change is no change of it
        else:
            kept = _tree_without(sub, branch)
            if kept:
                result[key] = kept
    return result


def _tree_with(tree: Obj, paths: Iterable[Path]) -> Obj:
    result = json.loads(json.dumps(tree))
    for path in paths:
        node = result
        for key in path:
            node = node.setdefault(f"f:{key}", {})
    return result


def record(new: Obj, old: Obj | None, manager: str, api_version: str, subresource: str | None = None) -> None:
    """An Update operation: `manager` takes the fields it changed from everyone (fieldmanager's update path).

    Works on the fieldsV1 trees along the changed paths only: a status write to a RayJob does not re-read the
    ownership of its pod templates.
    """
    status_scope = subresource == "status"
    if old is None:
        mine_tree = _scoped_tree(new, subresource)
        entries: list[Obj] = []
        if mine_tree:
            entries.append(_entry(manager, api_version, subresource, mine_tree))
        _write_entries(new, entries)
        return
    changed, gone = _scoped_diff(old, new, subresource)
    entries = _entries(old)
    if not changed and not gone:
        _write_entries(new, entries)
        return
    trie = _trie(changed | gone)
    updated = []
    mine = None
    for entry in entries:
        if (entry.get("subresource") == "status") != status_scope:
            updated.append(entry)
            continue
        entry = {**entry, "fieldsV1": _tree_without(entry.get("fieldsV1") or {}, trie)}
        if entry["manager"] == manager and entry.get("operation") == "Update":
            mine = entry
        updated.append(entry)
    if changed:
        if mine is None:
            mine = _entry(manager, api_version, subresource, {})
            updated.append(mine)
        mine["fieldsV1"] = _tree_with(mine["fieldsV1"], changed)
        mine["time"] = _now()
    _write_entries(new, updated)


def _entry(manager: str, api_version: str, subresource: str | None, tree: Obj) -> Obj:
    entry = {
        "manager": manager,
        "operation": "Update",
        "apiVersion": api_version,
        "time": _now(),
        "fieldsType": "FieldsV1",
        "fieldsV1": tree,
    }
    if subresource:
        entry["subresource"] = subresource
    return entry


def apply(
    old: Obj,
    applied: Obj,
    manager: str,
    api_version: str,
    force: bool,
    subresource: str | None,
    defaults: Any = None,
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
        if (
            entry["manager"] == manager
            and entry.get("operation") == "Apply"
            and entry.get("subresource") == subresource
        ):
            previous = parse_fields_v1(entry.get("fieldsV1") or {})
    others_own: set[Path] = set()
    new_entries = []
    for entry in entries:
        if (
            entry["manager"] == manager
            and entry.get("operation") == "Apply"
            and entry.get("subresource") == subresource
        ):
            continue
        owned = parse_fields_v1(entry.get("fieldsV1") or {})
        if force:
            owned = {p for p in owned if not any(_overlaps(p, m) for m in mine_paths)}
        else:  # equal values are shared; a differing one was a conflict
            owned = {
                p
                for p in owned
                if not any(_overlaps(p, m) and get_path(applied, p) != get_path(old, p) for m in mine_paths)
            }
        others_own |= owned
        new_entries.append({**entry, "fieldsV1": fields_v1(owned)})
    result = copy.deepcopy(old)
    for path in previous - mine_paths:
        if path not in others_own:
            remove_path(result, path)
    for path in mine_paths:
        set_path(result, path, get_path(applied, path))
    entry = {
        "manager": manager,
        "operation": "Apply",
        "apiVersion": api_version,
        "time": _now(),
        "fieldsType": "FieldsV1",
        "fieldsV1": fields_v1(mine_paths),
    }
    if subresource:
        entry["subresource"] = subresource
    new_entries.append(entry)
    _write_entries(result, new_entries)
    if defaults is not None:  # the merged object is defaulted, the applier's field set is what it sent
        defaults.apply_defaults(result)
    return result
