"""`sweepctl resume` and `kubectl sweep resume` against the strict API emulator on 127.0.0.1 (issue 16): the spec
change a resume is (spec.resume.generation one up, activeSeconds, tune.numSamples), made with a resourceVersion
precondition; refusals that name the phase or the field; the API server's own refusals passed on."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from sweep_contracts import constants
from sweep_operator.cli import main as sweepctl_main
from sweep_operator.cli.resume import resume_patch
from sweep_sandbox.emulator import EmulatorServer
from tests.support.factories import changed, cpu_sweep

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EmulatorServer, Path]]:
    with EmulatorServer() as server:
        yield server, server.write_kubeconfig(tmp_path_factory.mktemp("kube") / "kubeconfig")


def custom(server: EmulatorServer) -> Any:
    return kubernetes.client.CustomObjectsApi(server.api_client())


def sweep_in(server: EmulatorServer, status: dict[str, Any] | None, **changes: Any) -> str:
    """A TrainingSweep as the operator left it (status written through the status subresource)."""
    name = f"res-{uuid.uuid4().hex[:6]}"
    doc = changed(cpu_sweep(name, "default"), {"spec.tune.numSamples": 4, **changes})
    api = custom(server)
    api.create_namespaced_custom_object(constants.GROUP, constants.VERSION, "default", constants.PLURAL, doc)
    if status:
        api.patch_namespaced_custom_object_status(
            constants.GROUP, constants.VERSION, "default", constants.PLURAL, name, {"status": status}
        )
    return name


def read(server: EmulatorServer, name: str) -> dict[str, Any]:
    return custom(server).get_namespaced_custom_object(
        constants.GROUP, constants.VERSION, "default", constants.PLURAL, name
    )


def sweepctl(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    return subprocess.run(
        [sys.executable, "-m", "sweep_operator.cli", *args], env=env, capture_output=True, text=True, timeout=120
    )


ENDED = {"phase": "DeadlineExceeded", "runId": "r1abcd", "rayJobName": "x-r1abcd"}


def test_resume_makes_the_spec_change_an_edited_manifest_makes(cluster: tuple[EmulatorServer, Path]) -> None:
    server, kubeconfig = cluster
    name = sweep_in(server, ENDED)
    done = sweepctl(kubeconfig, "resume", name, "--active-seconds", "3600", "--num-samples", "6")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "spec.resume.generation=1" in done.stdout and "spec.tune.numSamples=6" in done.stdout
    spec = read(server, name)["spec"]
    assert spec["resume"] == {"generation": 1, "activeSeconds": 3600} and spec["tune"]["numSamples"] == 6
    # Again, without new time: the next generation, and activeSeconds removed (the attempt gets the remainder).
    again = sweepctl(kubeconfig, "resume", name, "-n", "default")
    assert again.returncode == 0, again.stdout + again.stderr
    spec = read(server, name)["spec"]
    assert spec["resume"] == {"generation": 2} and spec["tune"]["numSamples"] == 6


def test_kubectl_sweep_resume_runs_the_same_code(cluster: tuple[EmulatorServer, Path]) -> None:
    from sweep_operator.cli.kubectl_plugin import main as kubectl_sweep

    server, kubeconfig = cluster
    name = sweep_in(server, {**ENDED, "phase": "Failed"})
    assert kubectl_sweep(["resume", name, "-n", "default", "--kubeconfig", str(kubeconfig), "--num-samples", "5"]) == 0
    spec = read(server, name)["spec"]
    assert spec["resume"] == {"generation": 1} and spec["tune"]["numSamples"] == 5


@pytest.mark.parametrize(
    ("status", "args", "code", "says"),
    [
        pytest.param({"phase": "Running", "runId": "r1abcd"}, [], 1, "is Running, not ended", id="running"),
        pytest.param(None, [], 1, "is Pending, not ended", id="never admitted"),
        pytest.param({"phase": "Failed"}, [], 1, "status.runId is unset", id="ended without a run"),
        pytest.param({"phase": "Succeeded", "runId": "r1abcd"}, [], 2, "pass --num-samples above 4", id="succeeded"),
        pytest.param(
            ENDED, ["--num-samples", "3"], 2, "--num-samples 3: spec.tune.numSamples is 4", id="fewer samples"
        ),
        pytest.param(ENDED, ["--active-seconds", "10"], 2, "spec.resume.activeSeconds must be >= 30", id="too short"),
    ],
)
def test_resume_refusals_name_the_phase_or_the_field(
    cluster: tuple[EmulatorServer, Path], status: dict[str, Any] | None, args: list[str], code: int, says: str
) -> None:
    server, kubeconfig = cluster
    name = sweep_in(server, status)
    before = read(server, name)
    done = sweepctl(kubeconfig, "resume", name, *args)
    assert done.returncode == code and says in done.stderr, done.stdout + done.stderr
    assert read(server, name)["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]  # unchanged


def test_the_api_servers_refusal_is_passed_on_naming_the_field(cluster: tuple[EmulatorServer, Path]) -> None:
    """startupSeconds is 1800: the CEL rule at the CRD's root refuses a shorter resumed attempt (422)."""
    server, kubeconfig = cluster
    name = sweep_in(server, ENDED)
    done = sweepctl(kubeconfig, "resume", name, "--active-seconds", "600")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "spec.resume.activeSeconds: Invalid value" in done.stderr
    assert "must be more than spec.deadlines.startupSeconds" in done.stderr
    assert "resume" not in read(server, name)["spec"]


