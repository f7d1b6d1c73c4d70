"""The namespace's GPU-hour ledger through the operator (issue 27): emulator, KubeRay stand-in with emulated GPU pods,
moto and the operator with its 8 reconcile workers. Each namespace has its own tiny budget (GPU-seconds), so every
leak shows in seconds; every wait is for a state change, never a sleep."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest

from sweep_contracts import constants
from sweep_operator.gpu_time import HOUR
from sweep_sandbox.kuberay import Outcome
from sweep_sandbox.operator_thread import OperatorThread
from tests.support.operator_env import TIMEOUT, OperatorEnv, start_operator_env
from tests.support.sweep_factory import write_sweep
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

BURST, RECREATE, RESUME, EXHAUST = "ledger-burst", "ledger-recreate", "ledger-resume", "ledger-exhaust"
DOOMED, VANISHED = "ledger-doomed", "ledger-vanished"
BUDGETS = {BURST: 36, RECREATE: 36, RESUME: 72, EXHAUST: 36, DOOMED: 3600, VANISHED: 3600}  # GPU-seconds per window
WINDOW = 3600  # long enough that nothing leaves it during a test
ONE_GPU = {  # worst case 1 worker x 1 GPU x 1 trial x activeSeconds
    "spec__trial": {"workers": 1, "resourcesPerWorker": {"cpu": 1, "gpu": 1, "memory": "4Gi"}},
    "spec__tune__maxConcurrentTrials": 1,
    "spec__workerGroup__minReplicas": 1,
}


def deadlines(active: int, graceful: int = 0) -> dict[str, Any]:
    return {"spec__deadlines": {"activeSeconds": active, "startupSeconds": 20, "gracefulStopSeconds": graceful}}


@pytest.fixture(scope="module")
def env(s3_server: Any) -> Iterator[OperatorEnv]:
    environment, stop = start_operator_env(s3_server)
    environment.standin.emulate_pods = True
    settings = dataclasses.replace(
        environment.settings,
        usage_refresh_seconds=0.5,
        namespace_gpu_hour_budgets=tuple(f"{ns}={seconds / HOUR:.6f}" for ns, seconds in BUDGETS.items()),
        gpu_hours_window_seconds=WINDOW,
    )
    environment.settings = settings
    environment.operator.controller.settings = settings
    for namespace in BUDGETS:
        try:
            environment.core.create_namespace({"metadata": {"name": namespace}})
        except kubernetes.client.ApiException as exc:
            if exc.status != 409:
                raise
    try:
        yield environment
    finally:
        stop()


def ledger(env: OperatorEnv, namespace: str) -> dict[str, Any]:
    return env.custom.get_namespaced_custom_object(
        constants.GROUP, constants.VERSION, namespace, constants.LEDGER_PLURAL, constants.LEDGER_NAME
    )


def restart(env: OperatorEnv) -> None:
    """An operator restart: a new process's controller, with nothing in memory (its ledger copy, its locks)."""
    env.operator.stop()
    env.operator = OperatorThread(env.settings, env.server.url, s3_client_for=env.s3_switch)
    env.operator.start()


def queued_by_hours(status: dict[str, Any]) -> bool:
    return status.get("phase") == "Queued" and "namespace budget" in (status.get("message") or "")


def test_a_burst_of_eight_admits_exactly_the_one_that_fits_across_an_operator_restart(env: OperatorEnv) -> None:
    """8 sweeps of 30 GPU-seconds each, applied at once, against 36 GPU-seconds: the 8 reconcile workers admit in
    parallel and the operator restarts while they do; exactly one is admitted, 7 wait Queued saying why."""
    docs = [env.new_sweep("burst", namespace=BURST, gpu=True, **ONE_GPU, **deadlines(30)) for _ in range(8)]
    for doc in docs:
        env.runner.script(doc["metadata"]["name"], Outcome.hang(startup=0.3))
    for doc in docs:
        env.apply(doc)
    restart(env)
    names = [d["metadata"]["name"] for d in docs]

    def settled() -> list[dict[str, Any]]:
        statuses = [env.status(n, BURST) for n in names]
        done = all(s.get("runId") or queued_by_hours(s) for s in statuses)
        return statuses if done else []

    statuses = wait_for(settled, 60, 0.1, what="each of the 8 admitted or queued for GPU-hours")
    admitted = [n for n, s in zip(names, statuses, strict=True) if s.get("runId")]
    assert len(admitted) == 1, statuses
    rayjobs = env.custom.list_namespaced_custom_object(
        constants.RAY_GROUP, constants.RAY_VERSION_API, BURST, constants.RAYJOB_PLURAL
    )["items"]
    assert len(rayjobs) == 1
    stored = ledger(env, BURST)
    reserving = [s["name"] for s in stored["status"]["sweeps"] if s.get("reservation")]
    assert reserving == admitted
    assert stored["spec"] == {"gpuHours": pytest.approx(36 / HOUR, rel=1e-3), "windowSeconds": WINDOW}


