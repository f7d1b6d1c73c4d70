"""The operator end to end on loopback: kmock Kubernetes API emulator, KubeRay stand-in, moto S3, kopf in-process.

Covers the lifecycle to Succeeded, the checkpoint guard matrix (R22), queueing (R21), the startup deadline
diagnosis (R6, R20), restart without duplicates, injected API errors, drift, spec changes and kubectl.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweep_contracts import constants, runtime_env
from sweep_operator.rendering import build_rayjob
from sweep_operator.settings import OperatorLimits
from sweep_operator.validation import parse_sweep
from sweep_sandbox.kuberay import Outcome, PendingReason
from tests.support.operator_env import TIMEOUT, OperatorEnv, start_operator_env
from tests.support.s3_fault_server import FaultyS3Server
from tests.support.sweep_factory import write_sweep
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def faulty_s3() -> Iterator[FaultyS3Server]:
    with FaultyS3Server(503, "SlowDown", "S3 is down (injected)") as server:
        yield server


@pytest.fixture(scope="module")
def env(s3_server: Any, faulty_s3: FaultyS3Server) -> Iterator[OperatorEnv]:
    from sweep_operator.s3 import S3ClientConfig, make_s3_client

    failing = make_s3_client(S3ClientConfig(endpoint_url=faulty_s3.endpoint_url, region="us-east-1", max_attempts=1))
    environment, stop = start_operator_env(
        s3_server,
        limits=OperatorLimits(max_gpus_per_namespace=4),
        failing_s3=lambda endpoint, region: failing,
    )
    try:
        yield environment
    finally:
        stop()


# --------------------------------------------------------------------------------------------- lifecycle


def test_apply_creates_the_rendered_rayjob_and_progresses_to_succeeded(env: OperatorEnv) -> None:
    doc = env.new_sweep("life")
    name = doc["metadata"]["name"]
    # Long enough that the run's data is in S3 before the job ends, even on 2 busy cores.
    env.runner.script(name, Outcome.succeed(6.0, startup=0.5))
    created = env.apply(doc)
    bucket, prefix = env.run_root(name)
    write_sweep(env.s3_client, bucket, prefix, trials=2, checkpoints=2, files=2)
    status = env.wait_phase(name, "Succeeded")
    status = env.wait_status(name, lambda s: (s.get("checkpoints") or {}).get("verifiedAt"), "verification recorded")

    (rayjob,) = env.rayjobs(name)
    expected = build_rayjob(
        parse_sweep(created, env.settings.limits), status["runId"], env.operator.controller.render_context
    )
    assert rayjob["metadata"]["name"] == expected["metadata"]["name"] == status["rayJobName"]
    assert rayjob["metadata"]["labels"][constants.LABEL_SWEEP] == name
    assert rayjob["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
    assert constants.FINALIZER in rayjob["metadata"]["finalizers"]
    for key in (
        "entrypoint",
        "shutdownAfterJobFinishes",
        "activeDeadlineSeconds",
        "preRunningDeadlineSeconds",
        "backoffLimit",
        "rayClusterSpec",
    ):
        # The API server adds the CRD's defaults (numOfHosts, container port protocols): what was rendered must
        # all be there, unchanged.
        assert_rendered_within(expected["spec"][key], rayjob["spec"][key], f"spec.{key}")
    assert (
        rayjob["metadata"]["annotations"][constants.ANNOTATION_GUARD]
        == expected["metadata"]["annotations"][constants.ANNOTATION_GUARD]
    )
    env_vars = runtime_env.env_vars_of(rayjob)
    assert int(env_vars[constants.ENV_DEADLINE_AT]) > time.time()

    phases = [
        ((s.get("status") or {}).get("phase"))
        for s in env.server.history(constants.GROUP, constants.VERSION, constants.PLURAL, "default", name)
    ]
    seen = [p for i, p in enumerate(phases) if p and (i == 0 or p != phases[i - 1])]
    assert seen[0] == "Starting" and "Running" in seen and seen[-1] == "Succeeded", seen

    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Admitted"]["status"] == "True"
    assert conditions["CheckpointsVerified"]["status"] == "True"
    assert conditions["Ready"]["status"] == "True"
    assert all(c["lastTransitionTime"] and c["observedGeneration"] == 1 for c in status["conditions"])
    assert status["checkpoints"]["verified"] is True and status["checkpoints"]["checked"] == 4
    assert status["bestTrial"]["checkpointUri"].startswith(f"s3://{bucket}/{prefix}/train/")
    assert (
        status["trialsSummary"] and status["deadlineAt"] and status["rayClusterName"].startswith(status["rayJobName"])
    )
    wait_for(
        lambda: {"Starting", "Running", "Succeeded"} <= set(env.event_reasons(name)),
        TIMEOUT,
        what="an Event per transition",
    )
    assert not env.pruned(), f"writes whose fields a real API server would drop: {env.pruned()[:10]}"


def assert_rendered_within(rendered: Any, stored: Any, path: str) -> None:
    """Every field rendered is stored with the same value (the server may only add defaults)."""
    if isinstance(rendered, dict):
        assert isinstance(stored, dict), path
        for key, value in rendered.items():
            assert key in stored, f"{path}.{key} pruned by the API server"
            assert_rendered_within(value, stored[key], f"{path}.{key}")
    elif isinstance(rendered, list):
        assert isinstance(stored, list) and len(stored) == len(rendered), path
        for i, (a, b) in enumerate(zip(rendered, stored, strict=False)):
            assert_rendered_within(a, b, f"{path}[{i}]")
    else:
        assert rendered == stored, f"{path}: rendered {rendered!r}, stored {stored!r}"


# ------------------------------------------------------------------------------------------ guard
# The guard's fault matrix (every deletion path x every S3 state) is tests/integration/test_guard_matrix.py.


def test_escape_hatch_releases_with_an_audit_event(env: OperatorEnv) -> None:
    doc = env.new_sweep("esc")
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.hang())
    env.apply(doc)
    bucket, prefix = env.run_root(name)
    synthetic = write_sweep(env.s3_client, bucket, prefix, trials=1, checkpoints=2, files=2)
    rayjob = env.wait_phase(name, "Running")["rayJobName"]
    missing = synthetic.delete_file()
    env.delete_sweep(name)
    env.wait_status(
        name,
        lambda s: any(c["type"] == "CheckpointsVerified" and c["status"] == "False" for c in s.get("conditions") or []),
        "held",
    )
    env.annotate_sweep(name, {constants.ANNOTATION_SKIP_VERIFICATION: "true"})
    wait_for(lambda: env.sweep(name) is None, TIMEOUT, what="released by the escape hatch")
    wait_for(
        lambda: [e for e in env.events(name) if e.reason == "CheckpointGuardBypassed"], TIMEOUT, what="audit Event"
    )
    audits = [e for e in env.events(name) if e.reason == "CheckpointGuardBypassed"]
    assert audits and audits[0].type == "Warning" and "WITHOUT checkpoint verification" in audits[0].message
    wait_for(
        lambda: env.get(constants.RAYJOB_PLURAL, rayjob) is None,
        TIMEOUT,
        what="RayJob released too (the hatch covers it)",
    )
    assert missing


def test_a_namespace_deleted_under_a_running_sweep_is_released_only_after_its_checkpoints_verify(
    env: OperatorEnv,
) -> None:
    """`kubectl delete namespace` with a sweep running: the namespace controller deletes the sweep, its RayJob and
    RayCluster at once, and the API server refuses every create there from then on (NamespaceLifecycle), Events
    included. The guard holds the namespace Terminating while a checkpoint is missing, says why in the sweep's
    status (an update, which the namespace still takes), and releases everything once the run verifies."""
    import kubernetes.client

    ns = f"doomed-{int(time.time() * 1000) % 10**8}"
    doc = env.new_sweep("nsdel", namespace=ns)
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.hang())
    env.apply(doc)
    bucket, prefix = env.run_root(name, ns)
    synthetic = write_sweep(env.s3_client, bucket, prefix, trials=1, checkpoints=2, files=2)
    rayjob = env.wait_phase(name, "Running", namespace=ns)["rayJobName"]
    content = env.s3_client.get_object(Bucket=bucket, Key=synthetic.file_key())["Body"].read()
    missing = synthetic.delete_file()
    with env.verifications() as seen:
        env.core.delete_namespace(ns)
        held = env.wait_status(
            name,
            lambda s: any(
                c["type"] == "CheckpointsVerified" and c["status"] == "False" for c in s.get("conditions") or []
            ),
            "held, and why",
            ns,
        )
        reason = next(c for c in held["conditions"] if c["type"] == "CheckpointsVerified")["message"]
        assert missing.rsplit("/", 1)[-1] in reason or "missing" in reason, reason
        assert env.core.read_namespace(ns).metadata.deletion_timestamp is not None  # Terminating, held by the guard
        assert env.get(constants.RAYJOB_PLURAL, rayjob, ns) is not None
        assert seen and not any(verified for _, verified, _ in seen)
        with pytest.raises(kubernetes.client.ApiException) as refused:  # the namespace takes nothing new
            env.core.create_namespaced_event(ns, {"metadata": {"generateName": "x."}, "involvedObject": {"name": name}})
        assert refused.value.status == 403
        env.s3_client.put_object(Bucket=bucket, Key=missing, Body=content)  # the upload lands after all
        wait_for(lambda: env.namespace_gone(ns), TIMEOUT, what="the namespace released once the run verifies")
    assert any(verified and checked == synthetic.committed_count for _, verified, checked in seen), seen


# ------------------------------------------------------------------------------ queueing and deadlines


def test_namespace_budget_admits_fifo_as_capacity_frees(env: OperatorEnv) -> None:
    """R21: maxGpusPerNamespace=4; each sweep needs 2 GPUs (2 workers x 1 GPU): two run, the rest queue FIFO."""
    ns = "queue-ns"
    names = []
    for i in range(4):
        doc = env.new_sweep(f"q{i}", namespace=ns, gpu=True, spec__tune__maxConcurrentTrials=1)
        names.append(doc["metadata"]["name"])
        # q0 finishes after a while; the others run until deleted.
        env.runner.script(doc["metadata"]["name"], Outcome.succeed(6.0) if i == 0 else Outcome.hang())
        env.apply(doc)
        time.sleep(1.1)  # distinct creationTimestamps (second resolution)
    env.wait_phase(names[0], "Running", "Starting", namespace=ns)
    env.wait_phase(names[1], "Running", "Starting", namespace=ns)
    for queued in names[2:]:
        status = env.wait_phase(queued, "Queued", namespace=ns)
        assert "maxGpusPerNamespace 4" in status["message"] or "waiting behind" in status["message"]
        assert not env.rayjobs(queued, ns)
    # The first sweep ends: its budget is released and the oldest queued one (q2) is admitted; q3 still waits.
    env.wait_phase(names[0], "Succeeded", namespace=ns)
    env.wait_phase(names[2], "Starting", "Running", namespace=ns)
    # q3 was queued behind q2; once q2 is admitted its reason must become the budget itself (a state change to
    # wait for, not a sleep), and it stays Queued: q1 and q2 hold all 4 GPUs.
    status = env.wait_status(
        names[3], lambda s: "waiting behind" not in (s.get("message") or ""), "re-queued on the budget", ns
    )
    assert status["phase"] == "Queued" and not env.rayjobs(names[3], ns)
    for name in names:
        env.annotate_sweep(name, {constants.ANNOTATION_SKIP_VERIFICATION: "true"}, ns)
        env.delete_sweep(name, ns)
    wait_for(lambda: all(env.sweep(n, ns) is None for n in names), TIMEOUT, what="cleanup")


def test_a_burst_of_sweeps_with_writes_from_others_gets_one_rayjob_each(env: OperatorEnv) -> None:
    """Many sweeps applied at once, and labels written by someone else while they are admitted. The work queue,
    the sweep cache and the conditional status writes must still give each sweep exactly one RayJob and a status
    that follows it: no write computed from a stale copy lands, and a refused one is redone."""
    ns = "burst-ns"
    names = []
    for i in range(30):
        doc = env.new_sweep(f"b{i:02d}", namespace=ns)
        names.append(doc["metadata"]["name"])
        env.runner.script(doc["metadata"]["name"], Outcome.hang())
        env.apply(doc)
    for name in names[::3]:  # foreign writes racing the operator's own (each makes its cached copy stale)
        env.custom.patch_namespaced_custom_object(
            constants.GROUP, constants.VERSION, ns, constants.PLURAL, name, {"metadata": {"labels": {"team": "burst"}}}
        )
    for name in names:
        status = env.wait_phase(name, "Running", namespace=ns)
        (rayjob,) = env.rayjobs(name, ns)  # exactly one, never two
        assert status["rayJobName"] == rayjob["metadata"]["name"]
        assert status["runId"] == rayjob["metadata"]["labels"][constants.LABEL_RUN_ID]
        assert status["rayClusterName"] and status["jobDeploymentStatus"] == "Running"
        assert env.event_reasons(name, ns).count("Starting") == 1  # one admission, one Event
    for name in names[::3]:
        assert env.sweep(name, ns)["metadata"]["labels"]["team"] == "burst"  # nothing of theirs was lost
    for name in names:
        env.annotate_sweep(name, {constants.ANNOTATION_SKIP_VERIFICATION: "true"}, ns)
        env.delete_sweep(name, ns)
    wait_for(lambda: all(env.sweep(n, ns) is None for n in names), TIMEOUT, what="cleanup")


def test_startup_deadline_fails_with_pending_pod_diagnosis(env: OperatorEnv) -> None:
    """R6, R20: GPUs never come; after startupSeconds the sweep is Failed and says why the pods are pending."""
    doc = env.new_sweep("stuck", gpu=True, spec__deadlines={"startupSeconds": 10}, spec__tune__maxConcurrentTrials=1)
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.pending(PendingReason.INSUFFICIENT_GPU))
    env.apply(doc)
    status = env.wait_phase(name, "Failed", timeout=45)
    assert "Insufficient nvidia.com/gpu" in status["message"], status["message"]
    assert "0/3 nodes are available" in status["message"]
    running = next(c for c in status["conditions"] if c["type"] == "Running")
    assert running["status"] == "False" and running["reason"] in ("StartupDeadlineExceeded", "StartupFailed")
    # Nothing was written: the guard still verifies, sees an empty run root and releases with an audit Event.
    env.delete_sweep(name)
    wait_for(lambda: env.sweep(name) is None, TIMEOUT, what="released (nothing to protect)")
    wait_for(
        lambda: any(
            e.reason == "CheckpointGuardBypassed" and "nothing to protect" in e.message for e in env.events(name)
        ),
        TIMEOUT,
        what="the audited release",
    )


# ----------------------------------------------------------------------------- restart and API errors


def test_operator_restart_mid_run_creates_no_duplicate_and_continues(env: OperatorEnv) -> None:
    doc = env.new_sweep("restart")
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.succeed(6.0, startup=0.3))
    env.operator.stop()
    try:
        env.apply(doc)
        env.operator = type(env.operator)(env.settings, env.server.url, s3_client_for=env.s3_switch)
        env.operator.start()
        bucket, prefix = env.run_root(name)
        write_sweep(env.s3_client, bucket, prefix, trials=1, checkpoints=1, files=1)
        env.wait_phase(name, "Running")
        env.operator.stop()
        time.sleep(1)
    finally:
        env.operator = type(env.operator)(env.settings, env.server.url, s3_client_for=env.s3_switch)
        env.operator.start()
    env.wait_phase(name, "Succeeded")
    assert len(env.rayjobs(name)) == 1
    creates = env.server.history(
        constants.RAY_GROUP,
        constants.RAY_VERSION_API,
        constants.RAYJOB_PLURAL,
        "default",
        env.status(name)["rayJobName"],
    )
    assert creates, "one RayJob, followed through the restart"


def test_injected_api_errors_are_retried_to_convergence(env: OperatorEnv) -> None:
    doc = env.new_sweep("flaky")
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.succeed(1.5))
    injector = env.server.emulator.errors
    injector.inject(500, times=3, verb="create", plural=constants.RAYJOB_PLURAL)
    injector.inject(409, times=3, verb="patch", plural=constants.PLURAL, subresource="status", name=name)
    injector.inject(500, times=2, verb="get", plural=constants.PLURAL, name=name)
    env.apply(doc)
    bucket, prefix = env.run_root(name)
    write_sweep(env.s3_client, bucket, prefix, trials=1, checkpoints=1, files=1)
    env.wait_phase(name, "Succeeded")
    assert len(env.rayjobs(name)) == 1
    assert not [r for r in injector.pending if r.name == name or r.plural == constants.RAYJOB_PLURAL]


def test_our_own_writes_echoes_stop_before_kopf_and_everything_else_reaches_it(
    env: OperatorEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kopf_tuning.tune_watch_router with the cache's predicate (Cache.watch_echo): the watch events of the
    operator's own writes (the sweep's status writes, its RayJob's create) are dropped before kopf's per-object
    processing; the tenant's create and edit and KubeRay's writes are not (the run objects' go to the operator's
    routes), and the sweep runs to the end."""
    assert env.operator.wiring is not None
    echoes, cache = env.operator.wiring.watch_router, env.operator.controller.cache
    judged: list[tuple[str, str, str, bool]] = []  # (plural, name, resourceVersion, dropped) as the filter decided
    written: set[tuple[str, str, str]] = set()  # what the operator's own writes answered
    judge, remember_write, remember_created = echoes.is_echo, cache.remember_write, cache.remember_created_rayjob

    def spy_judge(plural: str, obj: Any) -> bool:
        verdict = judge(plural, obj)
        judged.append((plural, obj["metadata"]["name"], obj["metadata"]["resourceVersion"], verdict))
        return verdict

    def spy_write(plural: str, remember: Any) -> Any:
        def spy(obj: Any) -> None:
            written.add((plural, obj["metadata"]["name"], obj["metadata"]["resourceVersion"]))
            remember(obj)

        return spy

    monkeypatch.setattr(echoes, "is_echo", spy_judge)
    monkeypatch.setattr(cache, "remember_write", spy_write(constants.PLURAL, remember_write))
    monkeypatch.setattr(cache, "remember_created_rayjob", spy_write(constants.RAYJOB_PLURAL, remember_created))
    dropped_before, routed_before = echoes.dropped.copy(), echoes.routed.copy()

    doc = env.new_sweep("echo")
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.succeed(4.0, startup=0.5))
    created = env.apply(doc)
    bucket, prefix = env.run_root(name)
    write_sweep(env.s3_client, bucket, prefix, trials=2, checkpoints=2, files=2)
    env.wait_phase(name, "Succeeded")  # KubeRay's transitions reached the operator
    (rayjob,) = env.rayjobs(name)
    first_rayjob = env.server.history(
        constants.RAY_GROUP, constants.RAY_VERSION_API, constants.RAYJOB_PLURAL, "default", rayjob["metadata"]["name"]
    )[0]
    created_rv = first_rayjob["metadata"]["resourceVersion"]
    # The create's ADDED event is an echo once the create's answer is remembered; one that reaches the stream first
    # (the answer still on its way to the reconcile thread) goes to the route, which finds nothing new in it.
    wait_for(
        lambda: any(j[:3] == (constants.RAYJOB_PLURAL, rayjob["metadata"]["name"], created_rv) for j in judged),
        TIMEOUT,
        what="the RayJob's ADDED event judged",
    )
    ours = {(p, n, rv) for p, n, rv, verdict in judged if verdict and n in (name, rayjob["metadata"]["name"])}
    assert ours and ours <= written, f"dropped events that are not our writes: {ours - written}"
    assert any(p == constants.PLURAL for p, _, _ in ours), "no status write's echo was dropped"
    # The tenant's create is never dropped (an ADDED event, or part of the listing when the watch starts after it).
    assert (constants.PLURAL, name, created["metadata"]["resourceVersion"], True) not in judged
    assert any(  # KubeRay's writes to the RayJob
        p == constants.RAYJOB_PLURAL and not verdict for p, n, _, verdict in judged if n == rayjob["metadata"]["name"]
    )
    assert echoes.dropped[constants.PLURAL] > dropped_before[constants.PLURAL]
    # KubeRay's writes to the RayJob and its RayCluster went to the operator's handlers without kopf's workers.
    assert echoes.routed[constants.RAYJOB_PLURAL] > routed_before[constants.RAYJOB_PLURAL]
    assert echoes.routed[constants.RAYCLUSTER_PLURAL] > routed_before[constants.RAYCLUSTER_PLURAL]

    # A tenant's edit after the fact reaches the operator, even one that writes the same status the operator did.
    edited = env.custom.patch_namespaced_custom_object(
        constants.GROUP, constants.VERSION, "default", constants.PLURAL, name, {"metadata": {"labels": {"team": "a"}}}
    )
    wait_for(
        lambda: (constants.PLURAL, name, edited["metadata"]["resourceVersion"], False) in judged,
        TIMEOUT,
        what="the tenant's edit reached kopf",
    )


