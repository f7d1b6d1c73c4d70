"""Spec parsing and semantic validation: every bad input is exit 2 with a message naming its field path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweep_contracts.problems import SpecError
from sweep_operator.cli import main as sweepctl
from sweep_operator.validation import parse_sweep, validate_sweep
from tests.support.factories import DELETE, changed, cpu_sweep, gpu_sweep

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# (case id, changes to the valid GPU sweep, field path the message must name, text the message must contain)
INVALID_SPECS: list[tuple[str, dict[str, Any], str, str]] = [
    ("typo-top-level-spec-field", {"spec.tunee": {}}, "spec.tunee", "unknown field"),
    ("typo-nested-field", {"spec.tune.maxConcurentTrials": 2}, "spec.tune.maxConcurentTrials", "maxConcurrentTrials"),
    ("train-loop-without-colon", {"spec.trainLoop": "my.module.train"}, "spec.trainLoop", "module:function"),
    ("train-loop-bad-module", {"spec.trainLoop": "1pkg.mod:fn"}, "spec.trainLoop", "'1pkg.mod:fn'"),
    ("storage-not-s3", {"spec.storage.uri": "gs://bucket/sweeps"}, "spec.storage.uri", "s3://"),
    ("storage-bad-bucket", {"spec.storage.uri": "s3://My_Bucket/sweeps"}, "spec.storage.uri", "bucket 'My_Bucket'"),
    ("storage-no-prefix", {"spec.storage.uri": "s3://bucket"}, "spec.storage.uri", "no prefix"),
    ("storage-missing", {"spec.storage": DELETE}, "spec.storage", "required"),
    (
        "param-unknown-distribution",
        {"spec.paramSpace.lr": {"logunifrom": [1e-4, 1e-1]}},
        "spec.paramSpace.lr",
        "logunifrom",
    ),
    ("param-log-bound-not-positive", {"spec.paramSpace.lr": {"loguniform": [0, 1]}}, "spec.paramSpace.lr", "> 0"),
    (
        "param-bounds-reversed",
        {"spec.paramSpace.drop": {"uniform": [0.5, 0.1]}},
        "spec.paramSpace.drop",
        "low must be < high",
    ),
    ("param-empty-choice", {"spec.paramSpace.hidden": {"choice": []}}, "spec.paramSpace.hidden", "non-empty"),
    ("param-randint-float", {"spec.paramSpace.seed": {"randint": [0.5, 10]}}, "spec.paramSpace.seed", "integer bounds"),
    (
        "param-quniform-q",
        {"spec.paramSpace.batch": {"quniform": [16, 256, 0]}},
        "spec.paramSpace.batch",
        "q must be > 0",
    ),
    ("param-bare-list", {"spec.paramSpace.hidden": [64, 128]}, "spec.paramSpace.hidden", "choice"),
    ("param-reserved-name", {"spec.paramSpace._sweep_ctx": 1}, "spec.paramSpace._sweep_ctx", "reserved"),
    ("mode-not-enum", {"spec.tune.mode": "minimum"}, "spec.tune.mode", "'minimum'"),
    ("num-samples-zero", {"spec.tune.numSamples": 0}, "spec.tune.numSamples", ">= 1"),
    (
        "scheduler-needs-metric",
        {"spec.tune.metric": DELETE, "spec.tune.mode": DELETE, "spec.checkpoints": {}},
        "spec.tune.metric",
        "asha",
    ),
    ("metric-without-mode", {"spec.tune.mode": DELETE}, "spec.tune.mode", "metric='val_loss'"),
    ("scheduler-unknown-type", {"spec.tune.scheduler.type": "bohb"}, "spec.tune.scheduler.type", "'bohb'"),
    ("asha-grace-over-max-t", {"spec.tune.scheduler.gracePeriod": 10}, "spec.tune.scheduler.gracePeriod", "maxT"),
    ("grid-searcher-with-sampled", {"spec.tune.searcher.type": "grid"}, "spec.tune.searcher.type", "lr"),
    (
        "optuna-with-grid",
        {"spec.tune.searcher.type": "optuna", "spec.paramSpace.x": {"grid": [1, 2]}},
        "spec.paramSpace.x",
        "optuna",
    ),
    (
        "pbt-without-mutations",
        {"spec.tune.scheduler": {"type": "pbt"}},
        "spec.tune.scheduler.hyperparamMutations",
        "required by pbt",
    ),
    (
        "pbt-mutation-not-in-param-space",
        {"spec.tune.scheduler": {"type": "pbt", "hyperparamMutations": ["lr_"]}},
        "spec.tune.scheduler.hyperparamMutations[0]",
        "did you mean 'lr'?",
    ),
    (
        "pbt-mutation-of-a-constant",
        {"spec.tune.scheduler": {"type": "pbt", "hyperparamMutations": ["epochs"]}},
        "spec.tune.scheduler.hyperparamMutations[0]",
        "a constant",
    ),
    (
        "pbt-mutation-of-a-grid",
        {"spec.tune.scheduler": {"type": "pbt", "hyperparamMutations": ["x"]}, "spec.paramSpace.x": {"grid": [1, 2]}},
        "spec.tune.scheduler.hyperparamMutations[0]",
        "use {choice: [..]}",
    ),
    (
        "pbt-quantile-over-half",
        {"spec.tune.scheduler": {"type": "pbt", "hyperparamMutations": ["lr"], "quantileFraction": 0.6}},
        "spec.tune.scheduler.quantileFraction",
        "<= 0.5",
    ),
    (
        "pbt-resample-probability-over-one",
        {"spec.tune.scheduler": {"type": "pbt", "hyperparamMutations": ["lr"], "resampleProbability": 1.5}},
        "spec.tune.scheduler.resampleProbability",
        "<= 1",
    ),
    (
        "pbt-perturbation-interval-zero",
        {"spec.tune.scheduler": {"type": "pbt", "hyperparamMutations": ["lr"], "perturbationInterval": 0}},
        "spec.tune.scheduler.perturbationInterval",
        "> 0",
    ),
    (
        "pbt-synch-not-boolean",
        {"spec.tune.scheduler": {"type": "pbt", "hyperparamMutations": ["lr"], "synch": "yes"}},
        "spec.tune.scheduler.synch",
        "true or false",
    ),
    (
        "pbt-population-of-one",
        {"spec.tune.scheduler": {"type": "pbt", "hyperparamMutations": ["lr"]}, "spec.tune.numSamples": 1},
        "spec.tune.numSamples",
        "population of at least 2",
    ),
    (
        "pbt-with-optuna",
        {"spec.tune.scheduler": {"type": "pbt", "hyperparamMutations": ["lr"]}, "spec.tune.searcher.type": "optuna"},
        "spec.tune.searcher.type",
        "cannot be used with pbt",
    ),
    (
        "worker-failures-below-minus-one",
        {"spec.failurePolicy.workerFailures": -2},
        "spec.failurePolicy.workerFailures",
        ">= -1",
    ),
    ("job-retries-negative", {"spec.failurePolicy.jobRetries": -1}, "spec.failurePolicy.jobRetries", ">= 0"),
    (
        "failure-policy-not-integer",
        {"spec.failurePolicy.controllerFailures": 2.5},
        "spec.failurePolicy.controllerFailures",
        "integer",
    ),
    ("startup-not-before-active", {"spec.deadlines.startupSeconds": 21600}, "spec.deadlines.startupSeconds", "21600"),
    (
        "graceful-not-before-active",
        {"spec.deadlines.gracefulStopSeconds": 30000},
        "spec.deadlines.gracefulStopSeconds",
        "30000",
    ),
    (
        "active-over-operator-max",
        {"spec.deadlines.activeSeconds": 10**7},
        "spec.deadlines.activeSeconds",
        "maxActiveSeconds",
    ),
    (
        "memory-not-a-quantity",
        {"spec.trial.resourcesPerWorker.memory": "24GB"},
        "spec.trial.resourcesPerWorker.memory",
        "'24GB'",
    ),
    ("cpu-zero", {"spec.trial.resourcesPerWorker.cpu": "0"}, "spec.trial.resourcesPerWorker.cpu", "greater than zero"),
    (
        "gpus-do-not-fit-node",
        {"spec.trial.resourcesPerWorker.gpu": 2},
        "spec.trial.resourcesPerWorker.gpu",
        "g5.2xlarge (1 GPU)",
    ),
    (
        "gpu-without-instance-type",
        {"spec.workerGroup.instanceType": DELETE},
        "spec.workerGroup.instanceType",
        "gpu > 0",
    ),
    (
        "unknown-instance-type",
        {"spec.workerGroup.instanceType": "g9.huge"},
        "spec.workerGroup.instanceType",
        "'g9.huge'",
    ),
    (
        "cpu-does-not-fit-node",
        {"spec.trial.resourcesPerWorker.cpu": 8},
        "spec.trial.resourcesPerWorker.cpu",
        "allocatable",
    ),
    ("ray-version-unsupported", {"spec.rayVersion": "2.9.0"}, "spec.rayVersion", "'2.58.0'"),
    ("name-not-dns", {"metadata.name": "Digits_Sweep"}, "metadata.name", "'Digits_Sweep'"),
    ("workers-zero", {"spec.trial.workers": 0}, "spec.trial.workers", ">= 1"),
    ("min-replicas-over-demand", {"spec.workerGroup.minReplicas": 5}, "spec.workerGroup.minReplicas", "(4)"),
    ("wrong-kind", {"kind": "TrainingSweeps"}, "kind", "TrainingSweep"),
    ("bad-region", {"spec.storage.region": "oregon"}, "spec.storage.region", "'oregon'"),
    ("bad-endpoint", {"spec.storage.endpointUrl": "minio:9000"}, "spec.storage.endpointUrl", "http"),
    ("suspend-not-boolean", {"spec.suspend": "yes"}, "spec.suspend", "true or false"),
    ("over-worker-cap", {"spec.trial.workers": 10}, "spec.trial.workers", "maxWorkersPerSweep 16"),
    (
        "toleration-exists-with-value",
        {"spec.workerGroup.tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]},
        "spec.workerGroup.tolerations[0].value",
        "Exists",
    ),
    (
        "score-attribute-without-order",
        {
            "spec.checkpoints": {"scoreAttribute": "acc"},
            "spec.tune.metric": DELETE,
            "spec.tune.mode": DELETE,
            "spec.tune.scheduler": {"type": "fifo"},
        },
        "spec.checkpoints.scoreOrder",
        "'acc'",
    ),
    # Size limits (issue 15): every string, list and map is bounded, in the CRD and here.
    ("image-too-long", {"spec.image": "registry.example/" + "a" * 600}, "spec.image", "at most 512"),
    ("train-loop-too-long", {"spec.trainLoop": "m" * 300 + ":f"}, "spec.trainLoop", "at most 256"),
    ("storage-uri-too-long", {"spec.storage.uri": "s3://bucket/" + "p" * 1100}, "spec.storage.uri", "at most 1024"),
    ("metric-name-too-long", {"spec.tune.metric": "m" * 129}, "spec.tune.metric", "at most 128"),
    (
        "param-space-too-many",
        {"spec.paramSpace": {f"p{i}": 1 for i in range(65)}},
        "spec.paramSpace",
        "65 entries; at most 64",
    ),
    (
        "tolerations-too-many",
        {"spec.workerGroup.tolerations": [{"key": f"k{i}"} for i in range(33)]},
        "spec.workerGroup.tolerations",
        "33 items; at most 32",
    ),
    (
        "node-selector-too-many",
        {"spec.workerGroup.nodeSelector": {f"k{i}": "v" for i in range(33)}},
        "spec.workerGroup.nodeSelector",
        "at most 32",
    ),
    ("quantity-too-long", {"spec.head.memory": "1" * 65}, "spec.head.memory", "at most 64"),
    (
        "toleration-value-too-long",
        {"spec.workerGroup.tolerations": [{"key": "k", "value": "v" * 64}]},
        "spec.workerGroup.tolerations[0].value",
        "at most 63",
    ),
    (
        "service-account-not-a-name",
        {"spec.storage.serviceAccountName": "Runner_A"},
        "spec.storage.serviceAccountName",
        "DNS-1123",
    ),
    (
        "verification-timeout-over-cap",
        {"spec.deletion.verificationTimeoutSeconds": 7200},
        "spec.deletion.verificationTimeoutSeconds",
        "maxVerificationTimeoutSeconds 1800",
    ),
]


def test_the_base_factories_are_valid() -> None:
    assert validate_sweep(gpu_sweep()) == []
    assert validate_sweep(cpu_sweep()) == []


def test_invalid_table_has_at_least_25_distinct_cases() -> None:
    assert len({case[0] for case in INVALID_SPECS}) == len(INVALID_SPECS) >= 25


@pytest.mark.parametrize(("case", "changes", "path", "text"), INVALID_SPECS, ids=[c[0] for c in INVALID_SPECS])
def test_sweepctl_validate_rejects_invalid_spec(
    case: str, changes: dict[str, Any], path: str, text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / f"{case}.yaml"
    manifest.write_text(yaml.safe_dump(changed(gpu_sweep(), changes)))
    assert sweepctl(["validate", "-f", str(manifest)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if f": {path}: " in line]
    assert lines, f"no problem names {path!r}:\n{err}"
    assert any(text in line for line in lines), f"no message for {path} mentions {text!r}:\n{err}"


def test_all_problems_are_collected_not_just_the_first() -> None:
    doc = changed(
        gpu_sweep(),
        {"spec.tune.mode": "up", "spec.trainLoop": "x", "spec.storage.uri": "gs://b/p", "spec.trial.workers": -1},
    )
    paths = {p.path for p in validate_sweep(doc)}
    assert {"spec.tune.mode", "spec.trainLoop", "spec.storage.uri", "spec.trial.workers"} <= paths


def test_unknown_field_suggests_the_close_name() -> None:
    (problem,) = validate_sweep(changed(gpu_sweep(), {"spec.trial.resourcesPerWorker.gpus": 1}))
    assert problem.path == "spec.trial.resourcesPerWorker.gpus"
    assert "did you mean 'gpu'" in problem.message


def test_trainer_resources_is_not_part_of_the_api() -> None:
    """R4: `trainer_resources` raises in Train V2, so the API has no such field and a typo-like field is refused."""
    problems = validate_sweep(changed(gpu_sweep(), {"spec.trial.trainerResources": {"CPU": 1}}))
    assert [p.path for p in problems] == ["spec.trial.trainerResources"]


def test_defaults_are_applied() -> None:
    doc = {
        "apiVersion": "sweeps.dev/v1alpha1",
        "kind": "TrainingSweep",
        "metadata": {"name": "minimal"},
        "spec": {"image": "img", "trainLoop": "m:f", "storage": {"uri": "s3://bucket/p"}},
    }
    sweep = parse_sweep(doc)
    assert sweep.namespace == "default"
    spec = sweep.spec
    assert spec.ray_version == "2.58.0"
    assert (spec.tune.num_samples, spec.tune.max_concurrent_trials) == (1, 1)
    assert spec.tune.scheduler.type == "fifo" and spec.tune.searcher.type == "random"
    assert spec.deadlines.active_seconds is None  # the operator's defaultActiveSeconds applies
    assert spec.deletion.verify_checkpoints is True


def test_failure_policy_defaults_are_finite() -> None:
    """R12: Ray's defaults retry controller failures and preemptions forever; ours are finite and explicit."""
    doc = changed(cpu_sweep(), {"spec.failurePolicy": DELETE})
    policy = parse_sweep(doc).spec.failure_policy
    assert policy.controller_failures >= 0 and policy.preemption_failures >= 0 and policy.worker_failures >= 0
    assert policy.job_retries == 0 and policy.trial_failures == 0


