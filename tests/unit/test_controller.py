"""The operator's reconcile logic against an in-memory API: admission and FIFO queueing, RayJob lifecycle,
status, deadlines (R6, R20), drift (R21), spec changes, and the checkpoint guard (R22). No kopf, no sockets."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from sweep_contracts import constants
from sweep_contracts.runtime_env import run_spec_of
from sweep_operator.reconcile.controller import RetryLater, SweepController
from sweep_operator.settings import OperatorLimits, Settings
from tests.support.factories import changed, cpu_sweep, gpu_sweep
from tests.support.fake_kube import FakeKube
from tests.support.fake_s3 import FakeS3
from tests.support.fakes import T0, Clock, FakeResult, FakeVerifier, Finding


@dataclass
class World:
    kube: FakeKube
    s3: FakeS3
    verifier: FakeVerifier
    clock: Clock
    events: list[tuple[str, str, str, str]]
    controller: SweepController
    s3_clients: list[tuple[str, str]] = field(default_factory=list)  # (endpoint, region) of every S3 client asked for

    def sweep(self, name: str, namespace: str = "ml") -> dict[str, Any]:
        obj = self.kube.get_sweep(namespace, name)
        assert obj is not None
        return obj

    def status(self, name: str, namespace: str = "ml") -> dict[str, Any]:
        return self.sweep(name, namespace).get("status") or {}

    def reconcile(self, name: str, namespace: str = "ml") -> dict[str, Any]:
        """One reconcile as the operator runs it: the guard's finalizer is on the sweep (kopf adds it on the sweep's
        first event) and the controller has seen every RayJob as it is now (kopf's RayJob watch feeds it)."""
        self.kube.ensure_finalizer(self.sweep(name, namespace))
        self.watch_rayjobs()
        self.controller.reconcile_sweep(self.sweep(name, namespace))
        return self.status(name, namespace)

    def watch_rayjobs(self) -> None:
        for (kind, _, _), obj in list(self.kube.objects.items()):
            if kind == "RayJob":
                self.controller.observe_rayjob(obj)

    def put(self, path: str, data: bytes) -> None:
        """An object at `bucket/key` in the fake S3, as the driver writes it."""
        bucket, _, key = path.partition("/")
        self.s3.create_bucket(Bucket=bucket)
        self.s3.put_object(Bucket=bucket, Key=key, Body=data)

    def reasons(self, name: str) -> list[str]:
        return [reason for obj, _type, reason, _msg in self.events if obj == name]


@pytest.fixture
def world() -> World:
    kube, s3, verifier, clock = FakeKube(), FakeS3(), FakeVerifier(), Clock()
    s3.create_bucket(Bucket="bucket")  # the factories' storage.uri
    events: list[tuple[str, str, str, str]] = []
    s3_clients: list[tuple[str, str]] = []
    settings = Settings(
        limits=OperatorLimits(max_gpus_per_namespace=8),
        status_poll_seconds=0,
        progress_mirror_seconds=0,  # each pass's progress written at once (the rhythm has tests of its own)
        s3_endpoint_url="https://operator-default.example",
        s3_region="eu-west-1",
    )

    def s3_for(endpoint: str, region: str) -> FakeS3:
        s3_clients.append((endpoint, region))
        return s3

    controller = SweepController(
        settings,
        kube,  # type: ignore[arg-type]  # FakeKube is KubeApi's duck-typed double
        s3_for,
        lambda body, type_, reason, message: events.append((body["metadata"]["name"], type_, reason, message)),
        verifier=verifier,
        clock=clock,
    )
    return World(kube, s3, verifier, clock, events, controller, s3_clients)


def add_sweep(world: World, name: str, created: str = "2026-12-02T12:00:00Z", **changes: Any) -> dict[str, Any]:
    doc = changed(gpu_sweep(name=name), {k.replace("__", "."): v for k, v in changes.items()})
    doc["metadata"]["creationTimestamp"] = created
    return world.kube.add("TrainingSweep", doc)


def test_admission_creates_exactly_one_rayjob_as_rendered(world: World) -> None:
    add_sweep(world, "digits")
    status = world.reconcile("digits")
    assert status["phase"] == "Starting"
    assert status["runId"] and status["rayJobName"] == f"digits-{status['runId']}"
    assert status["replicas"] == {"workers": 4, "gpus": 4, "cap": 4, "namespaceBudget": "4/8"}
    rayjob = world.kube.get_rayjob("ml", status["rayJobName"])
    assert (
        rayjob is not None
        and rayjob["metadata"]["ownerReferences"][0]["uid"] == world.sweep("digits")["metadata"]["uid"]
    )
    env = yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"])["env_vars"]
    assert env[constants.ENV_DEADLINE_AT] == str(int(T0 + 21600))
    assert status["deadlineAt"] == "2026-11-30T06:53:20Z"  # T0 (00:53:20Z) + activeSeconds 6h
    world.reconcile("digits")
    world.reconcile("digits")
    assert len(world.kube.rayjob_names()) == 1
    assert "Starting" in world.reasons("digits")


def test_columns_count_trials_against_num_samples_and_a_cpu_sweep_shows_0_gpu_hours(world: World) -> None:
    """Issue 28: TRIALS read `0/1` while the first trial trained and `2/2` two trials into a 100-sample sweep;
    BEST printed 16 digits; GPU-HOURS stayed blank on a CPU sweep."""
    doc = changed(cpu_sweep(name="wide", namespace="ml"), {"spec.tune.numSamples": 100})
    doc["metadata"]["creationTimestamp"] = "2026-12-02T12:00:00Z"
    world.kube.add("TrainingSweep", doc)
    status = world.reconcile("wide")
    assert (status["phase"], status["trialsSummary"], status["usage"]) == ("Starting", "0/100", {"gpuHours": 0})
    name, run_id = status["rayJobName"], status["runId"]
    world.kube.set_rayjob_status(
        name, "ml", jobDeploymentStatus="Running", jobStatus="RUNNING", rayClusterName=f"{name}-x7k2p"
    )
    progress = f"bucket/sweeps/ml/wide-{run_id}/_sweep/status.json"
    world.put(progress, json.dumps({"trials": {"total": 1, "running": 1}}).encode())
    assert world.reconcile("wide")["trialsSummary"] == "0/100 (1 running)"
    best = {"id": "t1", "metric": "val_loss", "value": 0.31415926535897931}
    world.put(progress, json.dumps({"trials": {"total": 2, "terminated": 2}, "bestTrial": best}).encode())
    status = world.reconcile("wide")
    assert (status["trialsSummary"], status["bestSummary"]) == ("2/100", "val_loss=0.3142")
    assert status["usage"] == {"gpuHours": 0}  # its (CPU) pods were read: nothing to record, no rewrite each pass


def test_nothing_is_created_before_the_guards_finalizer_is_on(world: World) -> None:
    """R22: the operator puts the guard's finalizer on a new sweep first (kopf manages none of ours), and creates
    the RayJob only once it is on."""
    add_sweep(world, "digits")
    world.controller.reconcile_sweep(world.sweep("digits"))
    calls = [c[0] for c in world.kube.calls]
    assert calls.index("ensure_finalizer") < calls.index("create_rayjob"), "R22: the guard is on before a RayJob exists"
    assert constants.FINALIZER in world.sweep("digits")["metadata"]["finalizers"]
    assert world.status("digits")["phase"] == "Starting"


def test_run_id_follows_from_the_sweeps_uid(world: World) -> None:
    """Every operator instance names the same RayJob for a sweep; a sweep re-created under the same name (a new
    uid) gets a new run id, so a new RayJob and a new S3 prefix (R16)."""
    from sweep_operator.rendering import run_id_for

    add_sweep(world, "digits")
    first = world.reconcile("digits")
    assert first["runId"] == run_id_for(world.sweep("digits")["metadata"]["uid"])
    world.kube.objects.pop(("TrainingSweep", "ml", "digits"))
    world.kube.objects.pop(("RayJob", "ml", first["rayJobName"]))
    add_sweep(world, "digits")
    second = world.reconcile("digits")
    assert second["runId"] != first["runId"] and second["rayJobName"] == f"digits-{second['runId']}"


def test_adopts_a_rayjob_created_before_a_crash(world: World) -> None:
    """Operator restart between creating the RayJob and recording it: the create finds it (same name, same run
    id), and it is adopted with its own start time and deadline; never a second one."""
    sweep = add_sweep(world, "digits")
    from sweep_operator.rendering import build_rayjob, run_id_for
    from sweep_operator.validation import parse_sweep

    run_id = run_id_for(sweep["metadata"]["uid"])
    earlier = world.kube.create_rayjob(build_rayjob(parse_sweep(sweep), run_id, deadline_at=int(T0 + 100)))[0]
    earlier["metadata"]["creationTimestamp"] = "2026-11-30T00:50:00Z"
    world.kube.objects[("RayJob", "ml", earlier["metadata"]["name"])] = earlier
    world.kube.calls.clear()
    status = world.reconcile("digits")
    assert status["runId"] == run_id and world.kube.rayjob_names() == [f"digits-{run_id}"]
    assert "adopted" in status["message"]
    assert status["startedAt"] == "2026-11-30T00:50:00Z" and status["deadlineAt"] == "2026-11-30T00:55:00Z"  # T0 + 100
    lists = [c for c in world.kube.calls if c[0] == "list_rayjobs"]
    assert lists == [("list_rayjobs", constants.LABEL_SWEEP)], (
        "the create is the check: no list per sweep, only the ledger's rebuild"
    )


def test_a_foreign_rayjob_holding_the_name_is_never_adopted(world: World) -> None:
    sweep = add_sweep(world, "digits")
    from sweep_operator.rendering import build_rayjob, run_id_for
    from sweep_operator.validation import parse_sweep

    foreign = build_rayjob(parse_sweep(sweep), run_id_for(sweep["metadata"]["uid"]), deadline_at=int(T0 + 100))
    foreign["metadata"]["ownerReferences"][0]["uid"] = "someone-else"
    world.kube.create_rayjob(foreign)
    status = world.reconcile("digits")
    assert status["phase"] == "Pending" and "runId" not in status
    assert "is not this sweep's run" in status["message"] and "RayJobNameTaken" in world.reasons("digits")
    assert world.controller.ledger.in_use("ml").gpus == 0, "a sweep that cannot start holds no budget"
    world.reconcile("digits")
    assert world.reasons("digits").count("RayJobNameTaken") == 1, "one Warning, not one per tick"


def test_invalid_spec_gets_phase_invalid_and_a_warning_once(world: World) -> None:
    add_sweep(world, "bad", spec__tune__mode="best")
    status = world.reconcile("bad")
    assert status["phase"] == "Invalid" and "spec.tune.mode" in status["message"]
    world.reconcile("bad")
    assert world.reasons("bad").count("Invalid") == 1
    assert world.kube.rayjob_names() == []


def test_over_cap_is_invalid_naming_cap_and_demand(world: World) -> None:
    add_sweep(world, "huge", spec__trial__workers=8)
    status = world.reconcile("huge")
    assert status["phase"] == "Invalid"
    assert "demand of 16 GPUs" in status["message"] and "maxGpusPerNamespace 8" in status["message"]


def test_namespace_budget_queues_fifo_and_admits_when_capacity_frees(world: World) -> None:
    """R21: 8 GPUs per namespace, 4 per sweep: two run, the others queue and are admitted oldest first."""
    for i, name in enumerate(["a", "b", "c", "d"]):
        add_sweep(world, name, created=f"2026-12-02T12:00:0{i}Z")
    for name in ["d", "c", "b", "a"]:  # events arrive out of creation order
        world.reconcile(name)
    phases = {n: world.status(n)["phase"] for n in "abcd"}
    assert phases == {"a": "Queued", "b": "Queued", "c": "Starting", "d": "Starting"}
    assert "needs 4 GPUs" in world.status("b")["message"] and "0 free" in world.status("b")["message"]
    assert world.controller.ledger.in_use("ml").gpus == 8
    world.kube.set_rayjob_status(
        world.status("d")["rayJobName"], "ml", jobDeploymentStatus="Complete", jobStatus="SUCCEEDED"
    )
    world.reconcile("d")
    assert world.status("d")["phase"] == "Succeeded"
    assert world.status("a")["phase"] == "Starting", "the oldest queued sweep is admitted first"
    assert world.status("b")["phase"] == "Queued"
    assert "waiting behind" not in world.status("b")["message"]
    assert world.controller.ledger.in_use("ml").gpus == 8


def test_queue_is_strict_fifo_by_creation(world: World) -> None:
    add_sweep(world, "first", created="2026-12-02T12:00:00Z", spec__trial__workers=4)  # 8 GPUs: the whole budget
    add_sweep(world, "older", created="2026-12-02T12:00:01Z")
    add_sweep(world, "younger", created="2026-12-02T12:00:02Z")
    assert world.reconcile("first")["phase"] == "Starting"
    assert world.reconcile("older")["phase"] == "Queued"
    assert world.reconcile("younger")["phase"] == "Queued"
    first = world.status("first")
    world.kube.set_rayjob_status(
        first["rayJobName"], "ml", jobDeploymentStatus="Failed", jobStatus="FAILED", reason="AppFailed"
    )
    world.reconcile("first")
    assert world.status("older")["phase"] == "Starting"
    assert world.status("younger")["phase"] == "Starting"


def test_a_release_queues_the_oldest_waiting_sweeps_pass_instead_of_nesting_it(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29: the pass that frees the budget runs no pass of another sweep inside its actions; it asks the work
    queue for the oldest queued sweep (before routine work), whose admission asks for the next one."""
    from sweep_operator.workqueue import URGENT

    add_sweep(world, "first", created="2026-12-02T12:00:00Z", spec__trial__workers=4)  # 8 GPUs: the whole budget
    add_sweep(world, "older", created="2026-12-02T12:00:01Z")
    add_sweep(world, "younger", created="2026-12-02T12:00:02Z")
    assert world.reconcile("first")["phase"] == "Starting"
    assert world.reconcile("younger")["phase"] == "Queued"
    assert world.reconcile("older")["phase"] == "Queued"
    asked: list[tuple[str, str, int]] = []
    monkeypatch.setattr(
        world.controller, "request_reconcile", lambda ns, name, *, priority: asked.append((ns, name, priority))
    )
    first = world.status("first")
    world.kube.set_rayjob_status(
        first["rayJobName"], "ml", jobDeploymentStatus="Failed", jobStatus="FAILED", reason="AppFailed"
    )
    world.reconcile("first")
    assert asked == [("ml", "older", URGENT)], "only the oldest, queued on the work queue"
    assert world.status("older")["phase"] == "Queued", "no pass of it ran inside the releasing pass"
    assert world.reconcile("older")["phase"] == "Starting"
    assert asked[1:] == [("ml", "younger", URGENT)], "its admission hands on to the next"
    assert world.reconcile("younger")["phase"] == "Starting"
    assert asked[2:] == [], "nobody is left in the queue"


def test_the_budgets_answer_is_recorded_by_act_and_a_lost_race_decides_again(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29: asking the namespace's budgets records nothing; `_execute` records the answer (ReserveBudget), decided
    again under the ledger's lock, so an admission that came first between the read and the record voids the pass's
    decision: the pass runs again and queues the sweep, and the namespace is never over-admitted."""
    add_sweep(world, "early", created="2026-12-02T12:00:00Z", spec__trial__workers=4)  # 8 GPUs: the whole budget
    add_sweep(world, "late", created="2026-12-02T12:00:01Z", spec__trial__workers=4)
    controller, raced = world.controller, []
    record = controller.budgets.reserve

    def racing(facts: Any, reservation: Any) -> bool:
        if facts.ref.name == "late" and not raced:
            raced.append(reservation)
            assert controller.ledger.in_use("ml").gpus == 0, "the pass's read of the budgets recorded nothing"
            assert world.reconcile("early")["phase"] == "Starting"  # another admission comes first
        return record(facts, reservation)

    monkeypatch.setattr(controller.budgets, "reserve", racing)
    status = world.reconcile("late")
    assert raced and raced[0].admitted, "the read admitted it"
    assert status["phase"] == "Queued" and not status.get("runId"), "its record refused it: decided again, queued"
    assert controller.ledger.in_use("ml").gpus == 8
    assert controller.ledger.queued_in("ml") == ["late"]


def test_status_mirrors_rayjob_and_progress(world: World) -> None:
    add_sweep(world, "digits")
    status = world.reconcile("digits")
    name, run_id = status["rayJobName"], status["runId"]
    world.kube.set_rayjob_status(
        name, "ml", jobDeploymentStatus="Running", jobStatus="RUNNING", rayClusterName=f"{name}-x7k2p"
    )
    world.put(
        f"bucket/sweeps/ml/digits-{run_id}/_sweep/status.json",
        json.dumps(
            {
                "trials": {"total": 8, "running": 2, "pending": 3, "terminated": 3},
                "bestTrial": {"id": "t1", "metric": "val_loss", "value": 0.25},
            }
        ).encode(),
    )
    status = world.reconcile("digits")
    assert status["phase"] == "Running"
    assert status["rayClusterName"] == f"{name}-x7k2p"
    assert status["jobDeploymentStatus"] == "Running" and status["jobStatus"] == "RUNNING"
    assert status["trialsSummary"] == "3/8 (2 running)" and status["bestTrial"]["value"] == 0.25
    assert status["trainingStartedAt"]
    running = next(c for c in status["conditions"] if c["type"] == "Running")
    assert running["status"] == "True" and running["observedGeneration"] == 1
    # A KubeRay retry makes a new cluster: the status follows it.
    world.kube.set_rayjob_status(
        name, "ml", jobDeploymentStatus="Retrying", jobStatus="", rayClusterName=f"{name}-q9w8e"
    )
    status = world.reconcile("digits")
    assert status["phase"] == "Starting" and status["rayClusterName"] == f"{name}-q9w8e"


def test_success_reads_result_and_verifies_checkpoints(world: World) -> None:
    add_sweep(world, "digits")
    status = world.reconcile("digits")
    run_id = status["runId"]
    world.put(
        f"bucket/sweeps/ml/digits-{run_id}/_sweep/result.json",
        json.dumps(
            {
                "bestTrial": {
                    "id": "t2",
                    "metric": "val_loss",
                    "value": 0.1,
                    "config": {"lr": 0.01},
                    "checkpointUri": f"s3://bucket/sweeps/ml/digits-{run_id}/train/t2/checkpoint_epoch-000005",
                },
                "trials": {"total": 8, "terminated": 8},
            }
        ).encode(),
    )
    world.kube.set_rayjob_status(status["rayJobName"], "ml", jobDeploymentStatus="Running", jobStatus="RUNNING")
    world.reconcile("digits")
    world.kube.set_rayjob_status(status["rayJobName"], "ml", jobDeploymentStatus="Complete", jobStatus="SUCCEEDED")
    status = world.reconcile("digits")
    assert status["phase"] == "Succeeded" and status["finishedAt"]
    assert status["bestTrial"]["id"] == "t2" and status["trialsSummary"] == "8/8"
    assert status["checkpoints"]["verified"] is True
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["CheckpointsVerified"]["status"] == "True" and conditions["Ready"]["status"] == "True"
    assert world.verifier.calls == [f"s3://bucket/sweeps/ml/digits-{run_id}"]
    world.reconcile("digits")
    assert len(world.verifier.calls) == 1, "verification at the end runs once"


def test_kuberay_deadline_maps_to_deadline_exceeded(world: World) -> None:
    add_sweep(world, "digits")
    status = world.reconcile("digits")
    world.kube.set_rayjob_status(status["rayJobName"], "ml", jobDeploymentStatus="Failed", reason="DeadlineExceeded")
    status = world.reconcile("digits")
    assert status["phase"] == "DeadlineExceeded"
    assert next(c for c in status["conditions"] if c["type"] == "DeadlineExceeded")["status"] == "True"


def test_sweep_deadline_stops_the_rayjob_through_the_guard(world: World) -> None:
    """One clock for the sweep: past deadlineAt the operator stops the RayJob (its finalizer holds it for the guard)."""
    add_sweep(world, "digits")
    status = world.reconcile("digits")
    world.kube.set_rayjob_status(status["rayJobName"], "ml", jobDeploymentStatus="Running", jobStatus="RUNNING")
    world.reconcile("digits")
    world.clock.now = T0 + 21600 + 1
    status = world.reconcile("digits")
    assert status["phase"] == "Running", "the driver's graceful window: the RayJob is not deleted yet"
    grace = next(c for c in status["conditions"] if c["type"] == "DeadlineExceeded")
    assert (grace["status"], grace["reason"]) == ("True", "GracefulStop")
    assert ("delete_rayjob", status["rayJobName"]) not in world.kube.calls
    world.clock.now = T0 + 21600 + 300 + 1  # activeSeconds + gracefulStopSeconds: KubeRay's hard stop
    status = world.reconcile("digits")
    assert status["phase"] == "DeadlineExceeded"
    assert ("delete_rayjob", status["rayJobName"]) in world.kube.calls
    rayjob = world.kube.get_rayjob("ml", status["rayJobName"])
    assert rayjob is not None and rayjob["metadata"]["deletionTimestamp"], "the finalizer keeps it until verified"
    assert world.controller.metrics.total("trainingsweep_deadline_stops_total") == 1


def test_startup_deadline_fails_with_a_diagnosis(world: World) -> None:
    """R6, R20: not Running within startupSeconds -> Failed, and the message says why pods are pending."""
    add_sweep(world, "digits")
    status = world.reconcile("digits")
    cluster = f"{status['rayJobName']}-abcde"
    world.kube.set_rayjob_status(status["rayJobName"], "ml", jobDeploymentStatus="Initializing", rayClusterName=cluster)
    world.kube.pods.append(
        {
            "metadata": {
                "name": f"{cluster}-worker-1",
                "labels": {"ray.io/cluster": cluster, "ray.io/node-type": "worker"},
            },
            "status": {"phase": "Pending"},
        }
    )
    world.kube.events.append(
        {
            "type": "Warning",
            "reason": "FailedScheduling",
            "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
            "involvedObject": {"kind": "Pod", "name": f"{cluster}-worker-1"},
        }
    )
    world.clock.now = T0 + 1000
    assert world.reconcile("digits")["phase"] == "Starting"
    world.clock.now = T0 + 1801
    status = world.reconcile("digits")
    assert status["phase"] == "Failed"
    assert "startupSeconds=1800" in status["message"] and "Insufficient nvidia.com/gpu" in status["message"]
    running = next(c for c in status["conditions"] if c["type"] == "Running")
    assert running["reason"] == "StartupDeadlineExceeded" and "0/3 nodes are available" in running["message"]
    assert ("delete_rayjob", status["rayJobName"]) in world.kube.calls


def test_spec_change_to_a_running_sweep_is_refused_but_suspend_is_honoured(world: World) -> None:
    add_sweep(world, "digits")
    status = world.reconcile("digits")
    obj = world.kube.objects[("TrainingSweep", "ml", "digits")]
    obj["spec"]["tune"]["numSamples"] = 99
    obj["metadata"]["generation"] = 2
    world.kube._bump(obj)  # an edit through the API: a new resourceVersion
    status = world.reconcile("digits")
    assert "spec change refused: spec.tune changed" in status["message"]
    assert status["observedGeneration"] == 2
    assert "SpecChangeRefused" in world.reasons("digits")
    rayjob = world.kube.get_rayjob("ml", status["rayJobName"])
    assert run_spec_of(rayjob).spec.tune.num_samples == 8, "the run keeps its admitted spec"
    obj["spec"]["tune"]["numSamples"] = 8
    obj["spec"]["suspend"] = True
    obj["metadata"]["generation"] = 3
    world.kube._bump(obj)
    world.reconcile("digits")
    assert world.kube.get_rayjob("ml", status["rayJobName"])["spec"]["suspend"] is True
    assert "Suspend" in world.reasons("digits")


def test_suspended_before_start_waits_without_budget(world: World) -> None:
    add_sweep(world, "digits", spec__suspend=True)
    assert world.reconcile("digits")["phase"] == "Suspended"
    assert world.kube.rayjob_names() == []
    obj = world.kube.objects[("TrainingSweep", "ml", "digits")]
    obj["spec"]["suspend"] = False
    obj["metadata"]["generation"] = 2
    world.kube._bump(obj)  # an edit through the API: a new resourceVersion
    assert world.reconcile("digits")["phase"] == "Starting"


def test_worker_group_above_cap_is_set_back_with_an_event(world: World) -> None:
    """R21: maxReplicas edited above workers x maxConcurrentTrials is corrected on the RayJob and RayCluster."""
    add_sweep(world, "digits")
    status = world.reconcile("digits")
    rayjob = world.kube.objects[("RayJob", "ml", status["rayJobName"])]
    assert not world.controller.drifted(world.kube.get_rayjob("ml", status["rayJobName"]), "RayJob")  # as rendered
    rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["maxReplicas"] = 50
    assert world.controller.drifted(
        world.kube.get_rayjob("ml", status["rayJobName"]), "RayJob"
    )  # the cheap check sees it
    world.controller.correct_drift(world.kube.get_rayjob("ml", status["rayJobName"]), "RayJob")
    assert not world.controller.drifted(world.kube.get_rayjob("ml", status["rayJobName"]), "RayJob")
    assert (
        world.kube.get_rayjob("ml", status["rayJobName"])["spec"]["rayClusterSpec"]["workerGroupSpecs"][0][
            "maxReplicas"
        ]
        == 4
    )
    assert "CapEnforced" in world.reasons(status["rayJobName"]) and "CapEnforced" in world.reasons("digits")
    cluster = world.kube.add(
        "RayCluster",
        {
            "metadata": {
                "name": "c1",
                "namespace": "ml",
                "labels": {constants.LABEL_SWEEP: "digits", constants.LABEL_RUN_ID: status["runId"]},
                "ownerReferences": [{"kind": "RayJob", "name": status["rayJobName"], "uid": "x"}],
            },
            "spec": {
                "workerGroupSpecs": [{"groupName": "gpu-workers", "minReplicas": 0, "maxReplicas": 9, "replicas": 6}]
            },
        },
    )
    world.controller.correct_drift(cluster, "RayCluster")
    group = world.kube.get_raycluster("ml", "c1")["spec"]["workerGroupSpecs"][0]
    assert (group["maxReplicas"], group["replicas"]) == (4, 4)
    calls = len(world.kube.calls)
    world.controller.correct_drift(world.kube.get_raycluster("ml", "c1"), "RayCluster")
    assert len(world.kube.calls) == calls, "nothing to correct, nothing written"


def ran(world: World, name: str = "digits") -> dict[str, Any]:
    add_sweep(world, name)
    status = world.reconcile(name)
    world.kube.set_rayjob_status(status["rayJobName"], "ml", jobDeploymentStatus="Running", jobStatus="RUNNING")
    return world.reconcile(name)


def test_guard_holds_sweep_deletion_until_verified(world: World) -> None:
    """R22: deleting the sweep verifies first; unverified keeps the finalizer with the reason in status."""
    status = ran(world)
    world.verifier.verified = False
    with pytest.raises(RetryLater) as held:
        world.controller.guard_sweep_deletion(world.sweep("digits"), attempt=0)
    assert held.value.delay == 30 and "missing-file" in str(held.value)
    status = world.status("digits")
    assert status["phase"] == "Deleting"
    assert status["checkpoints"]["verified"] is False
    cond = next(c for c in status["conditions"] if c["type"] == "CheckpointsVerified")
    assert cond["status"] == "False" and "model.pt" in cond["message"]
    assert ("delete_rayjob", status["rayJobName"]) not in world.kube.calls, (
        "the RayJob is deleted only after verification"
    )
    with pytest.raises(RetryLater) as again:
        world.controller.guard_sweep_deletion(world.sweep("digits"), attempt=3)
    assert again.value.delay == 240
    world.verifier.verified = True
    reason = world.controller.guard_sweep_deletion(world.sweep("digits"), attempt=4)
    assert reason == "checkpoints verified complete in S3"
    assert ("delete_rayjob", status["rayJobName"]) in world.kube.calls


def test_guard_releases_a_sweep_that_was_never_admitted_without_verifying(world: World) -> None:
    """R22: no run id, and no RayJob under the name its uid implies: nothing can exist in S3."""
    add_sweep(world, "digits", **{"spec.suspend": True})
    world.reconcile("digits")
    world.verifier.verified = False
    assert "never admitted" in world.controller.guard_sweep_deletion(world.sweep("digits"), attempt=0)
    assert world.verifier.calls == []


def test_guard_verifies_an_admitted_sweep_even_before_it_ran(world: World) -> None:
    """R22 (issue 12, defect 3): a RayJob exists, so a run may have written; an empty run root is released only
    after the verifier saw it empty, with an audit Event."""
    add_sweep(world, "digits")
    status = world.reconcile("digits")
    world.verifier.findings = [Finding("empty-run-root", "sweeps/ml/x", "no object")]
    world.verifier.verified = False
    reason = world.controller.guard_sweep_deletion(world.sweep("digits"), attempt=0)
    assert "nothing to protect" in reason
    assert world.verifier.calls == [f"s3://bucket/sweeps/ml/digits-{status['runId']}"]
    assert [e[2] for e in world.events if e[2] == "CheckpointGuardBypassed"], "audited, never silent"


def test_escape_hatch_releases_with_an_audit_event(world: World) -> None:
    ran(world)
    world.verifier.verified = False
    world.kube.objects[("TrainingSweep", "ml", "digits")]["metadata"]["annotations"] = {
        constants.ANNOTATION_SKIP_VERIFICATION: "true"
    }
    reason = world.controller.guard_sweep_deletion(world.sweep("digits"), attempt=0)
    assert "WITHOUT" not in reason and constants.ANNOTATION_SKIP_VERIFICATION in reason
    audits = [e for e in world.events if e[2] == "CheckpointGuardBypassed"]
    assert audits and audits[0][1] == "Warning" and "WITHOUT checkpoint verification" in audits[0][3]


def test_rayjob_guard_reads_its_own_run_spec(world: World) -> None:
    """R22: a RayJob deleted by a user is held while its run is unverified, even when the sweep is gone."""
    status = ran(world)
    rayjob = world.kube.get_rayjob("ml", status["rayJobName"])
    del world.kube.objects[("TrainingSweep", "ml", "digits")]
    world.verifier.verified = False
    with pytest.raises(RetryLater, match="missing-file"):
        world.controller.guard_rayjob_deletion(rayjob, attempt=0)
    world.verifier.verified = True
    assert world.controller.guard_rayjob_deletion(rayjob, attempt=1) == "checkpoints verified complete in S3"
    assert world.verifier.calls[-1] == f"s3://bucket/sweeps/ml/digits-{status['runId']}"


def test_an_older_runs_held_rayjob_is_not_the_business_of_a_sweep_created_again_under_its_name(world: World) -> None:
    """A sweep deleted (an admin took its finalizer off) and created again under its name is another run (R16):
    the older run's held RayJob writes nothing into the new sweep's status, and the escape hatch set on the new
    sweep reaches only the new run's objects (reads.sweep_of, guard_pipeline._propagate_skip)."""
    old = ran(world)
    rayjob = world.kube.get_rayjob("ml", old["rayJobName"])
    assert rayjob is not None
    del world.kube.objects[("TrainingSweep", "ml", "digits")]
    again = ran(world)  # a new uid: a new run, a new RayJob
    assert again["runId"] != old["runId"]
    before = world.status("digits")
    world.verifier.verified = False
    with pytest.raises(RetryLater, match="missing-file"):
        world.controller.guard_rayjob_deletion(rayjob, attempt=0)
    assert world.verifier.calls[-1] == f"s3://bucket/sweeps/ml/digits-{old['runId']}"  # its own run was verified
    assert world.status("digits") == before, "the older run's verification was written into the new sweep"
    world.kube.objects[("TrainingSweep", "ml", "digits")]["metadata"]["annotations"] = {
        constants.ANNOTATION_SKIP_VERIFICATION: "true"
    }
    world.controller.guard_sweep_deletion(world.sweep("digits"), attempt=0)
    skipped = {
        name: (obj["metadata"].get("annotations") or {}).get(constants.ANNOTATION_SKIP_VERIFICATION)
        for (kind, _, name), obj in world.kube.objects.items()
        if kind == "RayJob"
    }
    assert skipped.get(old["rayJobName"]) is None, "the escape hatch crossed into the older run"
    assert skipped.get(again["rayJobName"]) == "true", skipped  # its own run's objects take it
    with pytest.raises(RetryLater, match="missing-file"):  # still held: verified, not waved through
        world.controller.guard_rayjob_deletion(world.kube.get_rayjob("ml", old["rayJobName"]), attempt=1)


def test_raycluster_guard_finds_the_run_through_its_own_annotation_or_its_rayjobs(world: World) -> None:
    """KubeRay copies the RayJob's guard annotation onto the cluster: it names the run after the RayJob and the
    sweep are gone. A cluster without its own copy is guarded through its RayJob's (R22)."""
    status = ran(world)
    rayjob = world.kube.get_rayjob("ml", status["rayJobName"])
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]
    cluster = {
        "metadata": {
            "name": f"{status['rayJobName']}-abcde",
            "namespace": "ml",
            "labels": {constants.LABEL_SWEEP: "digits", constants.LABEL_RUN_ID: status["runId"]},
            "ownerReferences": [{"kind": "RayJob", "name": status["rayJobName"], "uid": "x"}],
        },
        "spec": {"headGroupSpec": head, "workerGroupSpecs": []},
    }
    world.verifier.verified = False
    with pytest.raises(RetryLater):
        world.controller.guard_raycluster_deletion(cluster, attempt=0)
    assert world.verifier.calls[-1] == f"s3://bucket/sweeps/ml/digits-{status['runId']}"  # the RayJob's record
    copied = changed(cluster, {"metadata.annotations": dict(rayjob["metadata"]["annotations"])})
    del world.kube.objects[("RayJob", "ml", status["rayJobName"])]
    del world.kube.objects[("TrainingSweep", "ml", "digits")]
    with pytest.raises(RetryLater):
        world.controller.guard_raycluster_deletion(copied, attempt=1)
    assert world.verifier.calls[-1] == f"s3://bucket/sweeps/ml/digits-{status['runId']}"
    world.verifier.verified = True
    assert "verified" in world.controller.guard_raycluster_deletion(copied, attempt=2)


def _look_alike(namespace: str, root: str, annotation: dict[str, Any] | None = None) -> dict[str, Any]:
    """A RayCluster with our label and finalizer whose head names another namespace's run root (confused deputy)."""
    env = [
        {"name": constants.ENV_RUN_ROOT, "value": root},
        {"name": "AWS_ENDPOINT_URL_S3", "value": "http://attacker.example:9000"},
    ]
    cluster: dict[str, Any] = {
        "metadata": {
            "name": "look-alike",
            "namespace": namespace,
            "labels": {constants.LABEL_SWEEP: "digits", constants.LABEL_RUN_ID: "abc123"},
            "finalizers": [constants.FINALIZER],
        },
        "spec": {"headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head", "env": env}]}}}},
    }
    if annotation is not None:
        cluster["metadata"]["annotations"] = {constants.ANNOTATION_GUARD: json.dumps(annotation)}
    return cluster