def test_a_sweep_changed_since_it_was_read_is_not_patched(
    cluster: tuple[EmulatorServer, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The merge patch carries the resourceVersion it was computed from: a concurrent edit makes it a 409 Conflict,
    and nothing is changed."""
    server, kubeconfig = cluster
    name = sweep_in(server, ENDED)
    stale = read(server, name)
    api = custom(server)
    api.patch_namespaced_custom_object(
        constants.GROUP, constants.VERSION, "default", constants.PLURAL, name, {"metadata": {"labels": {"team": "a"}}}
    )
    with pytest.raises(kubernetes.client.ApiException) as refused:
        api.patch_namespaced_custom_object(
            constants.GROUP,
            constants.VERSION,
            "default",
            constants.PLURAL,
            name,
            resume_patch(stale, active_seconds=None, num_samples=None),
        )
    assert refused.value.status == 409

    original = kubernetes.client.CustomObjectsApi.get_namespaced_custom_object

    def read_then_someone_edits(self: Any, *args: Any, **kwargs: Any) -> Any:
        found = original(self, *args, **kwargs)
        api.patch_namespaced_custom_object(
            constants.GROUP,
            constants.VERSION,
            "default",
            constants.PLURAL,
            name,
            {"metadata": {"labels": {"team": uuid.uuid4().hex[:6]}}},
        )
        return found

    monkeypatch.setattr(kubernetes.client.CustomObjectsApi, "get_namespaced_custom_object", read_then_someone_edits)
    assert sweepctl_main(["resume", name, "-n", "default", "--kubeconfig", str(kubeconfig)]) == 1
    assert "changed since it was read" in capsys.readouterr().err
    monkeypatch.undo()
    assert "resume" not in read(server, name)["spec"]


def test_wait_reports_the_operators_answer(cluster: tuple[EmulatorServer, Path]) -> None:
    """--wait reads status.lastResume for the generation it asked for (here written by hand, as the operator would
    for a refused resume: the missing objects named)."""
    server, kubeconfig = cluster
    name = sweep_in(server, {**ENDED, "resumedGeneration": 0})
    answer = {
        "lastResume": {
            "attempt": 2,
            "trigger": "Resume",
            "generation": 1,
            "outcome": "Refused",
            "message": "resume refused: the run root is not verified",
            "missing": ["missing-file sweeps/default/x-r1abcd/train/t1/checkpoint_epoch-000002/w.pt"],
        },
        "resumedGeneration": 1,
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "sweep_operator.cli", "resume", name, "--wait", "60"],
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        api = custom(server)
        deadline_reads = 0
        while read(server, name)["spec"].get("resume") is None:  # the CLI's patch landed: answer it
            deadline_reads += 1
            assert process.poll() is None and deadline_reads < 10_000
        api.patch_namespaced_custom_object_status(
            constants.GROUP, constants.VERSION, "default", constants.PLURAL, name, {"status": answer}
        )
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 1, out + err
    assert "Refused: resume refused: the run root is not verified" in out
    assert "missing: missing-file sweeps/default/x-r1abcd/train/t1/checkpoint_epoch-000002/w.pt" in out