def test_spec_error_lists_every_problem() -> None:
    with pytest.raises(SpecError) as caught:
        parse_sweep(changed(gpu_sweep(), {"spec.tune.mode": "x", "spec.trial.workers": 0}))
    assert len(caught.value.problems) == 2
    assert "spec.tune.mode" in str(caught.value) and "spec.trial.workers" in str(caught.value)


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_examples_are_valid(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert sweepctl(["validate", "-f", str(example)]) == 0, capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "text"),
    [
        ("- just\n- a list\n", "expected a TrainingSweep object"),
        ("spec: [unclosed\n", "not valid YAML"),
        ("", "no YAML document"),
    ],
)
def test_validate_never_tracebacks_on_garbage(tmp_path: Path, content: str, text: str) -> None:
    manifest = tmp_path / "garbage.yaml"
    manifest.write_text(content)
    proc = subprocess.run(
        [sys.executable, "-m", "sweep_operator.cli", "validate", "-f", str(manifest)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert text in proc.stderr
    assert "Traceback" not in proc.stderr


def test_validate_missing_file_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert sweepctl(["validate", "-f", "/nonexistent/sweep.yaml"]) == 2
    assert "cannot read /nonexistent/sweep.yaml" in capsys.readouterr().err


def test_validate_with_limits_file_names_cap_and_demand(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    limits = tmp_path / "limits.yaml"
    limits.write_text("maxGpusPerSweep: 2\n")
    manifest = tmp_path / "sweep.yaml"
    manifest.write_text(yaml.safe_dump(gpu_sweep()))
    assert sweepctl(["validate", "-f", str(manifest), "--limits", str(limits)]) == 2
    err = capsys.readouterr().err
    assert "demand of 4 GPUs" in err and "maxGpusPerSweep 2" in err


def test_bad_limits_file_names_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    limits = tmp_path / "limits.yaml"
    limits.write_text("maxGpusPerSwep: 2\n")
    manifest = tmp_path / "sweep.yaml"
    manifest.write_text(yaml.safe_dump(gpu_sweep()))
    assert sweepctl(["validate", "-f", str(manifest), "--limits", str(limits)]) == 2
    assert "maxGpusPerSwep" in capsys.readouterr().err


# ---- resume (issue 16): edits that make no sense for a resume are refused by the API server (CEL rules at the CRD's
# root) and by the webhook (validation.transition_problems), with the same message naming the field.

RAN = {"status": {"runId": "r1abcd", "phase": "DeadlineExceeded"}}

REFUSED_EDITS: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "another train loop",
        {"spec.trainLoop": "training_entrypoints.loops.other:train_loop"},
        "spec.trainLoop",
        "cannot change once the sweep has run",
    ),
    ("another param space", {"spec.paramSpace.hidden": {"choice": [64, 256]}}, "spec.paramSpace", "cannot change"),
    ("another storage uri", {"spec.storage.uri": "s3://bucket/elsewhere"}, "spec.storage.uri", "cannot change"),
    (
        "another endpoint",
        {"spec.storage.endpointUrl": "http://minio:9000"},
        "spec.storage.endpointUrl",
        "cannot change",
    ),
    ("another region", {"spec.storage.region": "eu-west-1"}, "spec.storage.region", "cannot change"),
    (
        "another metric",
        {"spec.tune.metric": "val_acc", "spec.checkpoints.scoreAttribute": "val_acc"},
        "spec.tune.metric",
        "cannot change",
    ),
    (
        "another mode",
        {"spec.tune.mode": "max", "spec.checkpoints.scoreOrder": "max"},
        "spec.tune.mode",
        "cannot change",
    ),
    ("another searcher", {"spec.tune.searcher": {"type": "random", "seed": 7}}, "spec.tune.searcher", "cannot change"),
    ("fewer samples", {"spec.tune.numSamples": 4}, "spec.tune.numSamples", "cannot go down once the sweep has run"),
]


def crd_schema() -> Any:
    from sweep_sandbox import emulator

    return emulator.compiled_schema("TrainingSweep", "sweeps.dev", emulator.sweep_crd()["spec"]["versions"][0])


def api_server_errors(new: dict[str, Any], old: dict[str, Any] | None) -> list[str]:
    """What the strict API emulator answers (defaulted as the apiserver decodes both)."""
    import copy

    schema = crd_schema()
    new, old = copy.deepcopy(new), copy.deepcopy(old)
    schema.decode(new)
    if old is not None:
        schema.decode(old)
    return [str(e) for e in schema.errors(new, old)]


@pytest.mark.parametrize(("case", "changes", "path", "text"), REFUSED_EDITS, ids=[c[0] for c in REFUSED_EDITS])
def test_a_resume_refuses_edits_to_what_defines_the_run(
    case: str, changes: dict[str, Any], path: str, text: str
) -> None:
    from sweep_operator.validation import transition_problems

    old = changed(gpu_sweep(), RAN)
    new = changed(old, {**changes, "spec.resume": {"generation": 1, "activeSeconds": 3600}})
    webhook = [p for p in transition_problems(new, old) if p.path == path]
    assert len(webhook) == 1 and text in webhook[0].message, transition_problems(new, old)
    api = api_server_errors(new, old)
    assert f'{path}: Invalid value: "object": {webhook[0].message}' in api, api  # the same words on both paths
    # Before the sweep ever ran the same edit is fine: there is no run root to keep.
    fresh = changed(gpu_sweep(), {**changes, "status": {"phase": "Invalid"}})
    assert transition_problems(changed(fresh, changes), changed(gpu_sweep(), {"status": {"phase": "Invalid"}})) == []


@pytest.mark.parametrize(
    "changes",
    [
        {"spec.resume": {"generation": 1}},
        {"spec.resume": {"generation": 1, "activeSeconds": 7200}, "spec.tune.numSamples": 12},
        {"spec.resume": {"generation": 1}, "spec.image": "registry.example/train:2", "spec.trial.workers": 1},
    ],
    ids=["resume", "more time and samples", "resume with another image"],
)
def test_a_resume_of_an_ended_sweep_is_admitted(changes: dict[str, Any]) -> None:
    from sweep_operator.validation import transition_problems

    old = changed(gpu_sweep(), RAN)
    new = changed(old, changes)
    assert transition_problems(new, old) == [] and api_server_errors(new, old) == []
    assert validate_sweep(new) == []


@pytest.mark.parametrize("phase", [None, "Pending", "Queued", "Starting", "Running", "Suspended", "Invalid"])
def test_a_resume_of_a_sweep_that_has_not_ended_is_refused_saying_its_phase(phase: str | None) -> None:
    from sweep_operator.validation import transition_problems

    old = changed(gpu_sweep(), {"status": {"phase": phase}} if phase else {})
    new = changed(old, {"spec.resume": {"generation": 1}})
    (problem,) = transition_problems(new, old)
    assert problem.path == "spec.resume.generation" and problem.message.endswith(f"this sweep is {phase or 'Pending'}")
    assert f'spec.resume.generation: Invalid value: "object": {problem.message}' in api_server_errors(new, old)


@pytest.mark.parametrize(
    ("old_resume", "new_resume"),
    [({"generation": 2}, {"generation": 1}), ({"generation": 2}, None)],
    ids=["generation lowered", "resume removed"],
)
def test_the_resume_generation_only_goes_up(old_resume: dict[str, Any], new_resume: dict[str, Any] | None) -> None:
    from sweep_operator.validation import transition_problems

    old = changed(gpu_sweep(), {**RAN, "spec.resume": old_resume})
    new = changed(old, {"spec.resume": new_resume if new_resume is not None else DELETE})
    (problem,) = transition_problems(new, old)
    assert problem.path == "spec.resume" and "may only go up" in problem.message
    assert f'spec.resume: Invalid value: "object": {problem.message}' in api_server_errors(new, old)


def test_resume_active_seconds_must_fit_the_startup_and_graceful_windows_and_the_cap() -> None:
    from sweep_operator.settings import OperatorLimits

    short = changed(gpu_sweep(), {"spec.resume": {"generation": 1, "activeSeconds": 240}})  # startup 1800, graceful 300
    problems = validate_sweep(short)
    assert [p.path for p in problems] == ["spec.resume.activeSeconds"] * 2
    assert {p.message for p in problems} == {
        "must be more than spec.deadlines.startupSeconds",
        "must be more than spec.deadlines.gracefulStopSeconds",
    }
    assert sorted(api_server_errors(short, None)) == sorted(
        f'spec.resume.activeSeconds: Invalid value: "object": {p.message}' for p in problems
    )
    long = changed(gpu_sweep(), {"spec.resume": {"generation": 1, "activeSeconds": 90_000}})
    (problem,) = validate_sweep(long, OperatorLimits(max_active_seconds=86_400, default_active_seconds=3600))
    assert problem.path == "spec.resume.activeSeconds" and "exceeds maxActiveSeconds 86400s" in problem.message
    assert validate_sweep(changed(gpu_sweep(), {"spec.resume": {"generation": 0}}))[0].path == "spec.resume.generation"
    assert (
        validate_sweep(changed(gpu_sweep(), {"spec.failurePolicy.resumeOnClusterLoss": -1}))[0].path
        == "spec.failurePolicy.resumeOnClusterLoss"
    )
