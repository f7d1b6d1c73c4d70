"""The Kueue objects a platform team creates (docs/kueue.md shows the same): a ResourceFlavor, a ClusterQueue with
one flavor, a LocalQueue, a WorkloadPriorityClass."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .crds import API_VERSION, Obj


def resource_flavor(name: str = "default-flavor", node_labels: Mapping[str, str] | None = None) -> Obj:
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": {"nodeLabels": dict(node_labels)} if node_labels else {},
    }


def cluster_queue(
    name: str, quota: Mapping[str, Any], *, flavor: str = "default-flavor", strategy: str = "BestEffortFIFO"
) -> Obj:
    """One resource group covering `quota`'s resources, one flavor, nominalQuota as given."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "queueingStrategy": strategy,
            "resourceGroups": [
                {
                    "coveredResources": list(quota),
                    "flavors": [
                        {"name": flavor, "resources": [{"name": r, "nominalQuota": q} for r, q in quota.items()]}
                    ],
                }
            ],
        },
    }


def local_queue(namespace: str, name: str, cluster_queue_name: str) -> Obj:
    return {
        "apiVersion": API_VERSION,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue_name},
    }


def workload_priority_class(name: str, value: int, description: str = "") -> Obj:
    return {
        "apiVersion": API_VERSION,
        "kind": "WorkloadPriorityClass",
        "metadata": {"name": name},
        "value": value,
        "description": description,
    }