def test_a_sweep_an_earlier_version_left_kopfs_timer_finalizer_on_is_left_to_kopf_which_takes_it_off(
    env: OperatorEnv,
) -> None:
    """handlers._has_kopf_finalizer: the router leaves such a sweep's events to kopf, whose processing removes the
    finalizer no handler needs (kopf's finalizers.py, `allow_removal`); from then on the route takes its events."""
    assert env.operator.wiring is not None
    router = env.operator.wiring.watch_router
    legacy = "sweeps.dev/kopf-timer"
    doc = env.new_sweep("legacy")
    doc["metadata"]["finalizers"] = [legacy]
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.succeed(3.0, startup=0.5))
    routed = router.routed[constants.PLURAL]
    env.apply(doc)
    bucket, prefix = env.run_root(name)
    write_sweep(env.s3_client, bucket, prefix, trials=2, checkpoints=2, files=2)
    wait_for(
        lambda: legacy not in ((env.sweep(name) or {}).get("metadata") or {}).get("finalizers", [legacy]),
        TIMEOUT,
        what="kopf took its old finalizer off",
    )
    env.wait_phase(name, "Succeeded")  # the run went on
    assert router.routed[constants.PLURAL] > routed  # kopf's removal came back through the route, at least
    assert constants.FINALIZER in (env.sweep(name) or {})["metadata"]["finalizers"]


