"""Rendering a sweep as a KubeRay v1 RayJob: KubeRay's v1.7.0 schema, core pod schemas, KubeRay's own rules,
and the review rules about placement, resources, retries and storage."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from sweep_contracts import constants, s3_layout
from sweep_contracts.runspec import RunSpec
from sweep_operator.cli import main as sweepctl
from sweep_operator.reconcile.drift import worker_cap
from sweep_operator.rendering import (
    RenderContext,
    build_rayjob,
    new_run_id,
    rayjob_name,
    run_id_for,
    runtime_env_yaml,
)
from sweep_operator.settings import OperatorLimits
from sweep_operator.validation import parse_sweep
from tests.support.factories import changed, cpu_sweep, gpu_sweep
from tests.support.schemas import errors, kuberay_schema, validator

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")

# A matrix of specs that must all render to schema-valid RayJobs.
SPEC_MATRIX: dict[str, dict[str, Any]] = {
    "gpu-default": gpu_sweep(),
    "cpu-only": cpu_sweep(),
    "p4d-8-gpus": changed(
        gpu_sweep(),
        {
            "spec.workerGroup.instanceType": "p4d.24xlarge",
            "spec.trial.resourcesPerWorker": {"cpu": "90", "gpu": 8, "memory": "1000Gi"},
            "spec.trial.workers": 1,
        },
    ),
    "tolerations-and-selector": changed(
        gpu_sweep(),
        {
            "spec.workerGroup.nodeSelector": {"karpenter.sh/capacity-type": "spot"},
            "spec.workerGroup.tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
                {"key": "spot", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60},
            ],
            "spec.workerGroup.minReplicas": 2,
        },
    ),
    "endpoint-and-retries": changed(
        cpu_sweep(),
        {"spec.storage.endpointUrl": "http://minio.storage:9000", "spec.failurePolicy.jobRetries": 3},
    ),
    "suspended": changed(cpu_sweep(), {"spec.suspend": True}),
    "no-active-seconds": changed(cpu_sweep(), {"spec.deadlines": {"startupSeconds": 600}}),
    "long-dotted-name": changed(cpu_sweep(name="team.very-long-experiment-name-for-the-digits-model-v2"), {}),
    # Kueue mode (docs/kueue.md)
    "kueue-queue-and-priority": changed(
        gpu_sweep(), {"spec.queueName": "team-a-gpu", "spec.priorityClassName": "high"}
    ),
    "kueue-cpu-suspended": changed(cpu_sweep(), {"spec.queueName": "cpu", "spec.suspend": True}),
}


def render(doc: dict[str, Any], run_id: str = "abc123", **kwargs: Any) -> dict[str, Any]:
    return build_rayjob(parse_sweep(doc), run_id, **kwargs)


def env_vars(rayjob: dict[str, Any]) -> dict[str, str]:
    return yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"])["env_vars"]


def head_of(rayjob: dict[str, Any]) -> dict[str, Any]:
    return rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]


def worker_group_of(rayjob: dict[str, Any]) -> dict[str, Any]:
    (group,) = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    return group


def pod_templates(rayjob: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = rayjob["spec"]
    return {
        "head": head_of(rayjob)["template"],
        "worker": worker_group_of(rayjob)["template"],
        "submitter": spec["submitterPodTemplate"],
    }


@pytest.fixture(scope="module")
def rayjob_validator() -> Any:
    return validator(kuberay_schema("rayjobs"))


@pytest.mark.parametrize("case", sorted(SPEC_MATRIX))
def test_rendered_rayjob_validates_against_kuberay_v1_schema(case: str, rayjob_validator: Any) -> None:
    rayjob = render(SPEC_MATRIX[case], deadline_at=1_800_000_000)
    assert errors(rayjob_validator, rayjob) == []


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_examples_render_to_schema_valid_rayjobs(
    example: Path, rayjob_validator: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert sweepctl(["render", "-f", str(example), "--run-id", "r1x2y3"]) == 0
    rayjob = yaml.safe_load(capsys.readouterr().out)
    assert errors(rayjob_validator, rayjob) == []
    assert rayjob["metadata"]["name"].endswith("-r1x2y3")


def test_schema_check_catches_a_misspelt_field(rayjob_validator: Any) -> None:
    rayjob = render(gpu_sweep())
    rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParam"] = {}
    assert any("rayStartParam" in e for e in errors(rayjob_validator, rayjob))


@pytest.mark.parametrize("case", sorted(SPEC_MATRIX))
def test_pod_templates_validate_against_kubernetes_core_schemas(case: str) -> None:
    rayjob = render(SPEC_MATRIX[case])
    for role, template in pod_templates(rayjob).items():
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{rayjob['metadata']['name']}-{role}", **template.get("metadata", {})},
            "spec": template["spec"],
        }
        kubernetes_validate.validate(pod, "1.33", strict=True)


@pytest.mark.parametrize("case", sorted(SPEC_MATRIX))
def test_kuberay_rules_the_schema_misses(case: str) -> None:
    """KubeRay's validation.go: suspend and TTL need shutdownAfterJobFinishes; name <= 47 chars;
    autoscaling wants restartPolicy Never on workers; deletionStrategy is exclusive with shutdown."""
    rayjob = render(SPEC_MATRIX[case])
    spec = rayjob["spec"]
    if spec.get("suspend") or spec.get("ttlSecondsAfterFinished", 0) > 0:
        assert spec["shutdownAfterJobFinishes"] is True
    assert "deletionStrategy" not in spec
    name = rayjob["metadata"]["name"]
    assert len(name) <= 47 and DNS_1035.match(name), name
    if spec["rayClusterSpec"]["enableInTreeAutoscaling"]:
        assert worker_group_of(rayjob)["template"]["spec"]["restartPolicy"] == "Never"
    group = worker_group_of(rayjob)
    assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]


def test_identity_labels_owner_and_finalizer() -> None:
    doc = changed(gpu_sweep(), {"metadata.uid": "0b8e-uid"})
    rayjob = render(doc, "k3j9x2")
    meta = rayjob["metadata"]
    assert meta["name"] == "digits-k3j9x2" and meta["namespace"] == "ml"
    assert meta["labels"][constants.LABEL_SWEEP] == "digits"
    assert meta["labels"][constants.LABEL_RUN_ID] == "k3j9x2"
    assert meta["finalizers"] == [constants.FINALIZER]
    (owner,) = meta["ownerReferences"]
    assert owner == {
        "apiVersion": "sweeps.dev/v1alpha1",
        "kind": "TrainingSweep",
        "name": "digits",
        "uid": "0b8e-uid",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    for template in pod_templates(rayjob).values():
        assert template["metadata"]["labels"][constants.LABEL_SWEEP] == "digits"


def test_head_runs_trial_drivers_but_no_train_worker() -> None:
    """R5, R14: the head has no GPUs and num-cpus 0, and exactly maxConcurrentTrials trial-driver slots."""
    doc = changed(gpu_sweep(), {"spec.tune.maxConcurrentTrials": 3, "spec.trial.workers": 1})
    head = head_of(render(doc))
    params = head["rayStartParams"]
    assert params["num-cpus"] == "0" and params["num-gpus"] == "0"
    assert json.loads(json.loads(params["resources"])) == {constants.TRIAL_DRIVER_RESOURCE: 3}
    (container,) = head["template"]["spec"]["containers"]
    assert constants.GPU_RESOURCE not in container["resources"]["limits"]


def test_worker_group_gpus_requests_equal_limits() -> None:
    """R15: Ray's logical resources are not OS limits; container requests = limits, GPUs included."""
    group = worker_group_of(render(gpu_sweep()))
    (container,) = group["template"]["spec"]["containers"]
    resources = container["resources"]
    assert resources["requests"] == resources["limits"] == {"cpu": "4", "memory": "24Gi", constants.GPU_RESOURCE: 1}
    head = head_of(render(gpu_sweep()))["template"]["spec"]["containers"][0]["resources"]
    assert head["requests"] == head["limits"]