def stopped_at_deadline(env: OperatorEnv, namespace: str, prefix: str, seconds: float, **changes: Any) -> str:
    """A GPU sweep that ran `seconds` and stopped at its deadline (result.json deadlineReached), verified."""
    doc = env.new_sweep(prefix, namespace=namespace, gpu=True, **ONE_GPU, **changes)
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.succeed(seconds, startup=0.3))
    env.apply(doc)
    bucket, root = env.run_root(name, namespace)
    write_sweep(env.s3_client, bucket, root, trials=1, checkpoints=1, files=1)
    key = f"{root}/_sweep/result.json"
    result = json.loads(env.s3_client.get_object(Bucket=bucket, Key=key)["Body"].read())
    env.s3_client.put_object(Bucket=bucket, Key=key, Body=json.dumps({**result, "deadlineReached": True}).encode())
    env.wait_status(
        name,
        lambda s: (
            s.get("phase") == "DeadlineExceeded"
            and (s.get("checkpoints") or {}).get("verifiedAt")
            and (s.get("usage") or {}).get("gpusHeld") == 0
        ),
        "ended, verified, its GPU pod gone",
        namespace,
    )
    return name


def test_deleting_a_sweep_and_recreating_it_does_not_give_its_hours_back(env: OperatorEnv) -> None:
    """A used about 14 of the namespace's 36 GPU-seconds; deleted, its hours stay in the ledger (deleted: true), so
    the same sweep re-created (30 GPU-seconds worst case) waits Queued."""
    name = stopped_at_deadline(env, RECREATE, "recreate", 12.0, **deadlines(30))
    doc = env.sweep(name, RECREATE)
    assert doc is not None
    used = doc["status"]["usage"]["gpuHours"]
    assert used * HOUR >= 8
    env.delete_sweep(name, RECREATE)
    wait_for(lambda: env.sweep(name, RECREATE) is None, 60, what="the sweep released by the guard")
    again = {k: v for k, v in doc.items() if k in ("apiVersion", "kind", "spec")}
    again["metadata"] = {"name": name, "namespace": RECREATE}
    env.apply(again)
    queued = env.wait_status(name, queued_by_hours, "the re-created sweep queued for GPU-hours", RECREATE)
    assert "budget frees up" in queued["message"] and not queued.get("runId")
    entries = ledger(env, RECREATE)["status"]["sweeps"]
    (gone,) = [s for s in entries if s.get("deleted")]
    assert gone["name"] == name and gone["uid"] == doc["metadata"]["uid"]
    assert gone["usedGpuHours"] == pytest.approx(used, abs=35 / HOUR)  # its open pod closed 30 s late at most
    # the metric is the ledger's figure, the deleted sweep's hours included
    metric = env.operator.controller.metrics.registry.get_sample_value(
        "trainingsweep_namespace_gpu_hours", {"namespace": RECREATE}
    )
    assert metric == pytest.approx(gone["usedGpuHours"], abs=2 / HOUR)


def test_a_namespace_deleted_under_a_sweep_its_budget_measures_is_released_once_the_run_verifies(
    env: OperatorEnv,
) -> None:
    """`kubectl delete namespace` with a GPU sweep running under a namespace GPU-hour budget: the namespace
    controller deletes the GPUHourLedger at once (nothing holds it), and the API server refuses every create there
    (NamespaceLifecycle: the ledger, the operator's Events). Nothing the release does may wait on those writes:
    once the run verifies, the guard lets everything go and the namespace is gone."""
    doc = env.new_sweep("doomed", namespace=DOOMED, gpu=True, **ONE_GPU, **deadlines(600))
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.hang())
    env.apply(doc)
    bucket, root = env.run_root(name, DOOMED)
    synthetic = write_sweep(env.s3_client, bucket, root, trials=1, checkpoints=1, files=1)
    env.wait_status(name, lambda s: (s.get("usage") or {}).get("gpusHeld") == 1, "measured on its GPU", DOOMED)
    assert ledger(env, DOOMED)["status"]["sweeps"]
    with env.verifications() as seen:
        env.core.delete_namespace(DOOMED)
        wait_for(lambda: env.namespace_gone(DOOMED), TIMEOUT, what="the namespace and everything in it released")
    assert seen and all(verified and checked == synthetic.committed_count for _, verified, checked in seen), seen


def test_a_resume_counts_its_own_past_hours_and_its_own_deadline(env: OperatorEnv) -> None:
    """The sweep used about 14 of the namespace's 72 GPU-seconds; a resume of 66 s on 1 GPU would fit only if its
    own hours were left out (or its first deadline of 30 s were used): it waits, saying why."""
    name = stopped_at_deadline(env, RESUME, "resume", 12.0, **deadlines(30))
    env.custom.patch_namespaced_custom_object(
        constants.GROUP,
        constants.VERSION,
        RESUME,
        constants.PLURAL,
        name,
        {"spec": {"resume": {"generation": 1, "activeSeconds": 66}}},
    )
    waiting = env.wait_status(
        name,
        lambda s: "waits for namespace capacity" in (s.get("message") or ""),
        "the resume waiting for the namespace's GPU-hours",
        RESUME,
    )
    assert "x 66s" in waiting["message"] and "namespace budget" in waiting["message"]
    assert len(env.rayjobs(name, RESUME)) <= 1  # no attempt 2


