"""Pure operator decisions: RayJob facts -> phase, conditions, progress; startup diagnosis (R6, R20)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sweep_operator.diagnosis import diagnose_startup
from sweep_operator.status import (
    RayJobFacts,
    phase_for,
    planned_trials,
    progress_patch,
    set_condition,
    trials_summary,
)
from sweep_operator.validation import parse_sweep
from tests.support.factories import changed, cpu_sweep

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def rayjob(deployment: str = "", job: str = "", reason: str = "", cluster: str = "") -> dict:
    return {
        "metadata": {"name": "digits-abc123"},
        "status": {"jobDeploymentStatus": deployment, "jobStatus": job, "reason": reason, "rayClusterName": cluster},
    }


@pytest.mark.parametrize(
    ("deployment", "job", "reason", "phase"),
    [
        ("", "", "", "Starting"),
        ("Initializing", "", "", "Starting"),
        ("Waiting", "", "", "Starting"),
        ("Retrying", "", "", "Starting"),
        ("Running", "PENDING", "", "Running"),
        ("Running", "RUNNING", "", "Running"),
        ("Complete", "SUCCEEDED", "", "Succeeded"),
        ("Complete", "FAILED", "", "Failed"),
        ("Complete", "STOPPED", "", "Failed"),
        ("Failed", "FAILED", "AppFailed", "Failed"),
        ("Failed", "", "SubmissionFailed", "Failed"),
        ("Failed", "RUNNING", "DeadlineExceeded", "DeadlineExceeded"),
        ("Suspended", "", "", "Suspended"),
    ],
)
def test_phase_follows_kuberay_deployment_status(deployment: str, job: str, reason: str, phase: str) -> None:
    assert phase_for(RayJobFacts.from_object(rayjob(deployment, job, reason))) == phase


def test_facts_mirror_the_cluster_name_that_changes_on_retry() -> None:
    first = RayJobFacts.from_object(rayjob("Running", "RUNNING", cluster="digits-abc123-x7k2p"))
    retry = RayJobFacts.from_object(rayjob("Retrying", "", cluster="digits-abc123-q9w8e"))
    assert first.cluster_name != retry.cluster_name and retry.cluster_name == "digits-abc123-q9w8e"


def test_condition_transition_time_moves_only_when_status_flips() -> None:
    conditions = set_condition(None, "Running", False, "Starting", "waiting", T0, 1)
    same = set_condition(conditions, "Running", False, "Starting", "still waiting", T0 + timedelta(minutes=5), 1)
    assert same[0].last_transition_time == "2026-12-02T12:00:00Z" and same[0].message == "still waiting"
    flipped = set_condition(same, "Running", True, "Running", "trials running", T0 + timedelta(minutes=7), 2)
    assert flipped[0].last_transition_time == "2026-12-02T12:07:00Z"
    assert flipped[0].model_dump(by_alias=True) == {
        "type": "Running",
        "status": "True",
        "reason": "Running",
        "message": "trials running",
        "lastTransitionTime": "2026-12-02T12:07:00Z",
        "observedGeneration": 2,
    }
    both = set_condition(flipped, "Admitted", True, "Admitted", "", T0, 2)
    assert [c.type for c in both] == ["Admitted", "Running"]


def test_progress_from_status_file() -> None:
    doc = {
        "trials": {"total": 8, "pending": 2, "running": 2, "terminated": 3, "errored": 1},
        "bestTrial": {
            "id": "t3",
            "metric": "val_loss",
            "value": 0.12,
            "config": {"lr": 0.01},
            "checkpointUri": "s3://b/k",
        },
    }
    patch = progress_patch(doc)
    assert patch["trialsSummary"] == "4/8 (2 running)"
    assert patch["bestSummary"] == "val_loss=0.12"
    assert patch["trials"]["running"] == 2
    assert patch["bestTrial"] == {
        "id": "t3",
        "metric": "val_loss",
        "value": 0.12,
        "config": {"lr": 0.01},
        "checkpointUri": "s3://b/k",
    }


def test_progress_tolerates_partial_or_odd_files() -> None:
    patch = progress_patch({"trials": {"running": 1, "pending": "x"}, "bestTrial": {"value": float("nan")}})
    assert patch["trials"] == {"pending": 0, "running": 1, "terminated": 0, "errored": 0, "total": 1}
    assert "bestTrial" not in patch or "value" not in patch["bestTrial"]
    assert trials_summary({"total": 0}) == "0/0"


def test_trials_column_counts_finished_against_the_trials_asked_for() -> None:
    """Issue 28: TRIALS read Ray's count of trials started so far (`0/1` while the first trained, `2/2` for a
    100-sample sweep two trials in); it is finished / numSamples (x the grid's points), with the running ones."""
    spec = parse_sweep(changed(cpu_sweep(), {"spec.tune.numSamples": 100})).spec
    first_training = {"trials": {"total": 1, "running": 1}}
    two_done = {"trials": {"total": 2, "terminated": 2}}
    assert progress_patch(first_training, spec)["trialsSummary"] == "0/100 (1 running)"
    assert progress_patch(two_done, spec)["trialsSummary"] == "2/100"
    assert trials_summary({}, planned_trials(spec)) == "0/100"
    grid = parse_sweep(changed(cpu_sweep(), {"spec.paramSpace.hidden": {"grid": [32, 64, 128]}})).spec
    assert planned_trials(grid) == 8 * 3  # Tune repeats the whole grid numSamples times
    # More trials than asked (a resumed Tune experiment that kept extra ones) never reads as over 100 %.
    assert trials_summary({"total": 30, "terminated": 30}, 24) == "30/30"


def test_best_column_is_rounded_and_the_exact_value_kept() -> None:
    patch = progress_patch({"bestTrial": {"id": "t1", "metric": "val_loss", "value": 0.123456789012345678}})
    assert patch["bestSummary"] == "val_loss=0.1235"
    assert patch["bestTrial"]["value"] == 0.123456789012345678
    assert "bestSummary" not in progress_patch({"bestTrial": {"id": "t1", "value": float("nan")}})


def pending_pod(name: str, role: str, reason: str, message: str) -> dict:
    return {
        "metadata": {"name": name, "labels": {"ray.io/node-type": role, "ray.io/cluster": "c1"}},
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": reason, "message": message}],
        },
    }


