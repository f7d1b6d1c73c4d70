"""The Kueue stand-in as tests and the sandbox start it: its CRDs and RayJob webhook installed, informers feeding one
worker that runs the job reconciler and the scheduler in turn, queues applied and Workloads evicted on demand."""

from __future__ import annotations

import copy
import logging
import threading
from typing import Any

from ..controllers import WorkQueue
from .client import KueueClient
from .crds import GROUP, KUEUE_CRDS, RAY_GROUP, VERSION, Obj
from .job_reconciler import RayJobReconciler
from .rayjob_integration import validate_rayjob_for_kueue, validate_rayjob_update
from .scheduler import Scheduler
from .workloads import set_condition, workload_condition

logger = logging.getLogger(__name__)


class KueueStandIn:
    """Kueue for RayJobs against a Kubernetes API (the emulator in practice).

        kueue = KueueStandIn(server.api_client())
        kueue.start()                         # installs the Kueue CRDs if missing and the RayJob webhook
        kueue.apply_queues(cluster_queue("gpu-cq", {"nvidia.com/gpu": 4}), local_queue("team-a", "gpu-q", "gpu-cq"))
        ...
        kueue.evict("team-a", workload_name)  # what the preemptor does to a victim
        kueue.stop()

    With `server` (an EmulatorServer) the stand-in registers the RayJob validating webhook in the emulator, so a
    Kueue-managed RayJob that breaks rayjob_webhook.go's rules is refused at the API as on a real cluster.
    """

    def __init__(self, api_client: Any, *, server: Any = None, poll_interval: float = 0.5) -> None:
        self.client = KueueClient(api_client, self._on_rayjob, self._on_workload, self._on_queue_change)
        self.custom = self.client.custom
        self.ApiException = self.client.ApiException
        self.server = server
        self.poll_interval = poll_interval
        self.queue = WorkQueue()
        self._install_crds()
        self.workloads = self.client.workloads
        self.events = self.client.events  # (object name, reason, message), for tests
        self.admissions = self.client.admissions  # (workload, cluster queue, when)
        self.jobs = RayJobReconciler(self.client, self.queue, poll_interval)
        self.scheduler = Scheduler(self.client, self.queue)
        self._worker = threading.Thread(target=self._work, name="kueue-worker", daemon=True)
        self._webhook_installed = False

    # ---- lifecycle

    def _install_crds(self) -> None:
        import kubernetes.client

        ext = kubernetes.client.ApiextensionsV1Api(self.client.api_client)
        for crd in KUEUE_CRDS:
            try:
                ext.create_custom_resource_definition(copy.deepcopy(crd))
            except self.ApiException as e:
                if e.status != 409:
                    raise

    def start(self, timeout: float = 10.0) -> KueueStandIn:
        if self.server is not None:
            self._install_webhook()
        for informer in self.client.informers:
            informer.start()
        for informer in self.client.informers:
            if not informer.synced.wait(timeout):
                self.stop()
                raise RuntimeError(f"the Kueue stand-in could not list {informer.plural}")
        self._worker.start()
        self.queue.add(("schedule",))
        return self

    def stop(self, timeout: float = 5.0) -> None:
        for informer in self.client.informers:
            informer.stop(timeout)
        self.queue.close()
        if self._worker.is_alive():
            self._worker.join(timeout)
        if self._webhook_installed and self.server is not None and self.server.running:
            self._uninstall_webhook()

    def __enter__(self) -> KueueStandIn:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _install_webhook(self) -> None:
        """vrayjob.kb.io (failurePolicy Fail): the API refuses RayJob creates and updates that break Kueue's rules."""
        hooks = self.server.emulator.validating_webhooks
        self.server.call(lambda: hooks.append(self._admission_review))
        self._webhook_installed = True

    def _uninstall_webhook(self) -> None:
        hooks = self.server.emulator.validating_webhooks
        self.server.call(lambda: hooks.remove(self._admission_review) if self._admission_review in hooks else None)
        self._webhook_installed = False

    def _admission_review(self, resource: str, old: Obj | None, new: Obj) -> tuple[str, list[str]]:
        if resource != f"{RAY_GROUP}/rayjobs":
            return "", []
        if old is None:
            return "vrayjob.kb.io", validate_rayjob_for_kueue(new)
        return "vrayjob.kb.io", validate_rayjob_update(old, new)

    # ---- queues (for tests and the sandbox)

    def apply(self, obj: Obj) -> Obj:
        """Create or replace a Kueue object (ClusterQueue, LocalQueue, ResourceFlavor, WorkloadPriorityClass)."""
        plural = {
            "ClusterQueue": "clusterqueues",
            "LocalQueue": "localqueues",
            "ResourceFlavor": "resourceflavors",
            "WorkloadPriorityClass": "workloadpriorityclasses",
        }[obj["kind"]]
        namespace, name = obj["metadata"].get("namespace"), obj["metadata"]["name"]
        try:
            if namespace:
                return dict(self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, obj))
            return dict(self.custom.create_cluster_custom_object(GROUP, VERSION, plural, obj))
        except self.ApiException as e:
            if e.status != 409:
                raise
        for _ in range(20):  # replace; the stand-in's own status writes may bump the resourceVersion in between
            if namespace:
                current = self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)
            else:
                current = self.custom.get_cluster_custom_object(GROUP, VERSION, plural, name)
            body = {**obj, "metadata": {**obj["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
            try:
                if namespace:
                    return dict(
                        self.custom.replace_namespaced_custom_object(GROUP, VERSION, namespace, plural, name, body)
                    )
                return dict(self.custom.replace_cluster_custom_object(GROUP, VERSION, plural, name, body))
            except self.ApiException as e:
                if e.status != 409:
                    raise
        raise RuntimeError(f"could not replace {plural}/{name}: conflicts")

    def apply_queues(self, *objects: Obj) -> None:
        for obj in objects:
            self.apply(obj)

    # ---- eviction on demand (the preemptor's half; the job reconciler then stops the RayJob)

    def evict(
        self,
        namespace: str,
        name: str,
        *,
        reason: str = "Preempted",
        preemption_reason: str = "InClusterQueue",
        message: str = "",
    ) -> Obj:
        """Evict an admitted Workload as preemption.go IssuePreemptions does: Evicted=True (reason Preempted) and
        Preempted=True (reason InClusterQueue...), with the preemptor's message."""
        text = message or (
            "Preempted to accommodate a workload (UID: UNKNOWN, JobUID: UNKNOWN) due to "
            "prioritization in the ClusterQueue; preemptor path: UNKNOWN; preemptee path: UNKNOWN"
        )
        for _ in range(20):
            wl = dict(self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "workloads", name))
            if not (wl.get("status") or {}).get("admission"):
                raise ValueError(f"workload {namespace}/{name} holds no quota: nothing to evict")
            conditions = list((wl.get("status") or {}).get("conditions") or [])
            generation = wl["metadata"].get("generation")
            conditions = set_condition(conditions, workload_condition("Evicted", True, reason, text, generation))
            if reason == "Preempted":
                conditions = set_condition(conditions, workload_condition("Preempted", True, preemption_reason, text))
            try:
                patched = self.client.patch_workload_status(wl, {"conditions": conditions})
            except self.ApiException as e:
                if e.status == 409:
                    continue
                raise
            self.client.event(wl, "Normal", "Preempted" if reason == "Preempted" else "EvictedDueTo" + reason, text)
            return patched
        raise RuntimeError(f"could not evict {namespace}/{name}: conflicts")

    # ---- informers into the queue

    def _on_rayjob(self, rayjob: Obj) -> None:
        self.queue.add(("job", rayjob["metadata"]["namespace"], rayjob["metadata"]["name"]))

    def _on_workload(self, wl: Obj) -> None:
        for ref in wl["metadata"].get("ownerReferences") or []:
            if ref.get("kind") == "RayJob" and ref.get("controller"):
                self.queue.add(("job", wl["metadata"]["namespace"], ref["name"]))
        self.queue.add(("schedule",))

    def _on_queue_change(self, _: Obj) -> None:
        self.queue.add(("schedule",))

    def _work(self) -> None:
        while (key := self.queue.get()) is not None:
            assert isinstance(key, tuple)
            delay: float | None = None
            try:
                if key[0] == "job":
                    delay = self.jobs.reconcile(key[1], key[2])
                else:
                    self.scheduler.schedule()
            except Exception as e:
                expected = isinstance(e, self.ApiException) and e.status in (404, 409)
                logger.log(logging.DEBUG if expected else logging.WARNING, "kueue %s failed: %r", key, e)
                delay = 0.1
            finally:
                self.queue.done(key)
            if delay is not None:
                self.queue.add_after(key, delay)

    def reconcile_job(self, namespace: str, name: str) -> float | None:
        """One pass of the job reconciler over one RayJob; returns when to look again (None: on its next change)."""
        return self.jobs.reconcile(namespace, name)

    def schedule(self) -> None:
        """One scheduling pass over every ClusterQueue."""
        self.scheduler.schedule()