def test_run_until_exhausted_reserves_what_is_left_and_is_stopped_when_it_is_spent(env: OperatorEnv) -> None:
    """2 GPUs for up to 600 s (1,200 GPU-seconds) against 36: admitted reserving the 36, stopped before the
    namespace's use passes them (phase BudgetExhausted, checkpoints verified)."""
    doc = env.new_sweep(
        "exhaust",
        namespace=EXHAUST,
        gpu=True,
        **{**ONE_GPU, "spec__workerGroup__minReplicas": 2, "spec__trial": {**ONE_GPU["spec__trial"], "workers": 2}},
        **deadlines(600, graceful=4),
        spec__budget={"runUntilExhausted": True},
    )
    name = doc["metadata"]["name"]
    env.runner.script(name, Outcome.hang(startup=0.3))
    env.apply(doc)
    bucket, root = env.run_root(name, EXHAUST)
    write_sweep(env.s3_client, bucket, root, trials=1, checkpoints=1, files=1)
    stopped = env.wait_phase(name, "BudgetExhausted", namespace=EXHAUST, timeout=90)
    assert "namespace GPU budget" in stopped["message"]
    assert "the 0.01 GPU-hours of the namespace budget reserved at its admission" in stopped["message"]  # 36 s
    env.wait_status(
        name,
        lambda s: (s.get("checkpoints") or {}).get("verified") is True and (s.get("usage") or {}).get("gpusHeld") == 0,
        "verified, its pods gone",
        EXHAUST,
    )
    final = wait_for(
        lambda: (lambda s: s if not s["sweeps"][0].get("reservation") else None)(ledger(env, EXHAUST)["status"]),
        30,
        what="the reservation released",
    )
    # the stop began gracefulStopSeconds early; the guard's verification and a poll's lag are all it may overrun
    assert final["usedGpuHours"] * HOUR <= 36 + 2 * 3.0, final


def test_a_ledger_deleted_past_the_policy_is_refused_until_an_administrator_re_creates_it(env: OperatorEnv) -> None:
    """The ledger deleted by someone the policy does not stop here (this emulator has no admission policy): the next
    GPU sweep waits Queued with a Warning Event saying what is gone and what an administrator does, and no ledger is
    made again; removing the namespace's key from the operator's record re-creates it on purpose."""
    first = env.new_sweep("vanish-a", namespace=VANISHED, gpu=True, **ONE_GPU, **deadlines(30))
    env.runner.script(first["metadata"]["name"], Outcome.hang(startup=0.3))
    env.apply(first)
    env.wait_status(first["metadata"]["name"], lambda s: bool(s.get("runId")), "admitted", VANISHED)
    record_namespace = env.settings.operator_namespace or constants.LEDGER_RECORD_FALLBACK_NAMESPACE
    record = env.core.read_namespaced_config_map(constants.LEDGER_RECORD_NAME, record_namespace)
    assert VANISHED in (record.data or {})
    env.custom.delete_namespaced_custom_object(
        constants.GROUP, constants.VERSION, VANISHED, constants.LEDGER_PLURAL, constants.LEDGER_NAME
    )
    second = env.new_sweep("vanish-b", namespace=VANISHED, gpu=True, **ONE_GPU, **deadlines(30))
    name = second["metadata"]["name"]
    env.runner.script(name, Outcome.hang(startup=0.3))
    env.apply(second)
    waiting = env.wait_status(
        name, lambda s: "GPU-hour ledger" in (s.get("message") or ""), "queued on the vanished ledger", VANISHED
    )
    assert waiting["phase"] == "Queued" and not waiting.get("runId")
    assert (
        f"removing the key {VANISHED} from ConfigMap {record_namespace}/{constants.LEDGER_RECORD_NAME}"
        in (waiting["message"])
    )
    wait_for(lambda: "GpuHourLedgerMissing" in env.event_reasons(name, VANISHED), 30, what="the Warning Event")
    with pytest.raises(kubernetes.client.ApiException):
        ledger(env, VANISHED)
    env.core.patch_namespaced_config_map(
        constants.LEDGER_RECORD_NAME,
        record_namespace,
        [{"op": "remove", "path": f"/data/{VANISHED}"}],
    )
    env.wait_status(name, lambda s: bool(s.get("runId")), "admitted once the administrator removed the entry", VANISHED)
    assert {s["name"] for s in ledger(env, VANISHED)["status"]["sweeps"]} >= {name}