def test_a_look_alike_cluster_never_points_the_guard_at_another_namespace(world: World) -> None:
    """Issue 25, defect 3: a tenant's RayCluster in `tenant` carries our label and finalizer, and its head env (or
    runtime env, or a label) names `victim`'s run root and its own endpoint. The guard reads none of them: it holds,
    calls no verifier and no S3 endpoint, names `sweepctl release`, and says nothing about `victim`."""
    victim_root = "s3://bucket/sweeps/victim/digits-abc123"
    cluster = _look_alike("tenant", victim_root)
    with pytest.raises(RetryLater, match="sweepctl release") as held:
        world.controller.guard_raycluster_deletion(cluster, attempt=0)
    assert world.verifier.calls == [], "the guard verified a root a tenant named"
    assert "victim" not in str(held.value)
    for _, _, reason, message in world.events:
        assert "victim" not in message and "attacker" not in message, (reason, message)


@pytest.mark.parametrize(
    "root",
    [
        "s3://bucket/sweeps/victim/digits-abc123",  # another namespace
        "s3://bucket/sweeps/tenant/other-abc123",  # another sweep's run in the same namespace
        "s3://bucket/sweeps/victim/tenant/digits-abc123/..",  # not a run root at all
    ],
)
def test_a_guard_record_outside_the_objects_own_run_prefix_is_never_read(world: World, root: str) -> None:
    """Issue 25, defect 3: even a guard annotation (written before the policy protected it, or with it off) is read
    only when its run root is `<storage>/<the object's own namespace>/<sweep>-<runId>`."""
    record = {"runRoot": root, "endpointUrl": "", "region": "", "verify": True, "sweep": "digits", "runId": "abc123"}
    with pytest.raises(RetryLater, match="never read"):
        world.controller.guard_raycluster_deletion(_look_alike("tenant", root, record), attempt=0)
    assert world.verifier.calls == []
    own = {**record, "runRoot": "s3://bucket/sweeps/tenant/digits-abc123"}
    world.verifier.verified = True
    assert "verified" in world.controller.guard_raycluster_deletion(_look_alike("tenant", root, own), attempt=1)
    assert world.verifier.calls == ["s3://bucket/sweeps/tenant/digits-abc123"]


