"""The guard against a tenant who edits what the operator trusts (issue 25), through the whole operator on loopback:
kopf, the KubeRay stand-in, the API emulator, moto S3 and the real verifier."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from sweep_contracts import constants
from sweep_sandbox.kuberay import Outcome
from tests.support.operator_env import TIMEOUT, OperatorEnv, start_operator_env
from tests.support.sweep_factory import write_sweep
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

# What kopf 1.45's AnnotationsProgressStorage(prefix="sweeps.dev") wrote for the guard's on.delete handlers of the
# previous operator (kopf/_cogs/configs/progress.py: `<prefix>/<handler id>`, id made key-safe): a "done" record.
FORGED_KEYS = {
    constants.RAYJOB_PLURAL: f"{constants.GROUP}/build_registry._locals_.rayjob_deleted",
    constants.RAYCLUSTER_PLURAL: f"{constants.GROUP}/build_registry._locals_.raycluster_deleted",
}
FORGED_RECORDS = {
    "success": {"started": "2026-12-01T00:00:00.000000+00:00", "purpose": "delete", "retries": 1, "success": True},
    "failure": {"started": "2026-12-01T00:00:00.000000+00:00", "purpose": "delete", "retries": 9, "failure": True},
}


@pytest.fixture(scope="module")
def env(s3_server: Any) -> Iterator[OperatorEnv]:
    environment, stop = start_operator_env(s3_server)
    try:
        yield environment
    finally:
        stop()


def _problem_kinds(env: OperatorEnv, name: str) -> set[str]:
    problems = (env.status(name).get("checkpoints") or {}).get("problems") or []
    return {p.get("kind", "") for p in problems if isinstance(p, dict)}


@pytest.mark.parametrize("record", sorted(FORGED_RECORDS))
def test_forged_handler_progress_never_releases_an_unverified_rayjob_or_cluster(env: OperatorEnv, record: str) -> None:
    """Issue 25, defect 1 (R22): a tenant deletes a guarded RayJob and RayCluster with a checkpoint file missing,
    and while they are held writes kopf's progress record for the guard's deletion handler on each ("done", or
    "failed for good", which kopf also ends by removing the finalizer). Both stay held: verification ran again on
    each and saw the missing file; once the file is back, both are released by verification."""
    doc = env.new_sweep(f"forge-{record}")
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.hang())
    env.apply(doc)
    bucket, prefix = env.run_root(name)
    synthetic = write_sweep(env.s3_client, bucket, prefix, trials=1, checkpoints=1, files=1)
    status = env.wait_phase(name, "Running")
    rayjob, cluster = status["rayJobName"], status["rayClusterName"]

    def finalizers(plural: str, obj: str) -> list[str]:
        return ((env.get(plural, obj) or {}).get("metadata") or {}).get("finalizers") or []

    wait_for(
        lambda: constants.FINALIZER in finalizers(constants.RAYCLUSTER_PLURAL, cluster), TIMEOUT, what="cluster guarded"
    )
    missing = synthetic.delete_file()
    env.delete_ray(constants.RAYCLUSTER_PLURAL, cluster)
    env.delete_ray(constants.RAYJOB_PLURAL, rayjob)

    def holds(obj: str) -> int:
        return sum(r == "CheckpointsNotVerified" for r in env.event_reasons(obj))

    for obj in (rayjob, cluster):
        wait_for(lambda o=obj: holds(o) >= 1, TIMEOUT, what=f"{obj} held")
    # While held, the tenant writes the record kopf would have read as the deletion handler's outcome (kopf purges
    # such records from an object it is not deleting, so the forgery lands on a held one).
    before = {obj: holds(obj) for obj in (rayjob, cluster)}
    for plural, obj in ((constants.RAYJOB_PLURAL, rayjob), (constants.RAYCLUSTER_PLURAL, cluster)):
        forged = {"metadata": {"annotations": {FORGED_KEYS[plural]: json.dumps(FORGED_RECORDS[record])}}}
        env.custom.patch_namespaced_custom_object(
            constants.RAY_GROUP, constants.RAY_VERSION_API, "default", plural, obj, forged
        )
    for obj in (rayjob, cluster):
        wait_for(
            lambda o=obj: (
                env.get(constants.RAYJOB_PLURAL if o == rayjob else constants.RAYCLUSTER_PLURAL, o) is None
                or holds(o) >= before[o] + 1
            ),
            TIMEOUT,
            what=f"{obj} verified again after the forgery",
        )
    # What verification saw: the file the tenant's forgery would have released without.
    assert "missing-file" in _problem_kinds(env, name), env.status(name).get("checkpoints")
    held = [e for e in env.events(rayjob) if e.reason == "CheckpointsNotVerified"]
    assert held and all("missing" in e.message for e in held), [e.message for e in held]
    for plural, obj in ((constants.RAYJOB_PLURAL, rayjob), (constants.RAYCLUSTER_PLURAL, cluster)):
        assert constants.FINALIZER in finalizers(plural, obj), f"{obj} was released unverified ({missing} missing)"
    write_sweep(env.s3_client, bucket, prefix, trials=1, checkpoints=1, files=1)
    wait_for(
        lambda: (
            env.get(constants.RAYJOB_PLURAL, rayjob) is None and env.get(constants.RAYCLUSTER_PLURAL, cluster) is None
        ),
        TIMEOUT,
        what="released after verification",
    )
    # kopf posts the Events on its own queue: the objects can be seen gone first
    wait_for(lambda: "CheckpointGuardReleased" in env.event_reasons(rayjob), TIMEOUT, what="the RayJob's release Event")
    wait_for(
        lambda: "CheckpointGuardReleased" in env.event_reasons(cluster), TIMEOUT, what="the cluster's release Event"
    )