def test_diagnosis_names_insufficient_gpus_for_pending_workers() -> None:
    """R6, R20: the condition message says which layer blocks the start and what to check."""
    pods = [
        pending_pod(
            "c1-worker-a", "worker", "Unschedulable", "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
        ),
        pending_pod(
            "c1-worker-b", "worker", "Unschedulable", "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
        ),
        {"metadata": {"name": "c1-head", "labels": {"ray.io/node-type": "head"}}, "status": {"phase": "Running"}},
    ]
    message = diagnose_startup(pods, [], cluster_name="c1")
    assert "2 workers Pending: Insufficient nvidia.com/gpu" in message
    assert "0/3 nodes are available" in message and "EC2 capacity" in message
    assert "head" not in message


def test_diagnosis_image_pull_and_quota_and_selector() -> None:
    pods = [
        {
            "metadata": {"name": "c1-head", "labels": {"ray.io/node-type": "head"}},
            "status": {
                "phase": "Pending",
                "containerStatuses": [
                    {
                        "state": {
                            "waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "bad:tag"'}
                        }
                    }
                ],
            },
        },
        pending_pod(
            "c1-worker-a",
            "worker",
            "Unschedulable",
            "0/5 nodes are available: 5 node(s) didn't match Pod's node affinity/selector.",
        ),
    ]
    events = [
        {
            "type": "Warning",
            "reason": "FailedCreateWorkerPod",
            "message": 'pods "c1-worker-b" is forbidden: exceeded quota: gpu-quota',
            "involvedObject": {"kind": "RayCluster", "name": "c1"},
        },
    ]
    message = diagnose_startup(pods, events, cluster_name="c1")
    assert "1 head Pending: ImagePullBackOff" in message and "bad:tag" in message
    assert "Unschedulable (selector/taints)" in message
    assert "RayCluster ResourceQuota exceeded" in message


def test_diagnosis_uses_failed_scheduling_events() -> None:
    pod = {
        "metadata": {"name": "c1-worker-a", "labels": {"ray.io/node-type": "worker"}},
        "status": {"phase": "Pending"},
    }
    event = {
        "type": "Warning",
        "reason": "FailedScheduling",
        "message": "0/2 nodes are available: 2 Insufficient memory.",
        "involvedObject": {"kind": "Pod", "name": "c1-worker-a"},
    }
    assert "Insufficient memory" in diagnose_startup([pod], [event])


def test_diagnosis_without_pods_points_at_kuberay() -> None:
    assert "KubeRay may not have created it" in diagnose_startup([], [], cluster_name="c1")


def test_diagnosis_reports_the_worker_group_cap_separately() -> None:
    assert "capped at maxReplicas 4 < 6 wanted" in diagnose_startup([], [], worker_cap=4, workers_wanted=6)


# The guard's decisions are tables in tests/unit/test_guard.py.
