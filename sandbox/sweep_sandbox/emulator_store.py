"""The emulator's storage: the change log behind resourceVersions and watches, and the object store that
KubernetesApiEmulator holds (reads, lists, the watch stream, committed writes and their indexes)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp.web
import kmock

from .emulator_tables import (
    ApiError,
    ResourceType,
    parse_field_selector,
    parse_label_selector,
    render_table,
    resource_key,
)
from .kube_values import JOB_CONTROLLER_UID_LABELS, JOB_NAME_LABELS, now_rfc3339, random_suffix

if TYPE_CHECKING:
    from .emulator import KubernetesApiEmulator
    from .emulator_routes import RequestTarget

Obj = dict[str, Any]
ObjectKey = tuple[kmock.resource, str | None, str]  # (resource, namespace, name), as kmock's ObjectsArray keys


FOREGROUND_FINALIZER = "foregroundDeletion"
NAMESPACE_FINALIZER = "kubernetes"
# kube-controller-manager's controllers delete through the API server under their own service accounts
# (--use-service-account-credentials), so admission sees them by these names.
NAMESPACE_CONTROLLER = "system:serviceaccount:kube-system:namespace-controller"
GARBAGE_COLLECTOR = "system:serviceaccount:kube-system:generic-garbage-collector"


# --------------------------------------------------------------------------------------------------------------------
# The change log behind resourceVersions and watches


@dataclass(frozen=True)
class Change:
    """One committed mutation; its resourceVersion is `rv`. `old` is the state before it (None on creation)."""

    rv: int
    resource: kmock.resource
    namespace: str | None
    type: str  # ADDED, MODIFIED, DELETED
    obj: Obj
    old: Obj | None


class ResourceVersionExpired(Exception):
    """The requested resourceVersion is older than the retained history (HTTP 410 Gone)."""


class ChangeLog:
    """Every mutation in order; watches replay from a resourceVersion and then wait for more."""

    def __init__(self, retain: int = 20_000) -> None:
        self.retain = retain
        self.rv = 0
        self._changes: list[Change] = []
        self._first_rv = 1
        self._wakeup = asyncio.Event()

    def next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def append(self, change: Change) -> None:
        self._changes.append(change)
        if len(self._changes) > self.retain:
            self.compact(keep=self.retain // 2)
        wakeup, self._wakeup = self._wakeup, asyncio.Event()
        wakeup.set()

    def compact(self, keep: int = 0) -> None:
        """Forget all but the last `keep` changes: watches from older resourceVersions get 410 Gone (relist)."""
        del self._changes[: max(len(self._changes) - keep, 0)]
        self._first_rv = self._changes[0].rv if self._changes else self.rv + 1

    def since(self, rv: int) -> list[Change]:
        if rv >= self.rv:
            return []
        if rv < self._first_rv - 1:
            raise ResourceVersionExpired(rv)
        start = rv - self._first_rv + 1
        return self._changes[start:]

    def of(self, resource: kmock.resource, namespace: str | None, name: str) -> list[Change]:
        """The retained changes of one object, oldest first (for asserting progressions)."""
        return [
            c
            for c in self._changes
            if c.resource == resource and c.namespace == namespace and c.obj["metadata"]["name"] == name
        ]

    async def wait(self, timeout: float | None) -> None:
        wakeup = self._wakeup
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wakeup.wait(), timeout)

    def wake_all(self) -> None:
        self._wakeup.set()


@dataclass
class GcQueue:
    """What the garbage collector must look at after the changes committed since its last pass."""

    candidates: set[ObjectKey] = field(default_factory=set)  # dependents to look at
    owners: set[str] = field(default_factory=set)  # foreground owners to look at
    terminating: set[str] = field(default_factory=set)  # namespaces being drained
    wakeup: asyncio.Event | None = None  # bound to the server's loop while it runs

    def wake(self) -> None:
        if self.wakeup is not None and (self.candidates or self.owners or self.terminating):
            self.wakeup.set()


class ObjectStore:
    """The emulator's storage: the served kinds, the objects (kmock's ObjectsArray) with their indexes, reads, lists
    and watches, and each committed write recorded in the change log and queued for the garbage collector."""

    def __init__(self, api: KubernetesApiEmulator) -> None:
        self.api = api
        self.objects = api.objects  # kmock's ObjectsArray, made with the emulator and never replaced
        self.types: dict[kmock.resource, ResourceType] = {}
        self.uids: dict[str, ObjectKey] = {}  # live objects by uid
        self.live_keys: dict[kmock.resource, set[ObjectKey]] = {}
        self.dependents_of: dict[str, set[ObjectKey]] = {}  # owner uid -> dependents
        self.pending = GcQueue()
        # called after each commit with (resource type, new state or None), e.g. the RBAC aggregation controller
        self.committed: list[Callable[[ResourceType, Obj | None], None]] = []

    # ---- the served kinds

    def resource_type(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self.types.get(resource_key(group, version, plural))

    def type_for(self, group: str, version: str, plural: str) -> ResourceType:
        resource_type = self.resource_type(group, version, plural)
        if resource_type is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return resource_type

    # ---- reading

    def current(self, resource_type: ResourceType, namespace: str | None, name: str) -> Obj | None:
        key = (resource_type.key, namespace if resource_type.namespaced else None, name)
        if key not in self.objects:
            return None
        stored = self.objects[key]
        return None if stored.deleted else stored.raw

    def get_object(self, resource_type: ResourceType, namespace: str | None, name: str) -> Obj:
        obj = self.current(resource_type, namespace, name)
        if obj is None:
            raise self.not_found(resource_type, name)
        return obj

    @staticmethod
    def not_found(resource_type: ResourceType, name: str) -> ApiError:
        details = {"name": name, "group": resource_type.group, "kind": resource_type.plural}
        return ApiError(404, "NotFound", f'{resource_type.qualified} "{name}" not found', details)

    def live(self, resource_type: ResourceType, namespace: str | None) -> list[Obj]:
        keys = sorted(
            (k for k in self.live_keys.get(resource_type.key, ()) if namespace is None or k[1] == namespace),
            key=lambda k: (k[1] or "", k[2]),
        )
        return [self.objects[k].raw for k in keys]

    def live_object(self, key: ObjectKey) -> tuple[ResourceType, Obj] | None:
        if key not in self.objects or self.objects[key].deleted or key[0] not in self.types:
            return None
        return self.types[key[0]], self.objects[key].raw

    @staticmethod
    def selects(query: Mapping[str, str]) -> Callable[[Obj], bool]:
        labels = parse_label_selector(query.get("labelSelector", ""))
        fields = parse_field_selector(query.get("fieldSelector", ""))
        return lambda obj: labels(obj.get("metadata", {}).get("labels") or {}) and fields(obj)

    def list_objects(
        self, resource_type: ResourceType, namespace: str | None, query: Mapping[str, str], table: bool = False
    ) -> Obj:
        selects = self.selects(query)
        items = [o for o in self.live(resource_type, namespace) if selects(o)]
        metadata: Obj = {"resourceVersion": str(self.api.changes.rv)}
        if token := query.get("continue"):
            after = tuple(json.loads(base64.urlsafe_b64decode(token.encode())))
            items = [o for o in items if (o["metadata"].get("namespace") or "", o["metadata"]["name"]) > after]
        limit = int(query.get("limit") or 0)
        if limit and len(items) > limit:
            last = items[limit - 1]["metadata"]
            position = json.dumps([last.get("namespace") or "", last["name"]]).encode()
            metadata["continue"] = base64.urlsafe_b64encode(position).decode()
            metadata["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        if table:
            result = render_table(items, resource_type, query, self.api.changes.rv)
            result["metadata"].update(metadata)
            return result
        return {
            "kind": f"{resource_type.kind}List",
            "apiVersion": resource_type.api_version,
            "metadata": metadata,
            "items": items,
        }

    # ---- watching

    async def serve_watch(
        self,
        raw: aiohttp.web.BaseRequest,
        resource_type: ResourceType,
        target: RequestTarget,
        query: Mapping[str, str],
        table: bool,
    ) -> aiohttp.web.StreamResponse:
        changes = self.api.changes
        selects = self.selects(query)
        name = target.name
        namespace = target.namespace if resource_type.namespaced else None

        def visible(obj: Obj | None) -> bool:
            if obj is None:
                return False
            meta = obj.get("metadata", {})
            if name is not None and meta.get("name") != name:
                return False
            if namespace is not None and meta.get("namespace") != namespace:
                return False
            return selects(obj)

        def render(event_type: str, obj: Obj) -> bytes:
            payload = (
                render_table([obj], resource_type, query, changes.rv) if table and event_type != "BOOKMARK" else obj
            )
            return json.dumps({"type": event_type, "object": payload}).encode() + b"\n"

        since = query.get("resourceVersion", "")
        initial: list[Obj] = []
        if since in ("", "0") or query.get("sendInitialEvents") == "true":
            initial = [o for o in self.live(resource_type, namespace) if visible(o)]
            position = changes.rv
        else:
            try:
                position = int(since)
            except ValueError as e:
                raise ApiError(400, "BadRequest", f"invalid resourceVersion {since!r}") from e

        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(raw)
        loop = asyncio.get_running_loop()
        timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None
        deadline = loop.time() + timeout if timeout is not None else None
        try:
            for obj in initial:
                await response.write(render("ADDED", obj))
            if query.get("sendInitialEvents") == "true":
                await response.write(render("BOOKMARK", _initial_events_end(resource_type, position)))
            while not self.api.closing:
                try:
                    since_position = changes.since(position)
                except ResourceVersionExpired:
                    gone = ApiError(410, "Expired", f"too old resource version: {position} ({changes.rv})")
                    await response.write(json.dumps({"type": "ERROR", "object": gone.body()}).encode() + b"\n")
                    break
                for change in since_position:
                    position = change.rv
                    if change.resource != resource_type.key:
                        continue
                    event_type = self.watch_event_type(change, visible)
                    if event_type is not None:
                        await response.write(render(event_type, change.obj))
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    break
                await changes.wait(min(remaining, 5.0) if remaining is not None else 5.0)
            await response.write_eof()
        except ConnectionError:
            pass  # the client went away
        return response

    @staticmethod
    def watch_event_type(change: Change, visible: Callable[[Obj | None], bool]) -> str | None:
        """Selectors apply to both states: leaving the selection reads as DELETED, entering it as ADDED."""
        now, before = visible(change.obj), visible(change.old)
        if change.type == "MODIFIED":
            if now and before:
                return "MODIFIED"
            return "ADDED" if now else "DELETED" if before else None
        return change.type if now else None

    # ---- writing

    def commit(self, resource_type: ResourceType, namespace: str | None, new: Obj | None, old: Obj | None) -> None:
        """Store `new` (None: remove `old`) and record the change for watchers and the garbage collector."""
        changes = self.api.changes
        name = (new or old or {})["metadata"]["name"]
        key = (resource_type.key, namespace, name)
        rv = str(changes.next_rv())  # exactly one resourceVersion per recorded change (watches rely on it)
        self._track(key, new, old)
        if new is None:
            assert old is not None
            gone = {**old, "metadata": {**old["metadata"], "resourceVersion": rv}}
            self.objects[key].delete()
            changes.append(Change(changes.rv, resource_type.key, namespace, "DELETED", gone, old))
        else:
            new["metadata"]["resourceVersion"] = rv
            if key not in self.objects:
                self.objects[key] = new
            elif self.objects[key].deleted:
                self.objects[key].create(new)
            else:
                self.objects[key].history.append(new)
            history = self.objects[key].history
            limit = self.api.history_limit
            if limit and len(history) > limit:
                del history[: len(history) - limit]
            change_type = "ADDED" if old is None else "MODIFIED"
            changes.append(Change(changes.rv, resource_type.key, namespace, change_type, new, old))
            if resource_type.kind == "CustomResourceDefinition" and resource_type.group == "apiextensions.k8s.io":
                for served in ResourceType.from_crd(new):  # `kubectl apply -f crd.yaml` serves the kind at once
                    self.api.register(served)
        self.pending.wake()
        for observer in self.committed:
            observer(resource_type, new)

    def _track(self, key: ObjectKey, new: Obj | None, old: Obj | None) -> None:
        """Keep the indexes current and queue what the garbage collector must look at after this change."""
        pending = self.pending
        old_refs = _owner_uids(old) if old is not None else set()
        new_refs = _owner_uids(new) if new is not None else set()
        for uid in old_refs - new_refs:
            self.dependents_of.get(uid, set()).discard(key)
        for uid in new_refs - old_refs:
            self.dependents_of.setdefault(uid, set()).add(key)
        if new is None:
            assert old is not None
            uid = old["metadata"].get("uid", "")
            self.uids.pop(uid, None)
            self.live_keys.get(key[0], set()).discard(key)
            pending.candidates.update(self.dependents_of.get(uid, ()))  # now without this owner
            pending.owners.update(old_refs)  # a foreground owner may have waited for this one
            return
        meta = new["metadata"]
        self.uids[meta["uid"]] = key
        self.live_keys.setdefault(key[0], set()).add(key)
        if new_refs - old_refs:
            pending.candidates.add(key)  # an owner that does not exist is collected
        if meta.get("deletionTimestamp"):
            if FOREGROUND_FINALIZER in meta.get("finalizers", []):
                pending.candidates.update(self.dependents_of.get(meta["uid"], ()))
                pending.owners.add(meta["uid"])
            if _namespace_terminating(new):
                pending.terminating.add(meta["name"])

    def stamp_new(self, resource_type: ResourceType, namespace: str | None, data: Obj) -> Obj:
        """`data` as a new object of its kind: named, namespaced, server-owned metadata set, as PrepareForCreate."""
        obj = dict(data)
        meta = dict(obj.get("metadata") or {})
        obj["apiVersion"] = resource_type.api_version
        obj["kind"] = resource_type.kind
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(
                    422,
                    "Invalid",
                    f"{resource_type.kind} is invalid: metadata.name: Required value: name or generateName is required",
                )
            meta["name"] = meta["generateName"] + random_suffix()
        if resource_type.namespaced:
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        for server_owned in ("deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink"):
            meta.pop(server_owned, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        meta["generation"] = 1
        obj["metadata"] = meta
        if "status" in resource_type.subresources:
            obj.pop("status", None)  # the status subresource owns it; create ignores it
        if resource_type.plural == "namespaces" and resource_type.group == "":
            obj["spec"] = {"finalizers": [NAMESPACE_FINALIZER]}
            obj["status"] = {"phase": "Active"}
        if resource_type.kind == "Pod" and resource_type.group == "":
            obj = normalize_pod_quantities(obj)
            obj["status"] = {"phase": "Pending"}  # as the real server's PrepareForCreate
        if resource_type.kind == "Job" and resource_type.group == "batch":
            obj = _job_with_generated_selector(obj)
        return obj

    def store_new(self, resource_type: ResourceType, namespace: str | None, obj: Obj) -> Obj:
        self.commit(resource_type, namespace, obj, None)
        return obj

    def ensure(self, resource_type: ResourceType, obj: Obj) -> None:
        """Store a cluster-scoped object unless one of its name is there (bootstrap objects, namespaces)."""
        if self.current(resource_type, None, obj["metadata"]["name"]) is None:
            self.store_new(resource_type, None, self.stamp_new(resource_type, None, obj))


def _initial_events_end(resource_type: ResourceType, position: int) -> Obj:
    """The BOOKMARK that ends a watch's initial events (sendInitialEvents=true), at the list's resourceVersion."""
    return {
        "kind": resource_type.kind,
        "apiVersion": resource_type.api_version,
        "metadata": {"resourceVersion": str(position), "annotations": {"k8s.io/initial-events-end": "true"}},
    }


def _foreground(options: Mapping[str, Any]) -> bool:
    return str(options.get("propagationPolicy") or "") == "Foreground"


def _owner_uids(obj: Obj) -> set[str]:
    return {str(ref.get("uid")) for ref in obj["metadata"].get("ownerReferences") or [] if ref.get("uid")}


def _namespace_terminating(obj: Obj) -> bool:
    return obj.get("kind") == "Namespace" and bool(obj["metadata"].get("deletionTimestamp"))


def _json_copy(value: Any) -> Any:
    """A deep copy of JSON data (several times faster than copy.deepcopy)."""
    return json.loads(json.dumps(value))


def _without(obj: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in keys}


def _quantity_text(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    if float(value).is_integer():
        return str(int(value))
    return f"{round(value * 1000)}m"


def normalize_pod_quantities(pod: Obj) -> Obj:
    """The API server stores resource quantities as strings (1 -> "1", 0.5 -> "500m"); typed clients rely on it."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return pod
    spec = dict(spec)
    for key in ("containers", "initContainers"):
        containers = []
        for container in spec.get(key) or []:
            resources = container.get("resources") or {}
            if resources:
                resources = {
                    kind: {name: _quantity_text(v) for name, v in (values or {}).items()}
                    if isinstance(values, dict)
                    else values
                    for kind, values in resources.items()
                }
                container = {**container, "resources": resources}
            containers.append(container)
        if key in spec:
            spec[key] = containers
    return {**pod, "spec": spec}


