"""`kubectl sweep ...` through the real kubectl binary (it finds the `kubectl-sweep` plugin on PATH) against the
Kubernetes API emulator, with the sweep's run root (a real run's records) in moto S3; `kubectl get tsw -o wide`;
`sweepctl report NAME` from the cluster and from S3 alone."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from sweep_contracts import constants
from sweep_operator.cli import main as sweepctl
from sweep_sandbox.emulator import EmulatorServer, kubeconfig_document
from tests.support.report_fixture import FIXTURE, upload_run_root

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
KUBECTL = BIN / "kubectl"
RESULT = json.loads((FIXTURE / "_sweep" / "result.json").read_text())


@pytest.fixture(scope="module")
def server() -> Iterator[EmulatorServer]:
    with EmulatorServer() as srv:
        yield srv


class World:
    def __init__(
        self,
        server: EmulatorServer,
        namespace: str,
        name: str,
        root: str,
        endpoint: str,
        kubeconfig: Path,
        s3: Any,
        bucket: str,
    ):
        self.server, self.namespace, self.name, self.root, self.endpoint = server, namespace, name, root, endpoint
        self.kubeconfig, self.s3, self.bucket = kubeconfig, s3, bucket
        self.merged = ""  # KUBECONFIG as a list of two files

    def kubectl(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        environ = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "HOME": str(self.kubeconfig.parent),
        }
        return subprocess.run(
            [str(KUBECTL), *args], env={**environ, **(env or {})}, capture_output=True, text=True, timeout=120
        )


@pytest.fixture(scope="module")
def world(server: EmulatorServer, s3_server: Any, tmp_path_factory: pytest.TempPathFactory) -> World:
    """A TrainingSweep whose status is what the operator writes for the fixture's run (no operator needed to read
    it), the run root in S3, and a kubeconfig of two files, as KUBECONFIG may list: a current context that goes
    nowhere, and the emulator's context `emu` whose namespace is the sweep's."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    namespace, name = f"team-{uuid.uuid4().hex[:6]}", "digits-asha"
    s3 = s3_server.client()
    bucket = f"rep-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    root = upload_run_root(s3, bucket, f"sweeps/{namespace}/{name}-rep001")
    api = server.api_client()
    core = kubernetes.client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": namespace}})
    doc = yaml.safe_load((REPO / "tests" / "support" / "fixtures" / "report-sweep.yaml").read_text())
    doc["metadata"]["namespace"] = namespace
    doc["spec"]["storage"].update(uri=f"s3://{bucket}/sweeps", endpointUrl=s3_server.endpoint_url)
    custom = kubernetes.client.CustomObjectsApi(api)
    custom.create_namespaced_custom_object(constants.GROUP, constants.VERSION, namespace, constants.PLURAL, doc)
    status = {
        "phase": "Succeeded",
        "runId": "rep001",
        "rayJobName": f"{name}-rep001",
        "message": "sweep succeeded",
        "startedAt": "2026-12-03T11:47:00Z",
        "trainingStartedAt": "2026-12-03T11:47:15Z",
        "deadlineAt": "2026-12-03T12:17:00Z",
        "finishedAt": RESULT["finishedAt"],
        "trialsSummary": "4/4",
        "bestTrial": RESULT["bestTrial"],
        "replicas": {"workers": 1, "gpus": 0, "cap": 1, "namespaceBudget": "0/32"},
        "checkpoints": {
            "verified": True,
            "checked": 5,
            "bytes": 1,
            "verifiedAt": "2026-12-03T11:49:10Z",
            "problems": [],
        },
        "guard": {
            "runRoot": root,
            "endpointUrl": s3_server.endpoint_url,
            "region": "us-east-1",
            "verify": True,
            "timeoutSeconds": 60,
        },
    }
    custom.patch_namespaced_custom_object_status(
        constants.GROUP, constants.VERSION, namespace, constants.PLURAL, name, {"status": status}
    )
    home = tmp_path_factory.mktemp("kube")
    elsewhere = kubeconfig_document("http://127.0.0.1:9", context="elsewhere")
    emu = kubeconfig_document(server.url, context="emu", namespace=namespace)
    emu.pop("current-context")
    (home / "a.yaml").write_text(yaml.safe_dump(elsewhere))
    (home / "b.yaml").write_text(yaml.safe_dump(emu))
    kubeconfig = home / "config"
    kubeconfig.write_text(yaml.safe_dump({**emu, "current-context": "emu"}))
    world = World(server, namespace, name, root, s3_server.endpoint_url, kubeconfig, s3, bucket)
    world.merged = f"{home / 'a.yaml'}{os.pathsep}{home / 'b.yaml'}"
    return world


