"""A bare kopf operator: one RayJob per TrainingSweep and nothing else. A yardstick, not a product.

    .venv/bin/python bench/bare_kopf_operator.py --kubeconfig K     (bench/operator_scale.py --operator bare)

It is the least work any kopf-based operator can do for a sweep: kopf's watch of TrainingSweeps, one event
handler, and one create of a pre-rendered RayJob (same size as the real operator's) through the same
kubernetes client. No finalizer, no status, no Event, no RayJob or RayCluster watch, no validation, no
admission, no S3. kopf's scheduler gets the same adjustment as the real operator (kopf_tuning).

Run in place of `python -m sweep_operator` under the same benchmark (same emulator, same KubeRay stand-in,
same apply), it measures what kopf and the emulator cost on this machine before the operator does anything
of its own: the real operator's numbers are read against it.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "operator"))

import kopf
from kubernetes.client.exceptions import ApiException

from sweep_contracts import constants
from sweep_operator.kopf_tuning import tune_kopf
from sweep_operator.kube import KubeApi, api_client_from_environment

log = logging.getLogger("bare_kopf_operator")


def build_registry(kube: KubeApi, template: dict[str, Any]) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    created: set[tuple[str, str]] = set()
    lock = threading.Lock()

    @kopf.on.startup(registry=registry)
    def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.enabled = False
        settings.scanning.disabled = True
        settings.execution.max_workers = 16

    kopf.on.login(registry=registry)(kopf.login_with_kubeconfig)  # $KUBECONFIG, set in main()

    @kopf.on.event(constants.GROUP, constants.VERSION, constants.PLURAL, registry=registry)
    def sweep_event(type: str, body: kopf.Body, **_: Any) -> None:
        if type == "DELETED":
            return
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        with lock:
            if (namespace, name) in created:
                return
            created.add((namespace, name))
        rayjob = copy.deepcopy(template)
        meta = rayjob["metadata"]
        meta.update(name=f"{name}-bare", namespace=namespace)
        meta["labels"][constants.LABEL_SWEEP] = name
        try:
            kube.create_rayjob(rayjob)
        except ApiException:
            with lock:
                created.discard((namespace, name))
            raise

    return registry


def rayjob_template() -> dict[str, Any]:
    sys.path.insert(0, str(REPO / "bench"))
    from operator_scale import rayjob_like  # the floor's RayJob: the real operator's rendering, same size

    rayjob = rayjob_like("template")
    rayjob["metadata"].pop("finalizers", None)
    return rayjob


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