# --------------------------------------------------------------------------------- drift and spec edits


def test_a_raised_active_deadline_is_set_back(env: OperatorEnv) -> None:
    """KubeRay's backstop for a run the operator fails to stop: spec.activeDeadlineSeconds raised by hand on the
    RayJob is set back to the rendered value (recorded in the protected bounds annotation), with an Event."""
    doc = env.new_sweep("deadline-drift")
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.hang())
    env.apply(doc)
    rayjob = env.wait_phase(name, "Running")["rayJobName"]
    rendered = env.get(constants.RAYJOB_PLURAL, rayjob)["spec"]["activeDeadlineSeconds"]
    env.patch_ray(constants.RAYJOB_PLURAL, rayjob, {"spec": {"activeDeadlineSeconds": 10_000_000}})
    wait_for(
        lambda: env.get(constants.RAYJOB_PLURAL, rayjob)["spec"]["activeDeadlineSeconds"] == rendered,
        TIMEOUT,
        what="activeDeadlineSeconds set back",
    )
    wait_for(lambda: "CapEnforced" in env.event_reasons(rayjob), TIMEOUT, what="CapEnforced Event on the RayJob")
    env.annotate_sweep(name, {constants.ANNOTATION_SKIP_VERIFICATION: "true"})
    env.delete_sweep(name)


