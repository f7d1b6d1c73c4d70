"""An in-memory stand-in for `sweep_operator.kube.KubeApi`, for controller unit tests (no sockets)."""

from __future__ import annotations

import copy
import itertools
from typing import Any

from sweep_contracts import constants
from sweep_operator.kube import Conflict
from tests.support.schemas import errors, ledger_validator, sweep_status_validator

# A real API server prunes status fields its CRD schema lacks, silently: here each status write is checked against
# the CRD's status schema made strict, so a field the operator writes but the schema lacks fails the test.
_STATUS = sweep_status_validator()

_uids = itertools.count(1)


def merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """JSON merge patch (RFC 7386)."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
    return target


def _matches(obj: dict[str, Any], selector: str) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in filter(None, selector.split(",")):
        key, has_value, value = term.partition("=")
        if (labels.get(key) != value) if has_value else (key not in labels):
            return False
    return True


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.pods: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.calls: list[tuple[str, ...]] = []
        self.rv = 0

    # helpers for tests
    def add(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        meta.setdefault("uid", f"uid-{next(_uids)}")
        meta.setdefault("generation", 1)
        meta.setdefault("creationTimestamp", "2026-12-02T12:00:00Z")
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        self.objects[(kind, meta["namespace"], meta["name"])] = obj
        return copy.deepcopy(obj)

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self.objects.get((kind, namespace, name))
        return copy.deepcopy(obj) if obj else None

    def of_kind(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(o)
            for (k, ns, _), o in sorted(self.objects.items())
            if k == kind and (namespace is None or ns == namespace)
        ]

    # KubeApi surface
    def get_sweep(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get("TrainingSweep", namespace, name)

    def list_sweeps(self, namespace: str) -> list[dict[str, Any]]:
        return self.of_kind("TrainingSweep", namespace)

    def patch_sweep_status(
        self, namespace: str, name: str, status: dict[str, Any], *, resource_version: str | None = None
    ) -> dict[str, Any] | None:
        self.calls.append(("patch_sweep_status", name))
        obj = self.objects.get(("TrainingSweep", namespace, name))
        if obj is None:
            return None
        current = obj["metadata"].get("resourceVersion")
        if resource_version is not None and current is not None and resource_version != current:
            raise Conflict(f"TrainingSweep {namespace}/{name}: resourceVersion {resource_version} != {current}")
        merged = merge(copy.deepcopy(obj.get("status") or {}), status)
        problems = [f"status.{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in _STATUS.iter_errors(merged)]
        if problems:
            raise AssertionError(f"status patch of TrainingSweep {name} does not fit the CRD schema: {problems}")
        obj["status"] = merged
        self._bump(obj)
        return copy.deepcopy(obj)

    def _bump(self, obj: dict[str, Any]) -> None:
        """A new resourceVersion, as the API server gives every write."""
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)

    def get_ledger(self, namespace: str) -> dict[str, Any] | None:
        return self.get(constants.LEDGER_KIND, namespace, constants.LEDGER_NAME)

    def write_ledger(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create, or replace at the resourceVersion the body carries (Conflict otherwise), as the API server."""
        self.calls.append(("write_ledger", body["metadata"]["namespace"]))
        current = self.objects.get((constants.LEDGER_KIND, body["metadata"]["namespace"], constants.LEDGER_NAME))
        wanted = body["metadata"].get("resourceVersion")
        if (current is None) != (wanted is None) or (current and current["metadata"]["resourceVersion"] != wanted):
            raise Conflict(f"GPUHourLedger: resourceVersion {wanted} is not the current one")
        problems = errors(ledger_validator(), body)
        if problems:  # the API server's 422 (a list past its maxItems, a field the schema lacks)
            raise AssertionError(f"GPUHourLedger write does not fit the CRD schema: {[p[:300] for p in problems[:3]]}")
        obj = copy.deepcopy(body)
        obj["metadata"]["uid"] = current["metadata"]["uid"] if current else f"uid-{next(_uids)}"
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[(constants.LEDGER_KIND, obj["metadata"]["namespace"], constants.LEDGER_NAME)] = obj
        return copy.deepcopy(obj)

    def get_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get("ConfigMap", namespace, name)

    def write_config_map(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create, or replace at the resourceVersion the body carries (Conflict otherwise), as the API server."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        self.calls.append(("write_config_map", f"{namespace}/{name}"))
        current = self.objects.get(("ConfigMap", namespace, name))
        wanted = body["metadata"].get("resourceVersion")
        if (current is None) != (wanted is None) or (current and current["metadata"]["resourceVersion"] != wanted):
            raise Conflict(f"ConfigMap {namespace}/{name}: resourceVersion {wanted} is not the current one")
        problems = [f"data.{k}" for k, v in (body.get("data") or {}).items() if not isinstance(v, str)]
        if problems:
            raise AssertionError(f"ConfigMap data values must be strings: {problems}")
        obj = copy.deepcopy(body)
        obj["metadata"]["uid"] = current["metadata"]["uid"] if current else f"uid-{next(_uids)}"
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[("ConfigMap", namespace, name)] = obj
        return copy.deepcopy(obj)

    def namespace_uid(self, name: str) -> str | None:
        namespace = self.objects.get(("Namespace", "", name))
        return str(namespace["metadata"]["uid"]) if namespace else None

    def delete_ledger(self, namespace: str) -> None:
        """What the ledger policy refuses (a test's stand-in for a deletion that got past it)."""
        del self.objects[(constants.LEDGER_KIND, namespace, constants.LEDGER_NAME)]

    def get_rayjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get("RayJob", namespace, name)

    def list_rayjobs(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        self.calls.append(("list_rayjobs", label_selector))
        return [o for o in self.of_kind("RayJob", namespace) if _matches(o, label_selector)]

    def create_rayjob(self, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        self.calls.append(("create_rayjob", body["metadata"]["name"]))
        existing = self.get("RayJob", body["metadata"]["namespace"], body["metadata"]["name"])
        if existing:
            return existing, False
        return self.add("RayJob", body), True

    def patch_rayjob(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any] | None:
        self.calls.append(("patch_rayjob", name))
        obj = self.objects.get(("RayJob", namespace, name))
        return copy.deepcopy(merge(obj, patch)) if obj else None

    def delete_rayjob(self, namespace: str, name: str) -> bool:
        self.calls.append(("delete_rayjob", name))
        return self._delete("RayJob", namespace, name)

    def get_raycluster(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get("RayCluster", namespace, name)

    def get_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get("Service", namespace, name)

    def list_rayclusters(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return [o for o in self.of_kind("RayCluster", namespace) if _matches(o, label_selector)]

    def patch_raycluster(
        self, namespace: str, name: str, patch: dict[str, Any], *, retry_conflict: bool = True
    ) -> dict[str, Any] | None:
        self.calls.append(("patch_raycluster", name))
        obj = self.objects.get(("RayCluster", namespace, name))
        return copy.deepcopy(merge(obj, patch)) if obj else None

    def ensure_finalizer(self, obj: dict[str, Any], finalizer: str = constants.FINALIZER) -> bool:
        kind = obj.get("kind", "TrainingSweep")
        stored = self.objects.get((kind, obj["metadata"]["namespace"], obj["metadata"]["name"]))
        if stored is None or stored["metadata"].get("deletionTimestamp"):
            return bool(stored and finalizer in stored["metadata"].get("finalizers", []))
        finalizers = stored["metadata"].setdefault("finalizers", [])
        if finalizer not in finalizers:
            finalizers.append(finalizer)
            self._bump(stored)
            self.calls.append(("ensure_finalizer", obj["metadata"]["name"]))
        return True

    def add_finalizer(self, obj: dict[str, Any], finalizer: str = constants.FINALIZER) -> dict[str, Any] | None:
        if not self.ensure_finalizer(obj, finalizer):
            return None
        return self.get(obj.get("kind", "TrainingSweep"), obj["metadata"]["namespace"], obj["metadata"]["name"])

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        self.calls.append(("list_pods", namespace, label_selector))
        return [
            copy.deepcopy(p)
            for p in self.pods
            if (p.get("metadata") or {}).get("namespace", namespace) == namespace and _matches(p, label_selector)
        ]

    def list_events(self, namespace: str) -> list[dict[str, Any]]:
        return copy.deepcopy(self.events)

    def _delete(self, kind: str, namespace: str, name: str) -> bool:
        obj = self.objects.get((kind, namespace, name))
        if obj is None:
            return False
        if obj["metadata"].get("finalizers"):
            obj["metadata"]["deletionTimestamp"] = "2026-12-02T12:30:00Z"
        else:
            del self.objects[(kind, namespace, name)]
        return True

    def set_rayjob_status(self, name: str, namespace: str = "default", **status: Any) -> None:
        obj = self.objects[("RayJob", namespace, name)]
        merge(obj.setdefault("status", {}), status)
        self._bump(obj)

    def rayjob_names(self) -> list[str]:
        return [o["metadata"]["name"] for o in self.of_kind("RayJob")]

    def label_of(self, obj: dict[str, Any], key: str = constants.LABEL_RUN_ID) -> str:
        return obj["metadata"]["labels"][key]
