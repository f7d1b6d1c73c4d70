"""Pod lifetimes as the API server shows them (created, gone, GPUs), so tests can sum the GPU-seconds pods held after
a moment: a pod watch, since the pods of the stand-ins are deleted by KubeRay, the operator and ownerReference GC."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sweep_contracts import constants
from sweep_contracts.timestamps import parse_time

from .controllers import Informer, Obj


def _epoch(value: Any) -> float | None:
    parsed = parse_time(value) if isinstance(value, str) and value else None
    return parsed.timestamp() if parsed is not None else None


def pod_gpus(pod: Mapping[str, Any]) -> int:
    """The GPUs the pod's containers ask for (limits, else requests), as the scheduler counts them."""
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        value = (resources.get("limits") or {}).get(constants.GPU_RESOURCE)
        value = value if value is not None else (resources.get("requests") or {}).get(constants.GPU_RESOURCE)
        total += int(value or 0)
    return total


@dataclass
class PodLife:
    """One pod: when it appeared, when it was seen deleted (its deletionTimestamp or its DELETED event, the
    earlier), its GPUs and labels."""

    name: str
    namespace: str
    created: float
    gpus: int
    labels: dict[str, str]
    gone: float | None = None


class _PodInformer(Informer):
    """The generic informer over core v1 pods (it lists custom objects otherwise)."""

    def _list(self, **kwargs: Any) -> Any:
        import kubernetes.client

        core = kubernetes.client.CoreV1Api(self.api.api_client)
        if kwargs.get("watch"):
            if self.namespace:
                return core.list_namespaced_pod(self.namespace, **kwargs)
            return core.list_pod_for_all_namespaces(**kwargs)
        response: Any
        if self.namespace:
            response = core.list_namespaced_pod(self.namespace, _preload_content=False)
        else:
            response = core.list_pod_for_all_namespaces(_preload_content=False)
        return json.loads(response.data)


class PodLifetimes:
    """Watches pods and keeps each one's life. `gpu_seconds_after(t)` sums GPUs x seconds held after `t`, pods still
    there counted up to now.

        lifetimes = PodLifetimes(api_client).start()
        ...
        lifetimes.gpu_seconds_after(t0, cluster="c1")
    """

    def __init__(self, api_client: Any, namespace: str | None = None) -> None:
        import kubernetes.client

        custom = kubernetes.client.CustomObjectsApi(api_client)
        self._informer = _PodInformer(custom, "", "v1", "pods", self._seen, namespace, on_delete=self._deleted)
        self._lock = threading.Lock()
        self._pods: dict[str, PodLife] = {}  # by uid

    def start(self, timeout: float = 10.0) -> PodLifetimes:
        self._informer.start()
        if not self._informer.synced.wait(timeout):
            raise RuntimeError("the pod watch could not list pods")
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._informer.stop(timeout)

    def _life(self, pod: Obj) -> PodLife:
        meta = pod["metadata"]
        uid = str(meta.get("uid") or meta["name"])
        with self._lock:
            life = self._pods.get(uid)
            if life is None:
                created = _epoch(meta.get("creationTimestamp")) or time.time()
                life = PodLife(
                    meta["name"], meta.get("namespace", ""), created, pod_gpus(pod), dict(meta.get("labels") or {})
                )
                self._pods[uid] = life
            return life

    def _seen(self, pod: Obj) -> None:
        life = self._life(pod)
        deleting = _epoch(pod["metadata"].get("deletionTimestamp"))
        if deleting is not None:
            with self._lock:
                life.gone = deleting if life.gone is None else min(life.gone, deleting)

    def _deleted(self, pod: Obj) -> None:
        life = self._life(pod)
        with self._lock:
            life.gone = time.time() if life.gone is None else life.gone

    def lives(self, **labels: str) -> list[PodLife]:
        """The pods seen (gone or not) whose labels include `labels` (keyword names: `cluster` for ray.io/cluster,
        `node_type` for ray.io/node-type, else the label key as given)."""
        keys = {"cluster": constants.RAY_LABEL_CLUSTER, "node_type": constants.RAY_LABEL_NODE_TYPE}
        wanted = {keys.get(k, k): v for k, v in labels.items()}
        with self._lock:
            return [
                PodLife(**vars(life))
                for life in self._pods.values()
                if all(life.labels.get(k) == v for k, v in wanted.items())
            ]

    def gpu_seconds_after(self, since: float, now: float | None = None, **labels: str) -> float:
        """GPU-seconds the matching pods held after `since` (a pod still there counts up to `now`)."""
        end = time.time() if now is None else now
        return sum(
            life.gpus * max(0.0, (life.gone if life.gone is not None else end) - max(since, life.created))
            for life in self.lives(**labels)
        )