def test_raycluster_without_any_run_root_is_held(world: World) -> None:
    cluster = {
        "metadata": {
            "name": "orphan",
            "namespace": "ml",
            "labels": {constants.LABEL_SWEEP: "gone", constants.LABEL_RUN_ID: "r1"},
        },
        "spec": {},
    }
    with pytest.raises(RetryLater, match="no run root"):
        world.controller.guard_raycluster_deletion(cluster, attempt=0)


def test_webhook_refuses_invalid_specs_and_running_spec_changes(world: World) -> None:
    bad = changed(cpu_sweep(), {"spec.tune.numSamples": 0})
    assert any("spec.tune.numSamples" in p for p in world.controller.admission_problems(bad, None))
    old = changed(cpu_sweep(), {"status": {"runId": "abc123", "phase": "Running"}})
    new = changed(old, {"spec.tune.numSamples": 5})
    problems = world.controller.admission_problems(new, old)
    assert problems and "spec.tune: cannot change while run abc123 is active" in problems[0]
    assert world.controller.admission_problems(changed(old, {"spec.suspend": True}), old) == []
    finished = changed(old, {"status.phase": "Succeeded"})
    # an ended run may be resumed with more samples (issue 16), never fewer (validation.RESUME_RULES)
    assert world.controller.admission_problems(changed(finished, {"spec.tune.numSamples": 12}), finished) == []
    fewer = world.controller.admission_problems(changed(finished, {"spec.tune.numSamples": 5}), finished)
    assert fewer and fewer[0].startswith("spec.tune.numSamples: cannot go down")