def _strip_directives(patch: Any) -> Any:
    """Drop strategic-merge-patch directives ($patch, $setElementOrder/...): merged as a JSON merge patch."""
    if isinstance(patch, dict):
        return {k: _strip_directives(v) for k, v in patch.items() if not str(k).startswith("$")}
    return patch


def _job_with_generated_selector(job: Obj) -> Obj:
    """pkg/registry/batch/job/strategy.go PrepareForCreate -> generateSelector (unless spec.manualSelector): the
    template gains the job-name and controller-uid labels (legacy and batch.kubernetes.io/ names), the selector
    matches batch.kubernetes.io/controller-uid=<uid>. `kubectl logs job/NAME` finds the Job's pods by it."""
    spec = dict(job.get("spec") or {})
    if spec.get("manualSelector"):
        return job
    meta = job["metadata"]
    template = dict(spec.get("template") or {})
    template_meta = dict(template.get("metadata") or {})
    labels = dict(template_meta.get("labels") or {})
    for key in JOB_NAME_LABELS:
        labels.setdefault(key, meta["name"])
    for key in JOB_CONTROLLER_UID_LABELS:
        labels.setdefault(key, meta["uid"])
    template_meta["labels"] = labels
    template["metadata"] = template_meta
    selector = dict(spec.get("selector") or {})
    match = dict(selector.get("matchLabels") or {})
    match.setdefault(JOB_CONTROLLER_UID_LABELS[1], meta["uid"])
    selector["matchLabels"] = match
    spec.update(template=template, selector=selector)
    return {**job, "spec": spec}