def test_kubectl_finds_the_plugin_and_sweep_status_reads_the_sweep(world: World) -> None:
    listed = world.kubectl("plugin", "list")
    assert str(BIN / "kubectl-sweep") in listed.stdout, listed.stdout + listed.stderr
    done = world.kubectl("sweep", "status", world.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"TrainingSweep {world.namespace}/{world.name}" in done.stdout
    assert "phase:       Succeeded" in done.stdout and RESULT["bestTrial"]["id"] in done.stdout
    # Issue 28: the trial counts and the best config were printed as Python dicts.
    assert "{'" not in done.stdout and "': " not in done.stdout, done.stdout
    config = RESULT["bestTrial"]["config"]
    config_line = next(line for line in done.stdout.splitlines() if line.startswith("  config:      "))
    assert all(f"{key}=" in config_line for key in config), done.stdout


def test_sweep_status_honours_kubeconfig_lists_context_and_namespace(world: World) -> None:
    merged = {"KUBECONFIG": world.merged}
    # The merged files' current context (the first file's) points nowhere: --context picks the emulator.
    nowhere = world.kubectl("sweep", "status", world.name, env=merged)
    assert nowhere.returncode == 1 and "cannot reach the cluster" in nowhere.stderr
    done = world.kubectl("sweep", "status", world.name, "--context", "emu", env=merged)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "phase:       Succeeded" in done.stdout
    other = world.kubectl("sweep", "status", world.name, "--context=emu", "-n", "default", env=merged)
    # kubectl's own words and exit status for an object that is not there.
    assert other.returncode == 1, other.stderr
    assert other.stderr.strip() == f'Error from server (NotFound): trainingsweeps.sweeps.dev "{world.name}" not found'
    assert world.kubectl("get", "tsw", world.name, "-n", "default").stderr.strip() == other.stderr.strip()
    named = world.kubectl(
        "sweep", "status", world.name, f"--namespace={world.namespace}", "--context", "emu", "--json", env=merged
    )
    assert json.loads(named.stdout)["runId"] == "rep001"
    wrong = world.kubectl("sweep", "status", world.name, "--context", "nope", env=merged)
    assert wrong.returncode == 2 and "no such context" in wrong.stderr


def test_sweep_verify_render_validate_and_resume(world: World) -> None:
    verify = world.kubectl("sweep", "verify", world.name)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert f"VERIFIED {world.root}: 5 checkpoint(s)" in verify.stdout
    render = world.kubectl("sweep", "render", world.name)
    assert render.returncode == 0, render.stderr
    rayjob = yaml.safe_load(render.stdout)
    assert rayjob["kind"] == "RayJob" and rayjob["metadata"]["name"] == f"{world.name}-rep001"
    validate = world.kubectl("sweep", "validate", world.name)
    assert validate.returncode == 0, validate.stdout + validate.stderr
    # The live object by name, not the temporary file it is validated from.
    assert validate.stdout.strip() == f"{world.namespace}/{world.name}: TrainingSweep {world.name} is valid"
    resume = world.kubectl("sweep", "resume", world.name)  # sweepctl resume: a Succeeded sweep needs more samples
    assert resume.returncode == 2 and "pass --num-samples above" in resume.stderr, resume.stderr
    unknown = world.kubectl("sweep", "delete", world.name)
    assert unknown.returncode == 2 and "unknown verb" in unknown.stderr


def test_get_tsw_wide_shows_gpus_namespace_budget_and_verification_time(world: World) -> None:
    plain = world.kubectl("get", "tsw")
    wide = world.kubectl("get", "tsw", "-o", "wide")
    assert plain.returncode == 0 and wide.returncode == 0, plain.stderr + wide.stderr
    header, row = wide.stdout.splitlines()[:2]
    columns = header.split()
    assert columns[-4:] == ["GPUS", "NS-BUDGET", "VERIFIED-AT", "KUEUE"], header
    assert "GPUS" not in plain.stdout.splitlines()[0]
    # Cells by the header's column offsets: an empty cell (GPU-HOURS before any pod ran, KUEUE outside Kueue mode)
    # would shift a whitespace split.
    starts = [header.index(name) for name in columns]

    def cell(name: str) -> str:
        i = columns.index(name)
        return row[starts[i] : starts[i + 1] if i + 1 < len(starts) else None].strip()

    assert cell("NS-BUDGET") == "0/32" and cell("GPUS") == "0"
    assert cell("VERIFIED-AT") not in ("", "<none>")  # an age, like AGE


def row_cells(table: str) -> dict[str, str]:
    """The first row of a `kubectl get` table by the header's column offsets (a cell may be empty or hold spaces)."""
    header, row = table.splitlines()[:2]
    columns = header.split()
    starts = [header.index(name) for name in columns]
    ends = [*starts[1:], None]
    return {name: row[start:end].strip() for name, start, end in zip(columns, starts, ends, strict=True)}


def test_get_tsw_columns_read_finished_of_num_samples_a_short_best_and_0_gpu_hours(world: World) -> None:
    """Issue 28: TRIALS counted trials started so far (`0/1`), BEST printed 16 digits, GPU-HOURS was blank on a CPU
    sweep. The status is what the operator computes from a driver's status.json two trials into 100 samples."""
    from sweep_operator.status import progress_patch
    from sweep_operator.validation import parse_sweep

    doc = yaml.safe_load((REPO / "tests" / "support" / "fixtures" / "report-sweep.yaml").read_text())
    doc["metadata"].update(name="wide-cpu", namespace=world.namespace)
    doc["spec"]["paramSpace"]["lr"] = {"loguniform": [1.0e-4, 1.0e-1]}
    doc["spec"]["tune"].update(numSamples=100, searcher={"type": "random"})
    progress = {
        "trials": {"total": 3, "terminated": 2, "running": 1},
        "bestTrial": {"id": "t1", "metric": "val_loss", "value": 0.123456789012345678},
    }
    status = {"phase": "Running", **progress_patch(progress, parse_sweep(doc).spec), "usage": {"gpuHours": 0}}
    custom = kubernetes.client.CustomObjectsApi(world.server.api_client())
    args = (constants.GROUP, constants.VERSION, world.namespace, constants.PLURAL)
    custom.create_namespaced_custom_object(*args, doc)
    try:
        custom.patch_namespaced_custom_object_status(*args, "wide-cpu", {"status": status})
        done = world.kubectl("get", "tsw", "wide-cpu")
        assert done.returncode == 0, done.stderr
        cells = row_cells(done.stdout)
        best = "val_loss=0.1235"  # the metric's name and its value
        assert (cells["TRIALS"], cells["BEST"], cells["GPU-HOURS"]) == ("2/100 (1 running)", best, "0"), done.stdout
    finally:
        custom.delete_namespaced_custom_object(*args, "wide-cpu")


def test_kubectl_apply_of_a_bad_storage_uri_says_what_is_expected(world: World, tmp_path: Path) -> None:
    """Issue 28: the API server answered a bad storage.uri with the schema's regex; the validator's words never
    reached kubectl."""
    doc = yaml.safe_load((REPO / "tests" / "support" / "fixtures" / "report-sweep.yaml").read_text())
    doc["metadata"].update(name="bad-uri", namespace=world.namespace)
    doc["spec"]["storage"]["uri"] = "gs://bucket/sweeps"
    manifest = tmp_path / "bad-uri.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    done = world.kubectl("apply", "-f", str(manifest))
    assert done.returncode == 1, done.stdout + done.stderr
    # The API server prints a rule's failure with the type, `Invalid value: "string"`: the message quotes the value.
    said = (
        "spec.storage.uri: Invalid value: \"string\": got 'gs://bucket/sweeps'; expected s3://bucket/prefix: a bucket"
    )
    assert said in done.stderr, done.stderr
    assert "^s3://" not in done.stderr


def test_report_from_the_cluster_reads_status_and_s3(world: World, tmp_path: Path) -> None:
    out = tmp_path / "report"
    done = world.kubectl("sweep", "report", world.name, "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads((out / "report.json").read_text())
    assert data["root"] == world.root
    curves = {t["trial"]: t for t in data["learningCurves"]["trials"]}
    for trial in RESULT["trialResults"]:
        rows = [json.loads(line) for line in (FIXTURE / "tune" / trial["id"] / "result.json").read_text().splitlines()]
        assert curves[trial["id"]]["values"] == [r["val_loss"] for r in rows]
    assert [t["trial"] for t in curves.values() if t["best"]] == [RESULT["bestTrial"]["id"]]
    # The status' times make the phases; the verifier's own pass lists the checkpoints it found.
    assert {s["label"] for s in data["timeline"]["spans"] if s["kind"] == "phase"} == {"Starting", "Running"}
    assert {m["kind"] for m in data["timeline"]["markers"]} >= {"deadline", "verification", "finished"}
    committed = sorted((c["trial"], c["checkpoint"]) for c in data["checkpoints"] if c["status"] == "verified")
    assert len(committed) == 5 and (RESULT["bestTrial"]["id"], "checkpoint_epoch-000005") in committed
    assert "VERIFIED at" in (out / "report.html").read_text()


def test_report_from_s3_alone_after_the_cluster_is_gone(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = sweepctl(
        [
            "report",
            "--storage",
            world.root,
            "--endpoint-url",
            world.endpoint,
            "--region",
            "us-east-1",
            "--kubeconfig",
            str(tmp_path / "absent"),
            "--out",
            str(tmp_path / "r"),
        ]
    )
    assert code == 0, capsys.readouterr().err
    data = json.loads((tmp_path / "r" / "report.json").read_text())
    assert sum(len(t["values"]) for t in data["learningCurves"]["trials"]) == 9
    assert len([c for c in data["checkpoints"] if c["status"] == "verified"]) == 5
    assert not [s for s in data["timeline"]["spans"] if s["kind"] == "attempt"]  # no status: no attempts known


def test_report_says_why_when_s3_refuses(world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = f"s3://no-such-{uuid.uuid4().hex[:8]}/sweeps/ns/s-r1"
    code = sweepctl(["report", "--storage", missing, "--endpoint-url", world.endpoint, "--out", str(tmp_path / "r")])
    assert code == 1
    err = capsys.readouterr().err
    assert f"sweepctl report: cannot read {missing}" in err and "NoSuchBucket" in err, err
    assert not (tmp_path / "r").exists()


def test_sweep_list_shows_what_get_tsw_shows(world: World) -> None:
    listed = world.kubectl("sweep", "list")
    got = world.kubectl("get", "tsw")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[0] == got.stdout.splitlines()[0]  # the same columns
    assert world.name in listed.stdout
    everywhere = world.kubectl("sweep", "list", "-A")
    assert everywhere.returncode == 0 and everywhere.stdout.startswith("NAMESPACE"), everywhere.stderr
    assert world.namespace in everywhere.stdout


def test_suspend_and_unsuspend_patch_spec_suspend_and_resume_of_a_suspended_sweep_points_to_unsuspend(
    world: World,
) -> None:
    def suspend_field() -> object:
        return json.loads(world.kubectl("get", "tsw", world.name, "-o", "json").stdout)["spec"].get("suspend")

    done = world.kubectl("sweep", "suspend", world.name)
    assert done.returncode == 0, done.stderr
    assert suspend_field() is True and "suspended" in done.stdout
    custom = kubernetes.client.CustomObjectsApi(world.server.api_client())
    where = (constants.GROUP, constants.VERSION, world.namespace, constants.PLURAL, world.name)
    phase = custom.get_namespaced_custom_object(*where)["status"]["phase"]
    custom.patch_namespaced_custom_object_status(*where, {"status": {"phase": "Suspended"}})
    try:
        resume = world.kubectl("sweep", "resume", world.name)
        assert resume.returncode == 1 and f"kubectl sweep unsuspend {world.name}" in resume.stderr, resume.stderr
    finally:
        custom.patch_namespaced_custom_object_status(*where, {"status": {"phase": phase}})
        undone = world.kubectl("sweep", "unsuspend", world.name)
    assert undone.returncode == 0, undone.stderr
    assert suspend_field() is False
    helped = world.kubectl("sweep", "--help")
    assert "unsuspend NAME" in helped.stdout and 'what Kueue calls "resume"' in helped.stdout
    missing = world.kubectl("sweep", "suspend", "nope")
    assert missing.returncode == 1 and "(NotFound)" in missing.stderr


def test_release_and_guarded_are_plugin_verbs(world: World) -> None:
    guarded = world.kubectl("sweep", "guarded")
    assert guarded.returncode in (0, 1), guarded.stdout + guarded.stderr
    assert "unknown verb" not in guarded.stderr
    release = world.kubectl("sweep", "release", world.name, "--reason", "test")
    assert "unknown verb" not in release.stderr and "usage" not in release.stderr.lower(), release.stderr


DRIVER_OUTPUT = "sweep: new run rep001\nTrial 48bfa_00000 started with configuration\nsweep: 4 trial(s) terminated\n"


def _submitter(world: World) -> dict[str, Any]:
    """The sweep's submitter Job as KubeRay creates it (K8sJobMode) and its pod as the Job controller, the scheduler
    and the kubelet leave it (the KubeRay stand-in's own code), printing DRIVER_OUTPUT."""
    from sweep_operator.rendering import SUBMITTER_CONTAINER
    from sweep_sandbox.kuberay.ray_api import RayApi
    from sweep_sandbox.submitter_pods import SubmitterPods

    batch = kubernetes.client.BatchV1Api(world.server.api_client())
    template = {
        "metadata": {"labels": {constants.LABEL_SWEEP: world.name}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": SUBMITTER_CONTAINER, "image": "trainer:1"}]},
    }
    body = {"metadata": {"name": f"{world.name}-rep001"}, "spec": {"backoffLimit": 2, "template": template}}
    job = batch.api_client.sanitize_for_serialization(batch.create_namespaced_job(world.namespace, body))
    pods = SubmitterPods(RayApi(world.server.api_client()).core, world.server.emulator.container_logs)
    pods.start(job, DRIVER_OUTPUT.encode)
    return job


def test_sweep_logs_prints_the_driver_log_and_each_trials_log_from_the_run_root(world: World, tmp_path: Path) -> None:
    before = world.kubectl("sweep", "logs", world.name)
    assert before.returncode == 1, before.stdout
    assert f"the submitter Job {world.namespace}/{world.name}-rep001 of RayJob" in before.stderr
    assert f"sweepctl logs {world.name} --trial ID" in before.stderr
    job = _submitter(world)
    try:
        shown = world.kubectl("sweep", "logs", world.name)
        assert (shown.returncode, shown.stdout) == (0, DRIVER_OUTPUT), shown.stderr
        tail = world.kubectl("sweep", "logs", world.name, "--tail", "1")
        assert tail.stdout == "sweep: 4 trial(s) terminated\n", tail.stderr

        trial = world.kubectl("sweep", "logs", world.name, "--trial", "48bfa_00000")
        assert trial.returncode == 0, trial.stderr
        lines = trial.stdout.splitlines()
        assert lines[0] == f"trial 48bfa_00000  ({world.root}/tune/48bfa_00000)"
        assert lines[1] == "config: batch_size=64  epochs=6  hidden=32  lr=0.1"
        iterations = [line for line in lines if "  iteration " in line]
        assert len(iterations) == 6 and lines[2] == "6 result(s) reported:"
        assert "iteration 1 (21.2 s)  epoch=0  train_loss=2.05" in iterations[0]
        assert "val_loss=1.297" in iterations[0] and iterations[0].endswith("checkpoint checkpoint_epoch-000000")
        assert "ranks_reported" not in trial.stdout and "hostname" not in trial.stdout
        assert lines[-1] == "no error recorded"

        prefix = world.root.removeprefix(f"s3://{world.bucket}/")
        world.s3.put_object(
            Bucket=world.bucket, Key=f"{prefix}/tune/48bfa_00003/error.txt", Body=b"Failure # 1\nRuntimeError: boom\n"
        )
        failed = world.kubectl("sweep", "logs", world.name, "--trial", "48bfa_00003")
        assert failed.stdout.splitlines()[-3:] == ["error (error.txt):", "  Failure # 1", "  RuntimeError: boom"]

        unknown = world.kubectl("sweep", "logs", world.name, "--trial", "48bfa_00009")
        assert unknown.returncode == 1
        assert (
            f'trial "48bfa_00009" not found under {world.root}/tune (its trials: 48bfa_00000, 48bfa_00001, '
            "48bfa_00002, 48bfa_00003)" in unknown.stderr
        )

        out = tmp_path / "logs"
        saved = world.kubectl("sweep", "logs", world.name, "--out-dir", str(out))
        assert saved.returncode == 0, saved.stderr
        assert (out / "driver.log").read_text() == DRIVER_OUTPUT
        assert sorted(p.name for p in (out / "trials").iterdir()) == [f"48bfa_0000{i}" for i in range(4)]
        assert (out / "trials" / "48bfa_00003" / "error.txt").read_text().endswith("RuntimeError: boom\n")
        assert sorted(p.name for p in (out / "trials" / "48bfa_00000").iterdir()) == ["params.json", "result.json"]
    finally:
        world.s3.delete_object(Bucket=world.bucket, Key=f"{prefix}/tune/48bfa_00003/error.txt")
        kubernetes.client.BatchV1Api(world.server.api_client()).delete_namespaced_job(
            job["metadata"]["name"], world.namespace
        )


def test_sweep_logs_of_a_missing_sweep_and_of_one_without_a_run(world: World) -> None:
    missing = world.kubectl("sweep", "logs", "nope")
    assert missing.returncode == 1
    assert 'Error from server (NotFound): trainingsweeps.sweeps.dev "nope" not found' in missing.stderr
    doc = yaml.safe_load((REPO / "tests" / "support" / "fixtures" / "report-sweep.yaml").read_text())
    doc["metadata"].update(name="not-started", namespace=world.namespace)
    custom = kubernetes.client.CustomObjectsApi(world.server.api_client())
    custom.create_namespaced_custom_object(constants.GROUP, constants.VERSION, world.namespace, constants.PLURAL, doc)
    try:
        for extra in ((), ("--trial", "48bfa_00000")):
            fresh = world.kubectl("sweep", "logs", "not-started", *extra)
            assert fresh.returncode == 1
            assert "TrainingSweep not-started has no run yet (phase Pending)" in fresh.stderr, fresh.stderr
    finally:
        custom.delete_namespaced_custom_object(
            constants.GROUP, constants.VERSION, world.namespace, constants.PLURAL, "not-started"
        )
