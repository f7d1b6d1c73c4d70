"""Kueue's scheduler for ClusterQueues without cohorts (pkg/scheduler): pending Workloads admitted by priority, then
creation, while they fit the nominal quota, and the queues' counts of pending, reserving and admitted Workloads."""

from __future__ import annotations

import time
from collections.abc import Mapping
from decimal import Decimal

from ..controllers import WorkQueue
from ..kube_values import now_rfc3339, parse_rfc3339
from .client import KueueClient
from .crds import GROUP, VERSION, Obj
from .workloads import assign_flavors, condition_of, is_true, quantity, set_condition, workload_condition


class Scheduler:
    """One pass at a time, on the stand-in's one worker, so quota is never double-booked."""

    def __init__(self, client: KueueClient, queue: WorkQueue) -> None:
        self.client = client
        self.queue = queue

    def schedule(self) -> None:
        """One scheduling pass: each ClusterQueue admits its pending Workloads by priority, then creation, while
        they fit its nominalQuota (StrictFIFO: the head blocks the rest; BestEffortFIFO: the rest may go)."""
        cqs = {cq["metadata"]["name"]: cq for cq in self.client.cluster_queues.items()}
        lqs = {(lq["metadata"]["namespace"], lq["metadata"]["name"]): lq for lq in self.client.local_queues.items()}
        workloads = [
            w
            for w in self.client.workloads.items()
            if not is_true(w, "Finished") and not w["metadata"].get("deletionTimestamp")
        ]
        usage: dict[str, dict[tuple[str, str], Decimal]] = {name: {} for name in cqs}
        for wl in workloads:
            admission = (wl.get("status") or {}).get("admission") or {}
            if admission.get("clusterQueue") in usage:
                for psa in admission.get("podSetAssignments") or []:
                    for resource, amount in (psa.get("resourceUsage") or {}).items():
                        flavor = (psa.get("flavors") or {}).get(resource, "")
                        key = (flavor, resource)
                        usage[admission["clusterQueue"]][key] = usage[admission["clusterQueue"]].get(
                            key, Decimal(0)
                        ) + quantity(amount)
        pending: dict[str, list[Obj]] = {name: [] for name in cqs}
        for wl in workloads:
            if (wl.get("status") or {}).get("admission") or not (wl.get("spec") or {}).get("active", True):
                continue
            lq = lqs.get((wl["metadata"]["namespace"], (wl.get("spec") or {}).get("queueName", "")))
            if lq is None:
                self._pending(wl, "Misconfigured", f"LocalQueue {wl['spec'].get('queueName', '')} doesn't exist")
                continue
            cq_name = (lq.get("spec") or {}).get("clusterQueue", "")
            if cq_name not in cqs:
                self._pending(wl, "Misconfigured", f"ClusterQueue {cq_name} doesn't exist")
                continue
            if (cqs[cq_name].get("spec") or {}).get("stopPolicy") in ("Hold", "HoldAndDrain"):
                self._pending(wl, "Suspended", f"ClusterQueue {cq_name} is inactive")
                continue
            if not self._namespace_eligible(cqs[cq_name], wl["metadata"]["namespace"]):
                self._pending(wl, "Inadmissible", "workload namespace doesn't match ClusterQueue selector")
                continue
            pending[cq_name].append(wl)
        for cq_name, queue in pending.items():
            cq = cqs[cq_name]
            queue.sort(
                key=lambda w: (
                    -int((w.get("spec") or {}).get("priority") or 0),
                    w["metadata"].get("creationTimestamp", ""),
                    w["metadata"]["name"],
                )
            )
            strict = (cq.get("spec") or {}).get("queueingStrategy", "BestEffortFIFO") == "StrictFIFO"
            blocked = False
            for wl in queue:
                if blocked:
                    self._pending(
                        wl,
                        "WaitingForQuota",
                        f"Workload is waiting behind an older workload in ClusterQueue {cq_name} (StrictFIFO)",
                    )
                    continue
                assignments, reason, message = assign_flavors(cq, wl, usage[cq_name])
                if assignments is None:
                    self._pending(wl, reason, message)
                    blocked = strict
                    continue
                for psa in assignments:
                    for resource, amount in psa["resourceUsage"].items():
                        key = (psa["flavors"][resource], resource)
                        usage[cq_name][key] = usage[cq_name].get(key, Decimal(0)) + quantity(amount)
                self._admit(wl, cq_name, assignments)
        self._write_queue_status(cqs, lqs)

    def _namespace_eligible(self, cq: Obj, namespace: str) -> bool:
        """spec.namespaceSelector: null selects no namespace, {} every one; matchLabels against the Namespace's
        labels (matchExpressions are not modelled)."""
        selector = (cq.get("spec") or {}).get("namespaceSelector")
        if selector is None:
            return False
        wanted = selector.get("matchLabels") or {}
        if not wanted:
            return True
        import kubernetes.client

        try:
            ns = kubernetes.client.CoreV1Api(self.client.api_client).read_namespace(namespace)
        except self.client.ApiException:
            return False
        labels = ns.metadata.labels or {}
        return all(labels.get(k) == v for k, v in wanted.items())

    def _pending(self, wl: Obj, reason: str, message: str) -> None:
        current = condition_of(wl, "QuotaReserved")
        if (
            current is not None
            and current.get("status") == "False"
            and current.get("reason") == reason
            and current.get("message") == message
        ):
            return
        conditions = set_condition(
            list((wl.get("status") or {}).get("conditions") or []),
            workload_condition("QuotaReserved", False, reason, message, wl["metadata"].get("generation")),
        )
        try:
            self.client.patch_workload_status(wl, {"conditions": conditions})
        except self.client.ApiException as e:
            if e.status not in (404, 409):
                raise
            return
        self.client.event(wl, "Warning", reason, message)

    def _admit(self, wl: Obj, cq_name: str, assignments: list[Obj]) -> None:
        """SetQuotaReservation (Evicted/Preempted reset to False with "Previously: ..."), then SyncAdmittedCondition
        (no admission checks: Admitted at once)."""
        generation = wl["metadata"].get("generation")
        conditions = list((wl.get("status") or {}).get("conditions") or [])
        now = now_rfc3339()
        conditions = set_condition(
            conditions,
            workload_condition(
                "QuotaReserved", True, "QuotaReserved", f"Quota reserved in ClusterQueue {cq_name}", generation, now
            ),
        )
        for type_ in ("Evicted", "Preempted"):
            previous = condition_of({"status": {"conditions": conditions}}, type_)
            if previous is not None and previous.get("status") == "True":
                conditions = set_condition(
                    conditions,
                    workload_condition(
                        type_, False, "QuotaReserved", "Previously: " + previous.get("message", ""), generation, now
                    ),
                )
        conditions = set_condition(
            conditions, workload_condition("Admitted", True, "Admitted", "The workload is admitted", generation, now)
        )
        try:
            patched = self.client.patch_workload_status(
                wl, {"conditions": conditions, "admission": {"clusterQueue": cq_name, "podSetAssignments": assignments}}
            )
        except self.client.ApiException as e:
            if e.status in (404, 409):
                self.queue.add_after(("schedule",), 0.05)
                return
            raise
        created = (
            parse_rfc3339(wl["metadata"]["creationTimestamp"]).timestamp()
            if wl["metadata"].get("creationTimestamp")
            else time.time()
        )
        requeued = condition_of(wl, "Requeued")
        since = parse_rfc3339(requeued["lastTransitionTime"]).timestamp() if requeued else created
        with self.client.lock:
            self.client.admissions.append((wl["metadata"]["name"], cq_name, time.time()))
        self.client.event(
            patched,
            "Normal",
            "QuotaReserved",
            f"Quota reserved in ClusterQueue {cq_name}, wait time since queued was {max(time.time() - since, 0):.0f}s",
        )
        self.client.event(
            patched, "Normal", "Admitted", f"Admitted by ClusterQueue {cq_name}, wait time since reservation was 0s"
        )

    def _write_queue_status(self, cqs: Mapping[str, Obj], lqs: Mapping[tuple[str, str], Obj]) -> None:
        """pendingWorkloads / reservingWorkloads / admittedWorkloads, as the queue controllers count them."""
        workloads = [w for w in self.client.workloads.items() if not is_true(w, "Finished")]
        for (namespace, name), lq in lqs.items():
            mine = [
                w for w in workloads if w["metadata"]["namespace"] == namespace and w["spec"].get("queueName") == name
            ]
            self._counts("localqueues", lq, mine)
        for name, cq in cqs.items():
            mine = [
                w
                for w in workloads
                if ((w.get("status") or {}).get("admission") or {}).get("clusterQueue") == name
                or (
                    not (w.get("status") or {}).get("admission")
                    and (lqs.get((w["metadata"]["namespace"], w["spec"].get("queueName", ""))) or {})
                    .get("spec", {})
                    .get("clusterQueue")
                    == name
                )
            ]
            self._counts("clusterqueues", cq, mine)

    def _counts(self, plural: str, queue: Obj, workloads: list[Obj]) -> None:
        counts = {
            "pendingWorkloads": sum(1 for w in workloads if not is_true(w, "QuotaReserved")),
            "reservingWorkloads": sum(1 for w in workloads if is_true(w, "QuotaReserved")),
            "admittedWorkloads": sum(1 for w in workloads if is_true(w, "Admitted")),
        }
        if all((queue.get("status") or {}).get(k) == v for k, v in counts.items()):
            return
        meta = queue["metadata"]
        try:
            if plural == "localqueues":
                self.client.custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, meta["namespace"], plural, meta["name"], {"status": counts}
                )
            else:
                self.client.custom.patch_cluster_custom_object_status(
                    GROUP, VERSION, plural, meta["name"], {"status": counts}
                )
        except self.client.ApiException as e:
            if e.status != 404:
                raise