def test_max_replicas_is_demand_and_never_above_the_cap() -> None:
    """R14, R21: maxReplicas = workers x maxConcurrentTrials, clipped to maxWorkersPerSweep."""
    sweep = parse_sweep(changed(gpu_sweep(), {"spec.trial.workers": 3, "spec.tune.maxConcurrentTrials": 2}))
    assert worker_group_of(build_rayjob(sweep, "a1"))["maxReplicas"] == 6
    capped = OperatorLimits(max_workers_per_sweep=4)
    assert worker_group_of(build_rayjob(sweep, "a1", capped))["maxReplicas"] == 4
    assert worker_cap(sweep.spec, capped) == 4


def test_worker_placement_from_instance_type_selector_and_tolerations() -> None:
    rayjob = render(SPEC_MATRIX["tolerations-and-selector"])
    pod = worker_group_of(rayjob)["template"]["spec"]
    assert pod["nodeSelector"] == {
        "karpenter.sh/capacity-type": "spot",
        "node.kubernetes.io/instance-type": "g5.2xlarge",
    }
    assert {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"} in pod["tolerations"]
    assert {"key": "spot", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60} in pod["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    cpu_pod = worker_group_of(render(cpu_sweep()))["template"]["spec"]
    assert "nodeSelector" not in cpu_pod and "tolerations" not in cpu_pod


def test_service_account_on_head_workers_and_submitter() -> None:
    """R11: the IRSA service account that grants the bucket is on every pod that touches S3."""
    rayjob = render(changed(gpu_sweep(), {"spec.storage.serviceAccountName": "runner-x"}))
    for role, template in pod_templates(rayjob).items():
        assert template["spec"]["serviceAccountName"] == "runner-x", role


def test_s3_environment_on_every_container() -> None:
    """R11: region (and an S3-compatible endpoint when given) reach every process that writes checkpoints."""
    rayjob = render(SPEC_MATRIX["endpoint-and-retries"])
    for template in pod_templates(rayjob).values():
        env = {e["name"]: e["value"] for e in template["spec"]["containers"][0]["env"]}
        assert env["AWS_REGION"] == "us-west-2"
        assert env["AWS_ENDPOINT_URL_S3"] == "http://minio.storage:9000"
    plain = render(gpu_sweep())
    env = {e["name"] for e in worker_group_of(plain)["template"]["spec"]["containers"][0]["env"]}
    assert "AWS_ENDPOINT_URL_S3" not in env


def test_operator_s3_defaults_fill_empty_storage_fields() -> None:
    doc = changed(cpu_sweep(), {"spec.storage.region": ""})
    rayjob = render(doc, limits=RenderContext(s3_region="eu-west-1", s3_endpoint_url="http://s3.local:9000"))
    env = {e["name"]: e["value"] for e in head_of(rayjob)["template"]["spec"]["containers"][0]["env"]}
    assert env["AWS_REGION"] == "eu-west-1" and env["AWS_ENDPOINT_URL_S3"] == "http://s3.local:9000"


def test_every_retry_class_and_deadline_is_rendered_explicitly() -> None:
    """R12: backoffLimit, both deadlines and all failure classes are set, never left to Ray's unlimited defaults."""
    doc = changed(
        gpu_sweep(),
        {
            "spec.failurePolicy": {
                "workerFailures": 2,
                "controllerFailures": 4,
                "preemptionFailures": 6,
                "trialFailures": 1,
                "jobRetries": 2,
            },
            "spec.deadlines": {"activeSeconds": 7200, "startupSeconds": 900, "gracefulStopSeconds": 120},
        },
    )
    rayjob = render(doc, deadline_at=1_900_000_000)
    spec = rayjob["spec"]
    assert spec["backoffLimit"] == 2
    assert spec["activeDeadlineSeconds"] == 7200 + 120
    assert spec["preRunningDeadlineSeconds"] == 900
    assert spec["submitterConfig"]["backoffLimit"] >= 0
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] > 0
    env = env_vars(rayjob)
    assert env[constants.ENV_DEADLINE_AT] == "1900000000"
    assert env[constants.ENV_WORKER_GROUP_START_TIMEOUT] == "900"
    # Ray's job supervisor gives a stopped driver this long between SIGTERM and SIGKILL (issue 26, section 0).
    assert env[constants.ENV_JOB_STOP_WAIT] == "120"
    policy = RunSpec.from_json(env[constants.ENV_RUN_SPEC]).spec.failure_policy
    assert (policy.worker_failures, policy.controller_failures, policy.preemption_failures) == (2, 4, 6)
    assert policy.trial_failures == 1


def test_active_deadline_uses_operator_default_when_unset() -> None:
    rayjob = render(SPEC_MATRIX["no-active-seconds"], limits=OperatorLimits(default_active_seconds=3600))
    assert rayjob["spec"]["activeDeadlineSeconds"] == 3600 + 300


def test_train_v2_is_never_disabled() -> None:
    """R2: the rendered runtime env never sets RAY_TRAIN_V2_ENABLED to 0."""
    assert env_vars(render(gpu_sweep()))[constants.ENV_TRAIN_V2] == "1"


def test_run_spec_round_trips_and_points_at_the_run_root() -> None:
    """R11, R16: the entrypoint gets the normalised spec and a run root of its own on S3."""
    sweep = parse_sweep(gpu_sweep())
    rayjob = build_rayjob(sweep, "z9y8x7")
    run_spec = RunSpec.from_json(env_vars(rayjob)[constants.ENV_RUN_SPEC])
    assert run_spec.spec == sweep.spec
    assert run_spec.run_root == "s3://bucket/sweeps/ml/digits-z9y8x7"
    assert run_spec.run_root == s3_layout.run_root("s3://bucket/sweeps", "ml", "digits", "z9y8x7")
    assert (run_spec.namespace, run_spec.sweep, run_spec.run_id) == ("ml", "digits", "z9y8x7")


def test_each_run_gets_its_own_prefix_and_rayjob() -> None:
    """R16: a new run id is a new RayJob name and a new S3 prefix; nothing is reused implicitly."""
    sweep = parse_sweep(gpu_sweep())
    ids = {new_run_id() for _ in range(50)}
    assert len(ids) == 50
    first, second = sorted(ids)[:2]
    a, b = build_rayjob(sweep, first), build_rayjob(sweep, second)
    assert a["metadata"]["name"] != b["metadata"]["name"]
    root_a = RunSpec.from_json(env_vars(a)[constants.ENV_RUN_SPEC]).run_root
    root_b = RunSpec.from_json(env_vars(b)[constants.ENV_RUN_SPEC]).run_root
    assert root_a != root_b and not root_a.startswith(root_b) and not root_b.startswith(root_a)


def test_run_ids_follow_from_uids_and_are_well_formed() -> None:
    """R16: one run per sweep, named the same by every operator instance; a new sweep (a new uid) gets a new one."""
    uids = [f"6f1c2a7e-0000-4000-8000-{i:012d}" for i in range(2000)]
    ids = [run_id_for(uid) for uid in uids]
    assert ids == [run_id_for(uid) for uid in uids]  # stable
    assert len(set(ids)) == len(ids)  # 36^6 values: no collision among 2000
    assert all(re.fullmatch(r"[a-z0-9]{6}", run_id) for run_id in ids)


@pytest.mark.parametrize("case", sorted(SPEC_MATRIX))
def test_runtime_env_yaml_is_the_document_pure_python_yaml_writes(case: str) -> None:
    """The operator writes it with libyaml's emitter; the document is byte for byte the pure-Python one."""
    rayjob = build_rayjob(parse_sweep(SPEC_MATRIX[case]), "z9y8x7", deadline_at=1_796_000_000)
    run_spec = RunSpec.from_json(env_vars(rayjob)[constants.ENV_RUN_SPEC])
    fast = runtime_env_yaml(run_spec, 1_796_000_000)
    assert fast == rayjob["spec"]["runtimeEnvYAML"]
    assert fast == yaml.safe_dump(yaml.safe_load(fast), sort_keys=True, width=1_000_000)


def test_storage_override_moves_only_the_run_root() -> None:
    rayjob = render(cpu_sweep(), storage_uri="s3://sandbox-bucket/sweeps")
    run_spec = RunSpec.from_json(env_vars(rayjob)[constants.ENV_RUN_SPEC])
    assert run_spec.run_root == "s3://sandbox-bucket/sweeps/default/digits-cpu-abc123"


@pytest.mark.parametrize(
    ("sweep_name", "run_id"),
    [
        ("a" * 63, "abc123"),
        ("team.exp.v2", "abc123"),
        ("9lives", "abc123"),
        ("x" * 40 + "-" + "y" * 5, "q1w2e3"),
    ],
)
def test_long_or_non_dns1035_names_are_shortened_with_a_hash(sweep_name: str, run_id: str) -> None:
    name = rayjob_name(sweep_name, run_id)
    assert len(name) <= constants.RAYJOB_NAME_MAX_LEN
    assert DNS_1035.match(name), name
    assert name.endswith(f"-{run_id}")
    assert rayjob_name(sweep_name, run_id) == name  # deterministic


def test_names_differing_only_past_the_cut_do_not_collide() -> None:
    base = "experiment-" + "x" * 40
    assert rayjob_name(base + "-a", "abc123") != rayjob_name(base + "-b", "abc123")


def test_short_valid_names_are_kept() -> None:
    assert rayjob_name("digits", "abc123") == "digits-abc123"


def test_render_cli_prints_yaml_with_a_fresh_run_id(capsys: pytest.CaptureFixture[str]) -> None:
    assert sweepctl(["render", "-f", str(EXAMPLES / "digits-cpu.yaml")]) == 0
    rayjob = yaml.safe_load(capsys.readouterr().out)
    assert rayjob["kind"] == "RayJob"
    assert re.fullmatch(r"digits-cpu-[a-z0-9]{6}", rayjob["metadata"]["name"])


def test_render_cli_refuses_an_invalid_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(yaml.safe_dump(changed(gpu_sweep(), {"spec.tune.mode": "best"})))
    assert sweepctl(["render", "-f", str(manifest)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "spec.tune.mode" in captured.err


def test_render_cli_refuses_a_bad_run_id(capsys: pytest.CaptureFixture[str]) -> None:
    assert sweepctl(["render", "-f", str(EXAMPLES / "digits-cpu.yaml"), "--run-id", "Bad_ID"]) == 2
    assert "--run-id" in capsys.readouterr().err


# ---- Kueue mode (kubernetes-sigs/kueue: site/content/en/docs/tasks/run/rayjobs.md, rayjob_webhook.go)


def test_kueue_mode_renders_a_suspended_labelled_rayjob_kueues_webhook_accepts() -> None:
    """The queue-name and priority-class labels, suspend: true (Kueue admits by unsuspending), shutdown after the
    job, no clusterSelector, no in-tree autoscaling, a worker group fixed at the (capped) demand; and what
    sweep_sandbox.kueue.validate_rayjob_for_kueue (the webhook's rules) finds wrong: nothing."""
    from sweep_sandbox.kueue import pod_sets_for, validate_rayjob_for_kueue

    rayjob = render(SPEC_MATRIX["kueue-queue-and-priority"])
    meta, spec = rayjob["metadata"], rayjob["spec"]
    assert meta["labels"]["kueue.x-k8s.io/queue-name"] == "team-a-gpu"
    assert meta["labels"]["kueue.x-k8s.io/priority-class"] == "high"
    assert spec["suspend"] is True and spec["shutdownAfterJobFinishes"] is True
    assert "clusterSelector" not in spec
    assert spec["rayClusterSpec"]["enableInTreeAutoscaling"] is False
    group = worker_group_of(rayjob)
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 4  # 2 workers x 2 trials
    assert group["groupName"] != "head"
    assert validate_rayjob_for_kueue(rayjob) == []
    gpus = {
        ps["name"]: ps["count"]
        * int(ps["template"]["spec"]["containers"][0]["resources"]["requests"].get(constants.GPU_RESOURCE, 0))
        for ps in pod_sets_for(rayjob)
    }
    assert gpus == {"head": 0, "gpu-workers": 4, "submitter": 0}  # Kueue reserves the sweep's whole GPU demand


def test_kueue_worker_group_never_exceeds_the_worker_cap() -> None:
    rayjob = render(
        SPEC_MATRIX["kueue-queue-and-priority"],
        limits=RenderContext(limits=OperatorLimits(max_workers_per_sweep=3, max_gpus_per_sweep=16)),
    )
    group = worker_group_of(rayjob)
    assert (
        group["replicas"]
        == group["maxReplicas"]
        == worker_cap(
            parse_sweep(SPEC_MATRIX["kueue-queue-and-priority"]).spec, OperatorLimits(max_workers_per_sweep=3)
        )
        == 3
    )


@pytest.mark.parametrize(
    "default,namespaces,spec_queue,expected",
    [
        ("gpu", (), "", "gpu"),  # the chart's default queue
        ("gpu", ("ml=ml-gpu",), "", "ml-gpu"),  # the sweep's namespace (ml) has its own
        ("gpu", ("ml=",), "", None),  # Kueue mode off in ml
        ("", (), "mine", "mine"),  # spec.queueName alone
        ("", (), "", None),  # not Kueue mode: no label, not suspended, autoscaling as usual
    ],
)
def test_the_default_queue_comes_from_the_settings(
    default: str, namespaces: tuple[str, ...], spec_queue: str, expected: str | None
) -> None:
    doc = changed(gpu_sweep(), {"spec.queueName": spec_queue})
    rayjob = render(doc, limits=RenderContext(kueue_default_queue=default, kueue_namespace_queues=namespaces))
    assert rayjob["metadata"]["labels"].get("kueue.x-k8s.io/queue-name") == expected
    assert rayjob["spec"].get("suspend", False) is (expected is not None)
    assert rayjob["spec"]["rayClusterSpec"]["enableInTreeAutoscaling"] is (expected is None)


def test_render_cli_shows_the_kueue_rayjob(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = tmp_path / "kueue.yaml"
    manifest.write_text(yaml.safe_dump(SPEC_MATRIX["kueue-queue-and-priority"]))
    assert sweepctl(["render", "-f", str(manifest)]) == 0
    rayjob = yaml.safe_load(capsys.readouterr().out)
    assert rayjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a-gpu"
    assert rayjob["spec"]["suspend"] is True