def test_guard_never_reuses_an_earlier_verification(world: World) -> None:
    """R22: verified at the end of the run, then an object vanished: the deletion must see the loss."""
    status = ran(world)
    world.kube.set_rayjob_status(status["rayJobName"], "ml", jobDeploymentStatus="Complete", jobStatus="SUCCEEDED")
    assert world.reconcile("digits")["checkpoints"]["verified"] is True
    world.verifier.verified = False  # a checkpoint object is deleted from S3 after the final verification
    with pytest.raises(RetryLater, match="missing-file"):
        world.controller.guard_sweep_deletion(world.sweep("digits"), attempt=0)


def test_timer_ticks_cost_nothing_for_steady_sweeps(world: World) -> None:
    """Scale: ticks do work only when a deadline, a progress poll or the queue is due."""
    status = ran(world)
    body = world.sweep("digits")
    world.controller.settings = Settings(status_poll_seconds=3600)
    assert not world.controller.tick_due(body), "Running, polled just now, deadline far away"
    world.clock.now = T0 + 21600 + 1
    assert world.controller.tick_due(body), "the sweep deadline passed"
    world.clock.now = T0
    assert world.controller.tick_due({"metadata": {"name": "q"}, "status": {"phase": "Queued"}})
    assert world.controller.tick_due({"metadata": {"name": "s"}, "status": {"phase": "Succeeded"}}), "not verified yet"
    assert not world.controller.tick_due(
        {"metadata": {"name": "s"}, "status": {"phase": "Succeeded", "checkpoints": {"verifiedAt": "x"}}}
    )
    assert status["phase"] == "Running"


