"""The emulator's garbage collector and namespace controller: dependents of deleted owners, foreground deletions
and terminating namespaces, as kube-controller-manager's controllers handle them through the API server."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from .emulator_store import (
    FOREGROUND_FINALIZER,
    GARBAGE_COLLECTOR,
    NAMESPACE_CONTROLLER,
    ObjectStore,
    _namespace_terminating,
)
from .emulator_tables import ResourceType

if TYPE_CHECKING:
    from .emulator import KubernetesApiEmulator

Obj = dict[str, Any]


class GarbageCollector:
    """Works through the store's queue (GcQueue) after commits; deletes and updates go through the emulator's writes,
    so admission and the change log see them as the real controllers' requests."""

    def __init__(self, api: KubernetesApiEmulator, store: ObjectStore) -> None:
        self.api = api
        self.store = store

    def dependents(self, owner_uid: str) -> list[tuple[ResourceType, Obj]]:
        found = (self.store.live_object(key) for key in sorted(self.store.dependents_of.get(owner_uid, ()), key=str))
        return [live for live in found if live is not None]

    def orphan_dependents(self, owner_uid: str) -> None:
        for resource_type, dependent in self.dependents(owner_uid):
            refs = [r for r in dependent["metadata"]["ownerReferences"] if r.get("uid") != owner_uid]
            meta = {**dependent["metadata"], "ownerReferences": refs}
            if not refs:
                del meta["ownerReferences"]
            self.api.writes.replace_object(resource_type, dependent, {**dependent, "metadata": meta})

    def collect(self, full: bool = False) -> int:
        """One pass of the garbage collector (background cascade); returns how many objects it changed.

        A dependent whose owners (by uid) are all gone is deleted, respecting its finalizers; dangling references
        next to a live owner are dropped. Foreground deletions wait for their dependents; a terminating Namespace
        deletes its contents, then itself. Only what changes queued is looked at, unless `full`.
        """
        store, pending = self.store, self.store.pending
        candidates, pending.candidates = pending.candidates, set()
        owners, pending.owners = pending.owners, set()
        if full:
            candidates = {k for keys in store.dependents_of.values() for k in keys}
            owners = set(store.uids)
        changed = 0
        for key in sorted(candidates, key=str):
            live = store.live_object(key)
            if live is not None:
                changed += self._collect_dependent(*live)
        for uid in owners:
            live = store.live_object(store.uids[uid]) if uid in store.uids else None
            if live is not None:
                changed += self._finish_foreground(*live)
        for namespace in sorted(pending.terminating):
            changed += self._drain_namespace(namespace)
        return changed

    def _collect_dependent(self, resource_type: ResourceType, obj: Obj) -> int:
        meta = obj["metadata"]
        refs = meta.get("ownerReferences") or []
        if not refs or meta.get("deletionTimestamp"):
            return 0
        uids = self.store.uids
        dangling = [r for r in refs if r.get("uid") not in uids]
        if len(dangling) == len(refs) or any(self._owner_deleting_in_foreground(r.get("uid", "")) for r in refs):
            if not self.api.admission_chain.controller_may_delete(resource_type, obj, GARBAGE_COLLECTOR):
                return 0
            self.api.writes.delete_object(resource_type, meta.get("namespace"), meta["name"])
            return 1
        if dangling:
            kept = [r for r in refs if r.get("uid") in uids]
            self.api.writes.replace_object(resource_type, obj, {**obj, "metadata": {**meta, "ownerReferences": kept}})
            return 1
        return 0

    def _finish_foreground(self, resource_type: ResourceType, obj: Obj) -> int:
        meta = obj["metadata"]
        if not meta.get("deletionTimestamp") or FOREGROUND_FINALIZER not in meta.get("finalizers", []):
            return 0
        if self.dependents(meta["uid"]):
            return 0
        remaining = [f for f in meta["finalizers"] if f != FOREGROUND_FINALIZER]
        self.api.writes.replace_object(resource_type, obj, {**obj, "metadata": {**meta, "finalizers": remaining}})
        return 1

    def _owner_deleting_in_foreground(self, uid: str) -> bool:
        store = self.store
        live = store.live_object(store.uids[uid]) if uid in store.uids else None
        if live is None:
            return False
        meta = live[1]["metadata"]
        return bool(meta.get("deletionTimestamp")) and FOREGROUND_FINALIZER in meta.get("finalizers", [])

    def _drain_namespace(self, namespace: str) -> int:
        store, terminating = self.store, self.store.pending.terminating
        ns_type = store.type_for("", "v1", "namespaces")
        ns_obj = store.current(ns_type, None, namespace)
        if ns_obj is None or not _namespace_terminating(ns_obj):
            terminating.discard(namespace)
            return 0
        contents = [
            live
            for keys in store.live_keys.values()
            for key in keys
            if key[1] == namespace and (live := store.live_object(key)) is not None
        ]
        if not contents:
            terminating.discard(namespace)
            store.commit(ns_type, None, None, ns_obj)
            return 1
        may_delete = self.api.admission_chain.controller_may_delete
        deleting = [
            (t, o)
            for t, o in contents
            if not o["metadata"].get("deletionTimestamp") and may_delete(t, o, NAMESPACE_CONTROLLER)
        ]
        for resource_type, obj in deleting:
            self.api.writes.delete_object(resource_type, namespace, obj["metadata"]["name"])
        # objects held by finalizers or refused by a policy keep the namespace Terminating, without spinning
        return len(deleting)

    async def run_forever(self) -> None:
        wakeup = self.store.pending.wakeup
        assert wakeup is not None
        while True:
            await wakeup.wait()
            wakeup.clear()
            while self.collect():
                await asyncio.sleep(0)  # let requests in between cascade steps, as the real collector does