def test_worker_group_edited_above_cap_is_set_back(env: OperatorEnv) -> None:
    """R21: maxReplicas raised by hand on the RayJob is set back to workers x maxConcurrentTrials, with an Event."""
    doc = env.new_sweep("drift")
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.hang())
    env.apply(doc)
    rayjob = env.wait_phase(name, "Running")["rayJobName"]
    cap = env.status(name)["replicas"]["cap"]
    body = env.get(constants.RAYJOB_PLURAL, rayjob)
    groups = body["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    groups[0]["maxReplicas"] = 64
    env.patch_ray(constants.RAYJOB_PLURAL, rayjob, {"spec": {"rayClusterSpec": {"workerGroupSpecs": groups}}})
    wait_for(
        lambda: (
            env.get(constants.RAYJOB_PLURAL, rayjob)["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["maxReplicas"]
            == cap
        ),
        TIMEOUT,
        what="maxReplicas set back",
    )
    wait_for(lambda: "CapEnforced" in env.event_reasons(rayjob), TIMEOUT, what="CapEnforced Event on the RayJob")
    wait_for(lambda: "CapEnforced" in env.event_reasons(name), TIMEOUT, what="CapEnforced Event on the sweep")
    env.annotate_sweep(name, {constants.ANNOTATION_SKIP_VERIFICATION: "true"})
    env.delete_sweep(name)


def test_gpus_added_in_an_init_container_are_set_back(env: OperatorEnv) -> None:
    """A worker template edited to add an initContainer asking for nvidia.com/gpu: 8 (Kubernetes sizes the pod by
    it: component-helpers/resource/helpers.go `PodRequests`) and the head given a native sidecar with 4 are set back
    to what was rendered, with an Event; the Ray containers are left as they were."""
    doc = env.new_sweep("drift-init")
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.hang())
    env.apply(doc)
    rayjob = env.wait_phase(name, "Running")["rayJobName"]
    cluster = env.get(constants.RAYJOB_PLURAL, rayjob)["spec"]["rayClusterSpec"]
    rendered_worker = cluster["workerGroupSpecs"][0]["template"]["spec"]["containers"]
    gpus = {constants.GPU_RESOURCE: 8}
    cluster["workerGroupSpecs"][0]["template"]["spec"]["initContainers"] = [
        {"name": "grab", "image": "busybox", "resources": {"limits": gpus, "requests": gpus}}
    ]
    sidecar = {"limits": {constants.GPU_RESOURCE: 4}, "requests": {constants.GPU_RESOURCE: 4}}
    cluster["headGroupSpec"]["template"]["spec"]["initContainers"] = [
        {"name": "beside", "image": "busybox", "restartPolicy": "Always", "resources": sidecar}
    ]
    env.patch_ray(constants.RAYJOB_PLURAL, rayjob, {"spec": {"rayClusterSpec": cluster}})

    def init_gpus() -> tuple[Any, Any]:
        spec = env.get(constants.RAYJOB_PLURAL, rayjob)["spec"]["rayClusterSpec"]
        worker = spec["workerGroupSpecs"][0]["template"]["spec"]["initContainers"][0]["resources"]["limits"]
        head = spec["headGroupSpec"]["template"]["spec"]["initContainers"][0]["resources"]["limits"]
        return worker[constants.GPU_RESOURCE], head[constants.GPU_RESOURCE]

    worker_gpus = cluster["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]["limits"]
    rendered = int(worker_gpus.get(constants.GPU_RESOURCE, 0))
    wait_for(lambda: init_gpus() == (rendered, 0), TIMEOUT, what="the init containers' GPUs set back")
    after = env.get(constants.RAYJOB_PLURAL, rayjob)["spec"]["rayClusterSpec"]
    assert after["workerGroupSpecs"][0]["template"]["spec"]["containers"] == rendered_worker
    wait_for(lambda: "CapEnforced" in env.event_reasons(rayjob), TIMEOUT, what="CapEnforced Event on the RayJob")
    env.annotate_sweep(name, {constants.ANNOTATION_SKIP_VERIFICATION: "true"})
    env.delete_sweep(name)


def test_spec_change_refused_while_running_and_suspend_honoured(env: OperatorEnv) -> None:
    doc = env.new_sweep("edit")
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.hang())
    env.apply(doc)
    rayjob = env.wait_phase(name, "Running")["rayJobName"]
    env.custom.patch_namespaced_custom_object(
        constants.GROUP, constants.VERSION, "default", constants.PLURAL, name, {"spec": {"tune": {"numSamples": 50}}}
    )
    status = env.wait_status(name, lambda s: "spec change refused" in (s.get("message") or ""), "refusal")
    assert "spec.tune" in status["message"]
    wait_for(lambda: "SpecChangeRefused" in env.event_reasons(name), TIMEOUT, what="SpecChangeRefused Event")
    env.custom.patch_namespaced_custom_object(
        constants.GROUP, constants.VERSION, "default", constants.PLURAL, name, {"spec": {"suspend": True}}
    )
    wait_for(
        lambda: env.get(constants.RAYJOB_PLURAL, rayjob)["spec"].get("suspend") is True,
        TIMEOUT,
        what="RayJob suspended",
    )
    env.wait_phase(name, "Suspended")
    env.annotate_sweep(name, {constants.ANNOTATION_SKIP_VERIFICATION: "true"})
    env.delete_sweep(name)


# ----------------------------------------------------------------------------------------------- kubectl


def test_kubectl_wait_returns_for_a_complete_sweep_and_for_a_failed_one(env: OperatorEnv, tmp_path: Path) -> None:
    """Scripts wait on conditions, as on a Job's: `kubectl wait --for=condition=Complete` returns when a sweep
    succeeds and `--for=condition=Failed` when one fails (before, Ready was the only condition to wait on, and it
    never turned True on a failed sweep, so the wait hung); each wait starts before its sweep ends."""
    namespace = "kubectl-wait"
    kubeconfig = env.server.write_kubeconfig(tmp_path / "kubeconfig", namespace=namespace)
    kubectl = str(Path(sys.executable).parent / "kubectl")
    run_env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    ok, bad = env.new_sweep("ok", namespace), env.new_sweep("bad", namespace)
    ok_name, bad_name = ok["metadata"]["name"], bad["metadata"]["name"]
    env.runner.script(ok_name, Outcome.succeed(2.0, startup=0.3))
    env.runner.script(bad_name, Outcome.fail(2.0, "Job entrypoint command failed with exit code 1", startup=0.3))
    env.apply(ok)
    env.apply(bad)
    waits = {
        name: subprocess.Popen(
            [kubectl, "wait", f"--for=condition={condition}", f"tsw/{name}", "--timeout=90s"],
            env=run_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, condition in ((ok_name, "Complete"), (bad_name, "Failed"))
    }
    bucket, prefix = env.run_root(ok_name, namespace)
    write_sweep(env.s3_client, bucket, prefix, trials=2, checkpoints=1, files=1)
    for name, wait in waits.items():
        out, err = wait.communicate(timeout=120)
        assert wait.returncode == 0, f"kubectl wait for {name}: {err}"
        assert out.strip() == f"trainingsweep.sweeps.dev/{name} condition met"

    def said(name: str) -> dict[str, tuple[str, str]]:
        return {c["type"]: (c["status"], c["reason"]) for c in env.status(name, namespace)["conditions"]}

    assert env.status(bad_name, namespace)["phase"] == "Failed"
    assert said(bad_name)["Complete"] == ("False", "Failed") and said(bad_name)["Ready"] == ("False", "Failed")
    failed = env.condition(bad_name, "Failed", namespace)
    assert failed is not None and "exit code 1" in failed["message"]
    assert said(ok_name)["Failed"] == ("False", "Succeeded")
    # Ready waits for the end-of-run verification, then says the checkpoints are verified.
    ready = subprocess.run(
        [kubectl, "wait", "--for=condition=Ready", f"tsw/{ok_name}", "--timeout=90s"],
        env=run_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ready.returncode == 0, ready.stderr
    assert env.status(ok_name, namespace)["checkpoints"]["verified"] is True


def test_kubectl_apply_and_get_printer_columns(env: OperatorEnv, tmp_path: Path) -> None:
    kubeconfig = env.server.write_kubeconfig(tmp_path / "kubeconfig")
    kubectl = str(Path(sys.executable).parent / "kubectl")
    run_env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    manifest = yaml.safe_load((REPO / "examples" / "review-scalar.yaml").read_text())
    manifest["metadata"]["name"] = "kubectl-scalar"
    manifest["spec"]["storage"]["uri"] = f"s3://{env.bucket}/sweeps"
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(manifest))
    env.runner.script("kubectl-scalar", Outcome.succeed(1.5))
    applied = subprocess.run(
        [kubectl, "apply", "-f", str(path)], env=run_env, capture_output=True, text=True, timeout=60
    )
    assert applied.returncode == 0, applied.stderr
    bucket, prefix = env.run_root("kubectl-scalar")
    write_sweep(env.s3_client, bucket, prefix, trials=2, checkpoints=1, files=1)
    env.wait_status("kubectl-scalar", lambda s: (s.get("checkpoints") or {}).get("verifiedAt"), "verified")
    from sweep_operator.crd import PRINTER_COLUMNS

    columns = ",".join(f"{c['name'].upper()}:{c['jsonPath']}" for c in PRINTER_COLUMNS)
    got = subprocess.run(
        [kubectl, "get", "tsw", "kubectl-scalar", "-o", f"custom-columns=NAME:.metadata.name,{columns}"],
        env=run_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert got.returncode == 0, got.stderr
    header, row = got.stdout.strip().splitlines()
    assert header.split()[:5] == ["NAME", "PHASE", "TRIALS", "BEST", "VERIFIED"]
    cells = row.split()
    # VERIFIED says how many checkpoints at which level: two trials' one checkpoint each, with our manifests
    assert cells[0] == "kubectl-scalar" and cells[1] == "Succeeded" and cells[4:6] == ["2", "full-state"], cells
    assert cells[2] != "<none>" and cells[3] == "val_loss=0.1", cells  # BEST names its metric
    # DEADLINE is empty once the run has ended; FINISHED says when it did (RayJob's END TIME)
    status = env.status("kubectl-scalar")
    assert cells[8] == "<none>" and cells[9] == status["finishedAt"] and status["deadlineAt"], cells
    shown = subprocess.run(
        [sys.executable, "-m", "sweep_operator.cli", "status", "kubectl-scalar", "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert "phase:       Succeeded" in shown.stdout and "checkpoints: verified (2 full-state)" in shown.stdout
    assert "CheckpointsVerified" in shown.stdout
    deleted = subprocess.run(
        [kubectl, "delete", "tsw", "kubectl-scalar", "--wait=true", "--timeout=60s"],
        env=run_env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert deleted.returncode == 0, deleted.stderr
    assert env.sweep("kubectl-scalar") is None
