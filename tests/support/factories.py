"""Factories for TrainingSweep manifests: a valid base and dotted-path changes (`spec.tune.mode`)."""

from __future__ import annotations

import copy
from typing import Any

DELETE = object()  # a change value that removes the field


def gpu_sweep(name: str = "digits", namespace: str = "ml") -> dict[str, Any]:
    """A valid GPU sweep like DESIGN's example (g5.2xlarge, 2 workers x 2 concurrent trials)."""
    return {
        "apiVersion": "sweeps.dev/v1alpha1",
        "kind": "TrainingSweep",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "image": "registry.example/train:1",
            "rayVersion": "2.58.0",
            "trainLoop": "training_entrypoints.loops.digits_mlp:train_loop",
            "paramSpace": {"lr": {"loguniform": [1.0e-4, 1.0e-1]}, "hidden": {"choice": [64, 128]}, "epochs": 6},
            "tune": {
                "metric": "val_loss",
                "mode": "min",
                "numSamples": 8,
                "maxConcurrentTrials": 2,
                "searcher": {"type": "random"},
                "scheduler": {"type": "asha", "maxT": 6, "gracePeriod": 2},
            },
            "trial": {"workers": 2, "resourcesPerWorker": {"cpu": 4, "gpu": 1, "memory": "24Gi"}},
            "workerGroup": {"instanceType": "g5.2xlarge", "nodeSelector": {}, "tolerations": [], "minReplicas": 0},
            "head": {"cpu": "2", "memory": "8Gi"},
            "storage": {"uri": "s3://bucket/sweeps", "region": "us-west-2", "serviceAccountName": "sweep-runner"},
            "checkpoints": {"numToKeep": 2, "scoreAttribute": "val_loss", "scoreOrder": "min"},
            "deadlines": {"activeSeconds": 21600, "startupSeconds": 1800, "gracefulStopSeconds": 300},
            "failurePolicy": {
                "workerFailures": 1,
                "controllerFailures": 3,
                "preemptionFailures": 5,
                "trialFailures": 0,
                "jobRetries": 0,
            },
            "deletion": {"verifyCheckpoints": True, "verificationTimeoutSeconds": 900},
            "suspend": False,
        },
    }


def cpu_sweep(name: str = "digits-cpu", namespace: str = "default") -> dict[str, Any]:
    """A valid CPU-only sweep (no instance type, gpu 0)."""
    return changed(
        gpu_sweep(name, namespace),
        {
            "spec.trial.resourcesPerWorker": {"cpu": "1", "gpu": 0, "memory": "1Gi"},
            "spec.workerGroup.instanceType": DELETE,
            "spec.tune.scheduler": {"type": "fifo"},
        },
    )


def changed(doc: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of `doc` with each dotted path set to its value (DELETE removes it)."""
    doc = copy.deepcopy(doc)
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = doc
        for part in parents:
            node = node.setdefault(part, {})
        if value is DELETE:
            node.pop(leaf, None)
        else:
            node[leaf] = copy.deepcopy(value)
    return doc
