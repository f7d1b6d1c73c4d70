"""A stand-in for Kueue (v1beta2 API) managing KubeRay RayJobs: Workloads, ClusterQueue quota, admission, eviction.

It models what the operator depends on: the RayJob integration and its webhook, the job reconciler
(ReconcileGenericJob), the scheduler without cohorts, eviction on demand as the preemptor writes it. Not modelled:
cohorts and borrowing, automatic priority-based preemption, admission checks, TAS, fair sharing, waitForPodsReady,
flavor node labels injected into pod templates, the Workload finalizer.
"""

from __future__ import annotations

from .crds import API_VERSION, GROUP, KUEUE_CRDS, PRIORITY_CLASS_LABEL, QUEUE_LABEL, VERSION
from .queues import cluster_queue, local_queue, resource_flavor, workload_priority_class
from .rayjob_integration import pod_sets_for, validate_rayjob_for_kueue, validate_rayjob_update, workload_name
from .standin import KueueStandIn

__all__ = [
    "API_VERSION",
    "GROUP",
    "KUEUE_CRDS",
    "PRIORITY_CLASS_LABEL",
    "QUEUE_LABEL",
    "VERSION",
    "KueueStandIn",
    "cluster_queue",
    "local_queue",
    "pod_sets_for",
    "resource_flavor",
    "validate_rayjob_for_kueue",
    "validate_rayjob_update",
    "workload_name",
    "workload_priority_class",
]
