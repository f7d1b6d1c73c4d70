"""The Kueue stand-in's side of the Kubernetes API: its client, its caches (informers on RayJobs and Kueue's kinds)
and its writes (Workload status, a RayJob's suspend, Events as client-go's recorder writes them)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from ..controllers import Informer, event_body
from .crds import GROUP, MANAGER, MANAGER_POD, RAY_GROUP, RAY_VERSION, USER_AGENT, VERSION, Obj

logger = logging.getLogger(__name__)


class KueueClient:
    """`events` and `admissions` are what tests read: (object name, reason, message) of each Event recorded, and
    (workload, cluster queue, when) of each admission."""

    def __init__(
        self,
        api_client: Any,
        on_rayjob: Callable[[Obj], None],
        on_workload: Callable[[Obj], None],
        on_queue_change: Callable[[Obj], None],
    ) -> None:
        import kubernetes.client

        api_client.user_agent = USER_AGENT
        self.api_client = api_client
        self.custom = kubernetes.client.CustomObjectsApi(api_client)
        self.ApiException = kubernetes.client.ApiException
        kueue = (self.custom, GROUP, VERSION)
        self.rayjobs = Informer(self.custom, RAY_GROUP, RAY_VERSION, "rayjobs", on_rayjob)
        self.workloads = Informer(*kueue, "workloads", on_workload)
        self.cluster_queues = Informer(*kueue, "clusterqueues", on_queue_change)
        self.local_queues = Informer(*kueue, "localqueues", on_queue_change)
        self.priority_classes = Informer(*kueue, "workloadpriorityclasses", on_queue_change)
        self.informers = (self.rayjobs, self.workloads, self.cluster_queues, self.local_queues, self.priority_classes)
        self.lock = threading.Lock()
        self.events: list[tuple[str, str, str]] = []
        self.admissions: list[tuple[str, str, float]] = []

    def event(self, involved: Obj, type_: str, reason: str, message: str) -> None:
        """An Event through client-go's events recorder (best effort, as the recorder)."""
        with self.lock:
            self.events.append((involved["metadata"]["name"], reason, message))
        body = event_body(involved, type_, reason, message, MANAGER, action=reason, instance=MANAGER_POD)
        try:
            _, url, headers, payload, _ = self.api_client.param_serialize(
                "POST",
                f"/api/v1/namespaces/{body['metadata']['namespace']}/events",
                header_params={"Content-Type": "application/json", "Accept": "application/json"},
                body=body,
            )
            self.api_client.call_api("POST", url, header_params=headers, body=payload).read()
        except Exception as e:
            logger.debug("kueue event %s not recorded: %r", reason, e)

    def patch_workload_status(self, wl: Obj, status: Obj) -> Obj:
        meta = wl["metadata"]
        patch = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": status}
        patched = dict(
            self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, meta["namespace"], "workloads", meta["name"], patch
            )
        )
        self.workloads.remember(patched)
        return patched

    def patch_rayjob(self, rayjob: Obj, spec: Obj) -> Obj:
        meta = rayjob["metadata"]
        patched = dict(
            self.custom.patch_namespaced_custom_object(
                RAY_GROUP,
                RAY_VERSION,
                meta["namespace"],
                "rayjobs",
                meta["name"],
                {"metadata": {"resourceVersion": meta["resourceVersion"]}, "spec": spec},
            )
        )
        self.rayjobs.remember(patched)
        return patched

    def workload_for(self, rayjob: Obj) -> Obj | None:
        uid = rayjob["metadata"].get("uid")
        owned = [
            w
            for w in self.workloads.items()
            if w["metadata"].get("namespace") == rayjob["metadata"]["namespace"]
            and any(r.get("uid") == uid and r.get("controller") for r in w["metadata"].get("ownerReferences") or [])
        ]
        return owned[0] if owned else None
