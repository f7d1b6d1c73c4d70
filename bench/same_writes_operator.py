"""A same-writes kopf operator: per TrainingSweep exactly the requests the operator's promises need, in the same
order, and nothing else. A yardstick, not a product.

    .venv/bin/python bench/same_writes_operator.py --kubeconfig K     (bench/operator_scale.py --operator same-writes)

Written the simplest way: kopf's watches of TrainingSweeps, RayJobs and RayClusters (the operator's three), one
synchronous event handler each in kopf's thread pool, the operator's own client (`KubeApi`) and kopf settings
(`kopf_tuning`, the handler threads, no scans, Events from WARNING up). No decisions, caches, queues, validation,
S3 or guard logic. Per sweep, in the operator's order (docs/benchmarks.md lists each with the promise it serves):

1. the guard's finalizer on the sweep, before anything exists that it guards;
2. the RayJob, created with the guard's finalizer in its body (a pre-rendered RayJob of the operator's size);
3. the admission's status write (phase, run id, deadline, the guard's record), which the guard reads later;
4. the Starting Event;
5. the guard's finalizer on the RayCluster KubeRay creates;
6. each change of the RayJob's deployment status mirrored into the sweep's status.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "operator"))

import kopf
from kubernetes.client.exceptions import ApiException

from sweep_contracts import constants
from sweep_operator.handlers import EVENT_COMPONENT, MAX_HANDLER_THREADS
from sweep_operator.kopf_tuning import tune_kopf
from sweep_operator.kube import KubeApi, api_client_from_environment

log = logging.getLogger("same_writes_operator")
# The run objects of ours carry the sweep's label (the operator's `ours` filter reads the same label).
OURS = {constants.LABEL_SWEEP: kopf.PRESENT}


def admission_status(name: str, run_id: str, rayjob: str, now: str) -> dict[str, Any]:
    """A status of the size and shape the operator's admission writes: what the guard and the columns read."""
    return {
        "phase": "Starting",
        "runId": run_id,
        "rayJobName": rayjob,
        "startedAt": now,
        "deadlineAt": now,
        "activeDeadlineAt": now,
        "observedGeneration": 1,
        "guard": {
            "runRoot": f"s3://bench-operator-scale/sweeps/bench/{name}-{run_id}",
            "endpointUrl": "http://127.0.0.1:1",
            "region": "us-east-1",
            "level": "committed",
            "timeoutSeconds": 600,
        },
        "replicas": {"cap": 2, "requested": 2},
        "conditions": [
            {
                "type": "Admitted",
                "status": "True",
                "reason": "Admitted",
                "message": "within the namespace's and the sweep's caps",
                "lastTransitionTime": now,
            }
        ],
    }


def build_registry(kube: KubeApi, template: dict[str, Any]) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    admitted: set[tuple[str, str]] = set()
    mirrored: dict[tuple[str, str], str] = {}
    lock = threading.Lock()
    instance = os.uname().nodename

    @kopf.on.startup(registry=registry)
    def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.level = logging.WARNING
        settings.scanning.disabled = True
        settings.execution.max_workers = MAX_HANDLER_THREADS
        settings.watching.server_timeout = 300
        settings.networking.request_timeout = 60

    kopf.on.login(registry=registry)(kopf.login_with_kubeconfig)  # $KUBECONFIG, set in main()

    @kopf.on.event(constants.GROUP, constants.VERSION, constants.PLURAL, registry=registry)
    def sweep_event(type: str, body: kopf.Body, **_: Any) -> None:
        if type == "DELETED":
            return
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        with lock:
            if (namespace, name) in admitted:
                return
            admitted.add((namespace, name))
        try:
            sweep = kube.add_finalizer(dict(copy.deepcopy(body)))  # 1
            if sweep is None:
                return
            run_id = f"{int(time.time() * 1000) % 10**8:08d}"
            rayjob = copy.deepcopy(template)
            meta = rayjob["metadata"]
            meta.update(name=f"{name}-{run_id}", namespace=namespace)
            meta["labels"][constants.LABEL_SWEEP] = name
            kube.create_rayjob(rayjob)  # 2
        except ApiException:  # nothing created: the sweep's next event tries again
            with lock:
                admitted.discard((namespace, name))
            raise
        # Once the RayJob exists the sweep is admitted whatever follows: a failed status write or Event is logged by
        # kopf, never a second RayJob.
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        kube.patch_sweep_status(namespace, name, admission_status(name, run_id, meta["name"], now))  # 3
        kube.post_event(  # 4
            sweep,
            "Normal",
            "Starting",
            f"RayJob {meta['name']} created",
            component=EVENT_COMPONENT,
            instance=instance,
        )

    @kopf.on.event(
        constants.RAY_GROUP, constants.RAY_VERSION_API, constants.RAYCLUSTER_PLURAL, labels=OURS, registry=registry
    )
    def raycluster_event(type: str, body: kopf.Body, **_: Any) -> None:
        if type != "DELETED" and constants.FINALIZER not in (body["metadata"].get("finalizers") or []):
            kube.add_finalizer(dict(copy.deepcopy(body)))  # 5

    @kopf.on.event(
        constants.RAY_GROUP, constants.RAY_VERSION_API, constants.RAYJOB_PLURAL, labels=OURS, registry=registry
    )
    def rayjob_event(type: str, body: kopf.Body, **_: Any) -> None:
        status = body.get("status") or {}
        deployment = str(status.get("jobDeploymentStatus") or "")
        if type == "DELETED" or not deployment:
            return
        meta = body["metadata"]
        key = (meta["namespace"], meta["labels"][constants.LABEL_SWEEP])
        with lock:
            if mirrored.get(key) == deployment:
                return
            mirrored[key] = deployment
        kube.patch_sweep_status(  # 6
            key[0],
            key[1],
            {"jobDeploymentStatus": deployment, "jobStatus": status.get("jobStatus"), "phase": "Running"},
        )

    return registry


def rayjob_template() -> dict[str, Any]:
    sys.path.insert(0, str(REPO / "bench"))
    from operator_scale import rayjob_like  # the floor's RayJob: the real operator's rendering, same size

    return rayjob_like("template")  # with the guard's finalizer, as the operator creates it


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    kube = KubeApi(api_client_from_environment(args.kubeconfig))
    registry = build_registry(kube, rayjob_template())
    os.environ["KUBECONFIG"] = args.kubeconfig
    tune_kopf()
    asyncio.run(kopf.operator(registry=registry, standalone=True, clusterwide=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