def test_rayjob_events_reach_the_sweep_only_when_they_carry_news(world: World) -> None:
    rayjob = {
        "metadata": {"uid": "u1", "name": "rj"},
        "status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"},
    }
    assert world.controller.rayjob_changed(rayjob)
    assert not world.controller.rayjob_changed(dict(rayjob, spec={"entrypoint": "x"}))
    assert world.controller.rayjob_changed(
        {**rayjob, "status": {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}}
    )
    assert world.controller.rayjob_changed(
        {
            **rayjob,
            "metadata": {"uid": "u1", "name": "rj", "deletionTimestamp": "t"},
            "status": {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"},
        }
    )


def test_the_added_event_of_our_own_create_is_no_news(world: World) -> None:
    """The create's pass writes the status the new RayJob implies (Starting): the RayJob's ADDED event, the echo of
    that create, starts no second pass (it was a status patch of conditions only, a third of a sweep's status
    writes in a burst); KubeRay's first change to it does."""
    add_sweep(world, "digits")
    status = world.reconcile("digits")
    assert status["phase"] == "Starting"
    rayjob = world.kube.get_rayjob("ml", status["rayJobName"])
    assert rayjob is not None
    assert not world.controller.rayjob_changed(rayjob), "the echo of our own create"
    assert world.controller.rayjob_changed({**rayjob, "status": {"jobDeploymentStatus": "Initializing"}})


def test_ready_follows_the_latest_verification(world: World) -> None:
    """A run verified incomplete at its end, verified complete later (by the guard): Ready turns True with it."""
    status = ran(world)
    world.verifier.verified = False
    world.kube.set_rayjob_status(status["rayJobName"], "ml", jobDeploymentStatus="Complete", jobStatus="SUCCEEDED")
    status = world.reconcile("digits")
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "False"
    world.verifier.verified = True
    world.controller.guard_rayjob_deletion(world.kube.get_rayjob("ml", status["rayJobName"]), attempt=0)
    conditions = {c["type"]: c["status"] for c in world.status("digits")["conditions"]}
    assert conditions["CheckpointsVerified"] == "True" and conditions["Ready"] == "True"


def test_reconcile_requests_arriving_during_one_collapse_into_one_more_pass(world: World) -> None:
    """A burst of events for one sweep (its own patches, its RayJob, the timer) costs two reconciles, not one each."""
    import threading

    add_sweep(world, "digits")
    world.reconcile("digits")
    entered, release = threading.Event(), threading.Event()
    reads: list[str] = []  # one per reconcile pass (each starts with a fresh read)
    real_pass = world.controller._pass

    def slow_pass(ref: Any) -> None:
        reads.append(ref.name)
        if len(reads) == 1:
            entered.set()
            release.wait(5)
        real_pass(ref)

    world.controller._pass = slow_pass  # type: ignore[method-assign]  # a double for this test only
    body = world.sweep("digits")
    first = threading.Thread(target=world.controller.reconcile_sweep, args=(body,))
    first.start()
    assert entered.wait(5)
    for _ in range(5):  # each returns at once: the running reconcile owes one more pass
        world.controller.reconcile_sweep(body)
    assert reads == ["digits"]
    release.set()
    first.join(5)
    assert not first.is_alive()
    assert reads == ["digits", "digits"]  # the first pass, then exactly one more on a fresh read
    world.controller.reconcile_sweep(body)  # nothing in flight: runs (and reads) at once
    assert reads == ["digits", "digits", "digits"]


def test_an_unchanged_spec_is_parsed_once_and_a_changed_one_again(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sweep_operator.reconcile import cache as controller_module

    calls: list[str] = []
    real_parse = controller_module.parse_sweep

    def counting_parse(obj: Any, *args: Any) -> Any:
        calls.append(obj["metadata"]["name"])
        return real_parse(obj, *args)

    monkeypatch.setattr(controller_module, "parse_sweep", counting_parse)
    add_sweep(world, "digits")
    for _ in range(3):
        world.reconcile("digits")
    assert calls == ["digits"]  # status and finalizer changes do not count as a new spec
    sweep = world.kube.objects[("TrainingSweep", "ml", "digits")]
    sweep["metadata"]["annotations"] = {constants.ANNOTATION_SKIP_VERIFICATION: "true"}
    world.kube._bump(sweep)  # an edit through the API: a new resourceVersion
    world.reconcile("digits")
    assert calls == ["digits", "digits"]  # annotations are part of what a parse returns
    sweep["spec"]["tune"]["numSamples"] = 9_999  # the cache must not hide an invalid edit
    sweep["metadata"]["generation"] = 2
    world.controller.cache.parse(sweep)
    sweep["spec"]["trainLoop"] = "no-colon"
    with pytest.raises(Exception, match="trainLoop"):
        world.controller.cache.parse(sweep)
    with pytest.raises(Exception, match="trainLoop"):
        world.controller.cache.parse(sweep)  # a cached rejection is raised again
    sweep["spec"]["trainLoop"] = "training.loops:train"
    sweep["spec"]["tune"]["numSamples"] = 2**70  # orjson refuses it: the key takes the standard encoder, stably
    for _ in range(2):  # over the CRD's maximum: refused, and the refusal is remembered under that key
        with pytest.raises(Exception, match="numSamples"):
            world.controller.cache.parse(sweep)
    assert calls == ["digits"] * 5


def _count_reads(world: World, method: str) -> list[str]:
    """The names `world.kube.<method>(namespace, name)` is asked for from now on (the fake still answers)."""
    reads: list[str] = []
    real = getattr(world.kube, method)

    def counting(namespace: str, name: str) -> dict[str, Any] | None:
        reads.append(name)
        return real(namespace, name)

    setattr(world.kube, method, counting)
    return reads


def test_reconciles_read_the_remembered_rayjob_and_get_it_only_when_unknown(world: World) -> None:
    add_sweep(world, "digits")
    world.kube.ensure_finalizer(world.sweep("digits"))
    gets = _count_reads(world, "get_rayjob")
    world.controller.reconcile_sweep(world.sweep("digits"))  # admitted: the RayJob is created
    name = world.status("digits")["rayJobName"]
    created = world.kube.get("RayJob", "ml", name)
    world.controller.reconcile_sweep(world.sweep("digits"))
    assert gets == []  # the create's answer was remembered: no GET
    world.kube.set_rayjob_status(name, "ml", jobDeploymentStatus="Running", jobStatus="RUNNING")
    world.controller.observe_rayjob(world.kube.get("RayJob", "ml", name))  # what the watch delivers
    world.controller.observe_rayjob(created)  # an older copy arriving late never replaces a newer one
    world.controller.reconcile_sweep(world.sweep("digits"))
    assert world.status("digits")["phase"] == "Running"  # the watched copy's news reached the status
    assert gets == []
    world.controller.forget_rayjob(
        world.kube.get("RayJob", "ml", name)
    )  # DELETED: forgotten, the next reconcile reads again
    world.controller.reconcile_sweep(world.sweep("digits"))
    assert gets == [name]


def test_the_echo_of_our_own_status_write_is_not_reconciled_but_a_foreign_change_is(world: World) -> None:
    add_sweep(world, "digits")
    world.kube.ensure_finalizer(world.sweep("digits"))  # kopf's write on the ADDED event
    world.controller.sweep_event(world.sweep("digits"))  # that write's MODIFIED event: admitted, RayJob created
    assert world.status("digits")["phase"] == "Starting"
    gets = _count_reads(world, "get_sweep")
    calls_before = len(world.kube.calls)
    passes: list[str] = []
    real_pass = world.controller._reconcile

    def counting_pass(body: dict[str, Any]) -> None:
        passes.append(body["metadata"]["resourceVersion"])
        real_pass(body)

    world.controller._reconcile = counting_pass  # type: ignore[method-assign]  # a double for this test only
    echo = world.kube.get("TrainingSweep", "ml", "digits")
    assert echo is not None
    world.controller.sweep_event(echo)  # the MODIFIED event our status patch caused
    assert passes == [] and gets == [] and len(world.kube.calls) == calls_before
    stored = world.kube.objects[("TrainingSweep", "ml", "digits")]
    stored["metadata"]["labels"] = {"team": "vision"}  # someone else's write: a new resourceVersion
    world.kube._bump(stored)
    foreign = world.kube.get("TrainingSweep", "ml", "digits")
    assert foreign is not None
    world.controller.sweep_event(foreign)
    assert passes == [foreign["metadata"]["resourceVersion"]]  # reconciled, from the event's copy
    assert gets == []  # no read: the event carried the newest copy


def test_reconciles_read_the_newest_known_sweep_and_a_stale_copy_is_refused_then_reread(world: World) -> None:
    add_sweep(world, "digits")
    status = world.reconcile("digits")
    rayjob = status["rayJobName"]
    gets = _count_reads(world, "get_sweep")
    stub = {"metadata": {"namespace": "ml", "name": "digits"}}  # what a RayJob event passes on
    world.controller.reconcile_sweep(stub)
    assert gets == []  # the copy our own write returned is the newest known: no read
    # A write we did not see (no event yet) makes the cached copy stale; the RayJob moves on meanwhile.
    stored = world.kube.objects[("TrainingSweep", "ml", "digits")]
    stored["status"]["message"] = "written by someone else"
    world.kube._bump(stored)
    world.kube.set_rayjob_status(rayjob, "ml", jobDeploymentStatus="Running", jobStatus="RUNNING")
    world.controller.observe_rayjob(world.kube.get_rayjob("ml", rayjob))
    patches_before = sum(1 for call in world.kube.calls if call[0] == "patch_sweep_status")
    world.controller.reconcile_sweep(stub)
    status = world.kube.objects[("TrainingSweep", "ml", "digits")]["status"]
    assert status["phase"] == "Running"  # converged
    assert gets == ["digits"]  # the stale write was refused (409), then one fresh read
    # one refused patch, one that landed onto the fresh copy
    assert sum(1 for call in world.kube.calls if call[0] == "patch_sweep_status") == patches_before + 2
    world.controller.forget_sweep(stub)  # DELETED: forgotten, the next reconcile reads
    world.controller.reconcile_sweep(stub)
    assert gets == ["digits", "digits"]


def test_every_status_write_is_checked_against_the_crd_schema(world: World) -> None:
    """Issue 12, defect 1: a real API server prunes status fields its CRD lacks (trainingStartedAt was one). The fake
    API refuses them instead, so every status patch in these tests is checked; trainingStartedAt now survives."""
    ran(world)
    assert world.status("digits")["trainingStartedAt"]
    with pytest.raises(AssertionError, match="does not fit the CRD schema"):
        world.kube.patch_sweep_status("ml", "digits", {"trainingStarted": "2026-12-02T12:00:00Z"})


def test_a_failed_rayjob_create_frees_the_budget_says_why_and_is_retried(world: World) -> None:
    """Issue 12, defect 9: the ledger admits before the create; a refused create must not keep the GPUs."""
    add_sweep(world, "digits")
    real_create = world.kube.create_rayjob

    def refuse(body: dict[str, Any]) -> Any:
        raise RuntimeError("admission webhook denied the request")

    world.kube.create_rayjob = refuse  # type: ignore[method-assign]  # a double for this test only
    status = world.reconcile("digits")
    assert status["phase"] == "Pending" and "admission webhook denied" in status["message"]
    admitted = next(c for c in status["conditions"] if c["type"] == "Admitted")
    assert (admitted["status"], admitted["reason"]) == ("False", "RayJobCreateFailed")
    assert "RayJobCreateFailed" in world.reasons("digits")
    assert world.controller.ledger.in_use("ml").gpus == 0, "the budget is released"
    world.kube.create_rayjob = real_create  # type: ignore[method-assign]  # a double for this test only
    creates = len([c for c in world.kube.calls if c[0] == "create_rayjob"])
    assert world.reconcile("digits")["phase"] == "Pending", "within the backoff nothing is retried"
    assert len([c for c in world.kube.calls if c[0] == "create_rayjob"]) == creates
    world.clock.now += 5  # CREATE_RETRY_BASE_SECONDS
    assert world.reconcile("digits")["phase"] == "Starting", "after the backoff the next reconcile retries"


def test_the_ledger_counts_a_run_whose_status_write_was_lost(world: World) -> None:
    """Issue 12, defect 9: after a crash between the create and the status write, a restarted operator's ledger
    counts the RayJob's GPUs (from the labelled RayJobs), so a second sweep cannot take them."""
    add_sweep(world, "first", created="2026-12-02T12:00:00Z", **{"spec.tune.maxConcurrentTrials": 4})  # 8 GPUs
    status = world.reconcile("first")
    rayjob = world.kube.get_rayjob("ml", status["rayJobName"])
    world.kube.objects[("TrainingSweep", "ml", "first")]["status"] = {}  # the status write never landed
    restarted = SweepController(
        world.controller.settings,
        world.kube,
        lambda e, r: world.s3,  # type: ignore[arg-type]  # FakeKube is KubeApi's duck-typed double
        lambda *a: None,
        verifier=world.verifier,
        clock=world.clock,
    )
    assert rayjob is not None
    add_sweep(world, "second", created="2026-12-02T12:01:00Z")
    world.kube.ensure_finalizer(world.sweep("second"))
    restarted.reconcile_sweep(world.sweep("second"))
    assert world.status("second")["phase"] == "Queued", "the lost run's 8 GPUs still count"


# ------------------------------------------------------------------ issue 12: the guard and the lifecycle


def test_a_retry_after_a_long_attempt_is_not_killed_by_the_startup_clock(world: World) -> None:
    """Defect 2: during Retrying KubeRay keeps the failed attempt's startTime (rayjob_controller.go, the Retrying
    branch); the startup clock is per attempt and starts again with the next attempt's startTime."""
    add_sweep(world, "digits", **{"spec.failurePolicy.jobRetries": 2, "spec.deadlines.startupSeconds": 600})
    status = world.reconcile("digits")
    name = status["rayJobName"]
    world.kube.set_rayjob_status(
        name, "ml", jobDeploymentStatus="Running", jobStatus="RUNNING", startTime="2026-11-30T00:00:00Z"
    )
    world.reconcile("digits")
    world.clock.now = T0 + 3600  # the first attempt trained for an hour, then failed
    world.kube.set_rayjob_status(name, "ml", jobDeploymentStatus="Retrying", jobStatus="", failed=1)
    status = world.reconcile("digits")
    assert status["phase"] == "Starting", status["message"]
    assert ("delete_rayjob", name) not in world.kube.calls
    world.clock.now = T0 + 3700  # the next attempt starts: a fresh startup clock
    second = datetime.fromtimestamp(T0 + 3690, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    world.kube.set_rayjob_status(name, "ml", jobDeploymentStatus="Initializing", startTime=second)
    status = world.reconcile("digits")
    assert status["phase"] == "Starting" and status["attemptStartedAt"] == second
    world.clock.now = T0 + 3690 + 601  # startupSeconds after the second attempt's start
    status = world.reconcile("digits")
    assert status["phase"] == "Failed" and "startupSeconds=600" in status["message"]


def test_a_retried_rayjob_whose_job_status_was_reset_is_verified(world: World) -> None:
    """Defect 3: jobStatus is "" again while KubeRay retries; the RayJob's annotation names the run, so the guard
    verifies (and holds an unverified run) whatever jobStatus says."""
    status = ran(world)
    world.kube.set_rayjob_status(status["rayJobName"], "ml", jobDeploymentStatus="Retrying", jobStatus="", failed=1)
    rayjob = world.kube.get_rayjob("ml", status["rayJobName"])
    world.verifier.verified = False
    with pytest.raises(RetryLater, match="missing-file"):
        world.controller.guard_rayjob_deletion(rayjob, attempt=0)
    assert world.verifier.calls == [f"s3://bucket/sweeps/ml/digits-{status['runId']}"]


def test_a_sweep_whose_rayjob_is_gone_is_verified_from_its_status(world: World) -> None:
    """Defect 3: the RayJob was deleted (and released) earlier; status.guard still names the run root."""
    status = ran(world)
    del world.kube.objects[("RayJob", "ml", status["rayJobName"])]
    world.verifier.verified = False
    with pytest.raises(RetryLater, match="missing-file"):
        world.controller.guard_sweep_deletion(world.sweep("digits"), attempt=0)
    assert world.verifier.calls == [f"s3://bucket/sweeps/ml/digits-{status['runId']}"]


def test_a_sweep_over_todays_caps_is_still_verified(world: World) -> None:
    """Defect 3: the caps were lowered after admission, so the spec no longer parses with them; the run is still
    known (status.guard) and verified, never released as "never started"."""
    status = ran(world)
    world.controller.settings = Settings(limits=OperatorLimits(max_workers_per_sweep=1), status_poll_seconds=0)
    world.controller.cache.parsed = type(world.controller.cache.parsed)(16)
    world.verifier.verified = False
    with pytest.raises(RetryLater):
        world.controller.guard_sweep_deletion(world.sweep("digits"), attempt=0)
    assert world.verifier.calls == [f"s3://bucket/sweeps/ml/digits-{status['runId']}"]


def test_a_sweep_without_any_run_record_is_held_with_the_reason(world: World) -> None:
    """Defect 3: a run id in status but no root recorded and no spec to derive one: hold, say why."""
    status = ran(world)
    del world.kube.objects[("RayJob", "ml", status["rayJobName"])]
    sweep = world.kube.objects[("TrainingSweep", "ml", "digits")]
    sweep["status"].pop("guard")
    sweep["spec"]["storage"] = {"uri": 7}
    with pytest.raises(RetryLater, match="no recorded run root") as held:
        world.controller.guard_sweep_deletion(world.sweep("digits"), attempt=0)
    assert "sweepctl release" in str(held.value) and world.verifier.calls == []
    verified = next(c for c in world.status("digits")["conditions"] if c["type"] == "CheckpointsVerified")
    assert verified["status"] == "False" and "no recorded run root" in verified["message"]


def test_the_cluster_guard_verifies_with_the_sweeps_own_storage_not_the_operators(world: World) -> None:
    """Defect 4: the RayJob is gone (normal cascade); the cluster's copy of the guard annotation names the
    sweep's endpoint and region."""
    add_sweep(
        world,
        "digits",
        **{"spec.storage.endpointUrl": "https://minio.team-a.example", "spec.storage.region": "ap-south-1"},
    )
    status = world.reconcile("digits")
    rayjob = world.kube.get_rayjob("ml", status["rayJobName"])
    assert rayjob is not None
    cluster = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {
            "name": f"{status['rayJobName']}-abcde",
            "namespace": "ml",
            "labels": dict(rayjob["metadata"]["labels"]),
            "annotations": dict(rayjob["metadata"]["annotations"]),
            "finalizers": [constants.FINALIZER],
        },
        "spec": {"headGroupSpec": {}, "workerGroupSpecs": []},
    }
    del world.kube.objects[("RayJob", "ml", status["rayJobName"])]
    world.s3_clients.clear()
    world.verifier.verified = False
    with pytest.raises(RetryLater):
        world.controller.guard_raycluster_deletion(cluster, attempt=0)
    assert world.verifier.calls == [f"s3://bucket/sweeps/ml/digits-{status['runId']}"]
    assert world.s3_clients and set(world.s3_clients) == {("https://minio.team-a.example", "ap-south-1")}


def test_a_run_that_wrote_nothing_but_its_status_is_released_with_an_audit(world: World) -> None:
    """Defect 5: a bad trainLoop fails before any checkpoint; the driver's status says none was reported; the
    cluster is released (never held forever) with a Warning Event, after verification ran."""
    status = ran(world)
    root = f"bucket/sweeps/ml/digits-{status['runId']}"
    world.put(f"{root}/_sweep/status.json", json.dumps({"phase": "Failed", "trials": {"total": 0}}).encode())
    world.kube.set_rayjob_status(status["rayJobName"], "ml", jobDeploymentStatus="Failed", jobStatus="FAILED")
    world.verifier.result = FakeResult(True, checked=0)
    rayjob = world.kube.get_rayjob("ml", status["rayJobName"])
    reason = world.controller.guard_rayjob_deletion(rayjob, attempt=0)
    assert "nothing to protect" in reason and world.verifier.calls
    audits = [e for e in world.events if e[2] == "CheckpointGuardBypassed"]
    assert audits and "nothing to protect" in audits[0][3]
    # The same run with a checkpoint reported but none found is held.
    world.put(
        f"{root}/_sweep/status.json",
        json.dumps(
            {"bestTrial": {"id": "t1", "checkpointUri": f"s3://{root}/train/t1/checkpoint_epoch-000000"}}
        ).encode(),
    )
    with pytest.raises(RetryLater, match="reported 1"):
        world.controller.guard_rayjob_deletion(rayjob, attempt=0)


def test_a_graceful_stop_at_the_deadline_ends_deadline_exceeded_not_succeeded(world: World) -> None:
    """Defect 8: Tune's budget stopped the trials, the driver exited 0 and the RayJob completed; result.json says
    deadlineReached. The sweep ends DeadlineExceeded, its checkpoints verified, Ready=False."""
    add_sweep(world, "digits")
    status = world.reconcile("digits")
    root = f"bucket/sweeps/ml/digits-{status['runId']}"
    world.kube.set_rayjob_status(status["rayJobName"], "ml", jobDeploymentStatus="Running", jobStatus="RUNNING")
    world.reconcile("digits")
    world.put(
        f"{root}/_sweep/result.json",
        json.dumps({"deadlineReached": True, "trials": {"total": 4, "terminated": 4}}).encode(),
    )
    world.kube.set_rayjob_status(status["rayJobName"], "ml", jobDeploymentStatus="Complete", jobStatus="SUCCEEDED")
    status = world.reconcile("digits")
    assert status["phase"] == "DeadlineExceeded"
    conditions = {c["type"]: c for c in status["conditions"]}
    assert (conditions["DeadlineExceeded"]["status"], conditions["DeadlineExceeded"]["reason"]) == (
        "True",
        "GracefulStop",
    )
    assert conditions["CheckpointsVerified"]["status"] == "True" and conditions["Ready"]["status"] == "False"
    assert world.verifier.calls == [f"s3://{root}"]


def test_a_running_rayjob_whose_trials_never_start_fails_at_the_startup_deadline(world: World) -> None:
    """R6, R20: KubeRay reports Running once the head is up (K8sJobMode: once the submitter exists) while the GPU
    workers are Pending; the startup clock stops only when a trial runs."""
    add_sweep(world, "digits", **{"spec.deadlines.startupSeconds": 60})
    status = world.reconcile("digits")
    world.kube.set_rayjob_status(
        status["rayJobName"],
        "ml",
        jobDeploymentStatus="Running",
        jobStatus="RUNNING",
        rayClusterName=f"{status['rayJobName']}-x7k2p",
    )
    assert world.reconcile("digits")["phase"] == "Running"
    world.clock.now = T0 + 61
    status = world.reconcile("digits")
    assert status["phase"] == "Failed" and "startupSeconds=60" in status["message"]
    assert ("delete_rayjob", status["rayJobName"]) in world.kube.calls


def test_a_running_trial_stops_the_startup_clock(world: World) -> None:
    add_sweep(world, "digits", **{"spec.deadlines.startupSeconds": 60})
    status = world.reconcile("digits")
    world.put(
        f"bucket/sweeps/ml/digits-{status['runId']}/_sweep/status.json",
        json.dumps({"trials": {"total": 2, "running": 1, "pending": 1}}).encode(),
    )
    world.kube.set_rayjob_status(status["rayJobName"], "ml", jobDeploymentStatus="Running", jobStatus="RUNNING")
    world.reconcile("digits")
    world.clock.now = T0 + 600
    assert world.reconcile("digits")["phase"] == "Running"


def test_status_shows_the_namespace_budget_used(world: World) -> None:
    """kubectl get tsw -o wide's NS-BUDGET: GPUs admitted in the namespace against maxGpusPerNamespace."""
    add_sweep(world, "first", created="2026-12-02T12:00:00Z")
    assert world.reconcile("first")["replicas"]["namespaceBudget"] == "4/8"
    add_sweep(world, "second", created="2026-12-02T12:01:00Z", **{"spec.tune.maxConcurrentTrials": 4})
    status = world.reconcile("second")
    assert status["phase"] == "Queued" and status["replicas"]["namespaceBudget"] == "4/8"


def test_a_failed_run_says_what_the_driver_recorded(world: World) -> None:
    """A pre-flight refusal (or a trainLoop that does not import) is in the driver's status.json; KubeRay only has
    the exit code. The sweep's message carries both."""
    add_sweep(world, "digits")
    status = world.reconcile("digits")
    world.put(
        f"bucket/sweeps/ml/digits-{status['runId']}/_sweep/status.json",
        json.dumps(
            {
                "phase": "Failed",
                "trials": {"total": 0},
                "message": "pre-flight: s3:PutObject denied on s3://bucket/sweeps/ml/x",
            }
        ).encode(),
    )
    world.kube.set_rayjob_status(
        status["rayJobName"],
        "ml",
        jobDeploymentStatus="Failed",
        jobStatus="FAILED",
        message="Job entrypoint command failed with exit code 1",
    )
    status = world.reconcile("digits")
    assert status["phase"] == "Failed"
    assert "exit code 1" in status["message"] and "s3:PutObject denied" in status["message"]


@pytest.mark.parametrize("namespace_hours,reads_others", [(0.0, False), (500.0, True)], ids=["no window", "window"])
def test_the_other_sweeps_hours_are_read_only_for_a_namespace_window(
    world: World, monkeypatch: pytest.MonkeyPatch, namespace_hours: float, reads_others: bool
) -> None:
    """The namespace's GPU-hour ledger is read (and written) only where a namespace GPU-hour window exists: a
    namespace without one costs no ledger read on admission or measurement."""
    world.controller.settings = replace(world.controller.settings, namespace_gpu_hours=namespace_hours)
    calls: list[str] = []
    original = world.controller.budgets.hours.read

    def spy(namespace: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(namespace)
        return original(namespace, *args, **kwargs)

    monkeypatch.setattr(world.controller.budgets.hours, "read", spy)
    for name in ("a", "b"):
        add_sweep(world, name)
        assert world.reconcile(name)["phase"] == "Starting"
        world.reconcile(name)  # a running sweep's pass measures its pods
    assert bool(calls) is reads_others, calls


def test_a_held_objects_check_that_comes_early_stays_armed(world: World) -> None:
    """The guard's pipeline re-checks a hold after its backoff (WorkQueue.add_after); a timer that fires a hair
    before the hold's due time must re-arm, never drop the check (the hold would then wait for an event forever)."""
    import time

    from sweep_operator.reconcile.controller import GuardKey

    key = GuardKey(constants.RAYJOB_KIND, "ml", "digits-r1", "u1")
    world.controller.shared.guard_due[key] = time.monotonic() + 30
    world.controller.guarding._guard_pass(key)
    assert world.kube.calls == [], "an early check reads nothing"
    timers = world.controller.guards._timers
    try:
        assert key in timers, "the check is re-armed for the rest of its backoff"
    finally:
        world.controller.guards.stop(timeout=0)


@pytest.mark.parametrize("fails", ["get_object", "remove_finalizer"])
def test_a_guard_pass_whose_read_or_release_fails_is_armed_again_not_dropped(world: World, fails: str) -> None:
    """The API server failing the pipeline's fresh read or its finalizer removal holds the object like any failed
    check, with a backoff: the check is armed again, never left to a watch event that may not come."""
    from kubernetes.client.exceptions import ApiException

    from sweep_operator.reconcile.controller import GuardKey

    add_sweep(world, "digits")
    name = world.reconcile("digits")["rayJobName"]
    world.kube.delete_rayjob("ml", name)  # held by the guard's finalizer
    body = world.kube.get_rayjob("ml", name) or {}
    key = GuardKey(constants.RAYJOB_KIND, "ml", name, body["metadata"]["uid"])

    def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise ApiException(status=503, reason="Service Unavailable")

    setattr(world.kube, fails, unavailable)
    try:
        world.controller.guarding._guard_pass(key)
        assert key in world.controller.shared.guard_due, "the check was dropped"
        assert key in world.controller.guards._timers, "no re-check armed"
        assert world.kube.get_rayjob("ml", name) is not None, "held: nothing released"
    finally:
        world.controller.guards.stop(timeout=0)


def test_a_raised_graceful_window_on_a_deleting_sweep_is_capped_by_the_operator(world: World) -> None:
    """The webhook refuses no edit of a sweep being deleted: a tenant who raises spec.deadlines.gracefulStopSeconds
    there must not keep a held cluster's GPU workers past the operator's maxGracefulStopSeconds (issue 26)."""
    from dataclasses import replace as replace_settings

    sweep = add_sweep(world, "digits", spec__deadlines__gracefulStopSeconds=3600)
    world.controller.settings = replace_settings(world.controller.settings, max_graceful_stop_seconds=120.0)
    assert world.controller.stopper.graceful_seconds(sweep) == 120.0
    world.controller.settings = replace_settings(world.controller.settings, max_graceful_stop_seconds=1e9)
    assert world.controller.stopper.graceful_seconds(sweep) == 3600.0


def test_the_running_sweeps_of_a_namespace_share_one_pod_listing(world: World) -> None:
    """Issue 30: each running sweep's pass reads its clusters' pods for GPU-hours; one LIST of the namespace's Ray
    pods (`PodSnapshots`) answers every sweep there for a third of a poll, and each sweep folds only its own pods."""
    world.controller.settings = replace(world.controller.settings, status_poll_seconds=30.0)
    for name in ("a", "b"):
        add_sweep(world, name)
        rayjob = world.reconcile(name)["rayJobName"]
        world.kube.set_rayjob_status(
            rayjob, "ml", jobDeploymentStatus="Running", jobStatus="RUNNING", rayClusterName=f"{name}-x7k2p"
        )
        world.kube.pods.append(
            {
                "metadata": {"name": f"{name}-x7k2p-worker", "namespace": "ml", "uid": f"uid-{name}",
                             "labels": {constants.RAY_LABEL_CLUSTER: f"{name}-x7k2p"}},
                "spec": {"containers": [{"name": "ray-worker", "resources": {"limits": {constants.GPU_RESOURCE: "1"}}}]},
                "status": {"phase": "Running", "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-02T12:00:00Z"}]},
            }
        )  # fmt: skip
    world.kube.calls.clear()
    usage = {name: world.reconcile(name)["usage"] for name in ("a", "b")}
    assert [c for c in world.kube.calls if c[0] == "list_pods"] == [("list_pods", "ml", constants.RAY_LABEL_CLUSTER)]
    for name in ("a", "b"):
        assert [i["name"] for i in usage[name]["podIntervals"]] == [f"{name}-x7k2p-worker"], usage[name]


def test_progress_alone_waits_for_its_mirror_slot_and_the_next_write_carries_the_latest(world: World) -> None:
    """A change of progress alone is written at most once per progressMirrorSeconds; a change that cannot wait (here
    a refused spec edit) is written at once, with the latest progress read, so no progress is lost."""
    status = ran(world)
    progress = f"bucket/sweeps/ml/digits-{status['runId']}/_sweep/status.json"
    world.put(progress, json.dumps({"trials": {"total": 8, "running": 2}}).encode())
    assert world.reconcile("digits")["trialsSummary"] == "0/8 (2 running)", "the first progress: at once"
    world.controller.settings = replace(world.controller.settings, progress_mirror_seconds=3600)
    writes = world.kube.calls.count(("patch_sweep_status", "digits"))
    world.put(progress, json.dumps({"trials": {"total": 8, "running": 1, "terminated": 1}}).encode())
    assert world.reconcile("digits")["trialsSummary"] == "0/8 (2 running)", "progress alone waits"
    world.put(progress, json.dumps({"trials": {"total": 8, "running": 1, "terminated": 2}}).encode())
    assert world.reconcile("digits")["trialsSummary"] == "0/8 (2 running)"
    assert world.kube.calls.count(("patch_sweep_status", "digits")) == writes
    obj = world.kube.objects[("TrainingSweep", "ml", "digits")]
    obj["spec"]["tune"]["numSamples"] = 99
    obj["metadata"]["generation"] = 2
    world.kube._bump(obj)
    status = world.reconcile("digits")
    assert "spec change refused" in status["message"], "written at once"
    assert status["trialsSummary"] == "2/8 (1 running)", "with the latest progress read"
    assert world.kube.calls.count(("patch_sweep_status", "digits")) == writes + 1
