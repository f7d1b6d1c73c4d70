"""Generic controller machinery both stand-ins use, as controller-runtime and client-go provide it to KubeRay and
Kueue: a keyed work queue, list+watch informers into a cache, and the body of a core v1 Event.

Threads, not asyncio: informer threads watch through the kubernetes client and feed the queue that workers drain.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import heapq
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from .kube_values import now_rfc3339

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name)

logger = logging.getLogger(__name__)


class WorkQueue:
    """controller-runtime's queue: a key is never processed twice at once; re-adds while processing run after."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._ready: deque[Hashable] = deque()
        self._queued: set[Hashable] = set()
        self._processing: set[Hashable] = set()
        self._dirty: set[Hashable] = set()
        self._timers: list[tuple[float, int, Hashable]] = []
        self._due: dict[Hashable, float] = {}
        self._seq = 0
        self._closed = False

    def add(self, key: Hashable) -> None:
        with self._cond:
            self._add_locked(key)

    def _add_locked(self, key: Hashable) -> None:
        if key in self._processing:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._ready.append(key)
            self._cond.notify()

    def add_after(self, key: Hashable, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        due = time.monotonic() + delay
        with self._cond:
            if key in self._due and self._due[key] <= due:
                return
            self._due[key] = due
            self._seq += 1
            heapq.heappush(self._timers, (due, self._seq, key))
            self._cond.notify()

    def get(self) -> Hashable | None:
        """The next key to process, or None once closed."""
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                while self._timers and self._timers[0][0] <= now:
                    due, _, key = heapq.heappop(self._timers)
                    if self._due.get(key) == due:
                        del self._due[key]
                        self._add_locked(key)
                if self._ready:
                    key = self._ready.popleft()
                    self._queued.discard(key)
                    self._processing.add(key)
                    return key
                self._cond.wait(self._timers[0][0] - now if self._timers else None)
            return None

    def done(self, key: Hashable) -> None:
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._dirty.discard(key)
                self._add_locked(key)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


def resource_version(obj: Mapping[str, Any]) -> int:
    try:
        return int(obj["metadata"]["resourceVersion"])
    except (KeyError, ValueError, TypeError):
        return 0


class Informer:
    """Lists and watches one custom resource into a cache; calls `on_change(obj)` for every change."""

    def __init__(
        self,
        api: Any,
        group: str,
        version: str,
        plural: str,
        on_change: Callable[[Obj], None],
        namespace: str | None = None,
        on_delete: Callable[[Obj], None] | None = None,
    ) -> None:
        self.api, self.group, self.version, self.plural = api, group, version, plural
        self.namespace = namespace
        self.on_change = on_change
        self.on_delete = on_delete
        self.synced = threading.Event()
        self._cache: dict[Key, Obj] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, name=f"informer-{plural}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):  # the stream may already be closed
                response.shutdown()  # unblocks the thread's read at once
        self._thread.join(timeout)

    def get(self, namespace: str, name: str) -> Obj | None:
        with self._lock:
            obj = self._cache.get((namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def items(self) -> list[Obj]:
        with self._lock:
            return [copy.deepcopy(o) for o in self._cache.values()]

    def find(self, matches: Callable[[Obj], bool]) -> Obj | None:
        """A copy of the first cached object `matches` accepts. `matches` sees the cache's own objects (it must not
        change them), so a lookup by one field copies one object, not the whole cache as `items()` does."""
        with self._lock:
            found = next((o for o in self._cache.values() if matches(o)), None)
            return copy.deepcopy(found) if found is not None else None

    def remember(self, obj: Obj) -> None:
        """Write-through after our own writes, so the next reconcile does not act on a stale copy."""
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        with self._lock:
            cached = self._cache.get(key)
            if cached is None or resource_version(obj) >= resource_version(cached):
                self._cache[key] = obj

    def _apply(self, event_type: str, obj: Obj) -> None:
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        with self._lock:
            if event_type == "DELETED":
                self._cache.pop(key, None)
            else:
                cached = self._cache.get(key)
                if (
                    cached is None
                    or resource_version(obj) >= resource_version(cached)
                    or cached["metadata"].get("uid") != obj["metadata"].get("uid")
                ):
                    self._cache[key] = obj
        if event_type == "DELETED" and self.on_delete is not None:
            self.on_delete(obj)
        self.on_change(obj)

    def _list(self, **kwargs: Any) -> Any:
        if self.namespace:
            return self.api.list_namespaced_custom_object(
                self.group, self.version, self.namespace, self.plural, **kwargs
            )
        return self.api.list_cluster_custom_object(self.group, self.version, self.plural, **kwargs)

    def _run(self) -> None:
        from kubernetes.watch.watch import iter_resp_lines

        while not self._stopping.is_set():
            try:
                listed = self._list()
                with self._lock:
                    before = self._cache
                    self._cache = {
                        (o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in listed["items"]
                    }
                    vanished = [o for k, o in before.items() if k not in self._cache]
                if self.on_delete is not None:
                    for obj in vanished:  # deleted while the watch was down: no DELETED event will come
                        self.on_delete(obj)
                for obj in listed["items"]:
                    self.on_change(obj)
                self.synced.set()
                rv = listed["metadata"]["resourceVersion"]
                while not self._stopping.is_set():
                    self._response = self._list(
                        watch=True, resource_version=rv, timeout_seconds=60, _preload_content=False
                    )
                    expired = False
                    for line in iter_resp_lines(self._response):
                        if not line:
                            continue
                        event = json.loads(line)
                        if event["type"] == "ERROR":
                            expired = event["object"].get("code") == 410
                            break
                        if event["type"] == "BOOKMARK":
                            rv = event["object"]["metadata"]["resourceVersion"]
                            continue
                        rv = event["object"]["metadata"]["resourceVersion"]
                        self._apply(event["type"], event["object"])
                    self._response.release_conn()
                    if expired:
                        break  # relist
            except Exception as e:
                if self._stopping.is_set():
                    return
                logger.debug("informer %s: %r; relisting", self.plural, e)
                self._stopping.wait(0.2)


def event_body(
    involved: Mapping[str, Any],
    type_: str,
    reason: str,
    message: str,
    component: str,
    host: str | None = None,
    action: str | None = None,
    instance: str = "",
) -> Obj:
    """A core v1 Event about `involved`, named as client-go's recorders name them.

    With `action`, the shape of client-go's tools/events recorder (what KubeRay v1.7's `mgr.GetEventRecorder` uses:
    eventTime, action, reportingComponent/Instance (`component`-`instance`, the controller's pod), no source or counts); without it, the legacy tools/record shape
    (source.component, first/lastTimestamp, count), as the kubelet writes them.
    """
    meta = involved["metadata"]
    now = now_rfc3339()
    body: Obj = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{time.time_ns():x}", "namespace": meta.get("namespace", "default")},
        "involvedObject": {
            "apiVersion": involved.get("apiVersion", "v1"),
            "kind": involved.get("kind", ""),
            "name": meta["name"],
            "namespace": meta.get("namespace", "default"),
            "uid": meta.get("uid", ""),
            "resourceVersion": meta.get("resourceVersion", ""),
        },
        "type": type_,
        "reason": reason,
        "message": message,
    }
    if action is not None:
        micro = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body.update(
            eventTime=micro,
            action=action,
            reportingComponent=component,
            reportingInstance=f"{component}-{instance}",
            source={},
        )
        return body
    source: Obj = {"component": component}
    if host:
        source["host"] = host
    body.update(
        source=source,
        firstTimestamp=now,
        lastTimestamp=now,
        count=1,
        reportingComponent=component,
        reportingInstance=host or "",
    )
    return body
