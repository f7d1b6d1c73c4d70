"""`sweepctl release` and `sweepctl guarded` with no operator left (issue 12, defect 11): a sweep, its RayJob and its
RayCluster are being deleted and held by the guard's finalizer; the CLI verifies with the caller's S3 credentials
and releases only a verified run, or with --force records who and why. Emulator and moto on 127.0.0.1."""

from __future__ import annotations

import json
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
from sweep_operator.rendering import RenderContext, build_rayjob
from sweep_operator.validation import parse_sweep
from sweep_sandbox.emulator import EmulatorServer, wait_for
from tests.support.factories import changed, cpu_sweep
from tests.support.sweep_factory import SyntheticSweep, write_sweep

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[EmulatorServer, Path]]:
    with EmulatorServer() as server:
        yield server, server.write_kubeconfig(tmp_path / "kubeconfig")


def sweepctl(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    return subprocess.run(
        [sys.executable, "-m", "sweep_operator.cli", *args], env=env, capture_output=True, text=True, timeout=120
    )


def held_run(server: EmulatorServer, s3_client: Any, endpoint: str, bucket: str) -> tuple[str, SyntheticSweep]:
    """A sweep, RayJob and RayCluster as an operator left them, all being deleted, the run complete in S3."""
    custom = kubernetes.client.CustomObjectsApi(server.api_client())
    name = f"rel-{uuid.uuid4().hex[:5]}"
    doc = changed(
        cpu_sweep(name, "default"),
        {
            "spec.storage.uri": f"s3://{bucket}/sweeps",
            "spec.storage.endpointUrl": endpoint,
            "spec.storage.region": "us-east-1",
        },
    )
    doc["metadata"]["finalizers"] = [constants.FINALIZER]
    sweep = custom.create_namespaced_custom_object(constants.GROUP, constants.VERSION, "default", constants.PLURAL, doc)
    parsed = parse_sweep(sweep)
    rayjob = build_rayjob(parsed, "r1abcd", RenderContext())
    root = json.loads(rayjob["metadata"]["annotations"][constants.ANNOTATION_GUARD])["runRoot"]
    custom.patch_namespaced_custom_object_status(
        constants.GROUP,
        constants.VERSION,
        "default",
        constants.PLURAL,
        name,
        {
            "status": {
                "phase": "Running",
                "runId": "r1abcd",
                "rayJobName": rayjob["metadata"]["name"],
                "guard": {
                    "runRoot": root,
                    "endpointUrl": endpoint,
                    "region": "us-east-1",
                    "verify": True,
                    "timeoutSeconds": 60,
                },
            }
        },
    )
    created = custom.create_namespaced_custom_object(
        constants.RAY_GROUP, constants.RAY_VERSION_API, "default", constants.RAYJOB_PLURAL, rayjob
    )
    raycluster = {  # as KubeRay's constructRayClusterForRayJob builds it: labels and annotations copied
        "apiVersion": constants.RAY_API_VERSION,
        "kind": constants.RAYCLUSTER_KIND,
        "metadata": {
            "name": f"{rayjob['metadata']['name']}-x7k2p",
            "namespace": "default",
            "labels": {**rayjob["metadata"]["labels"], constants.RAY_LABEL_ORIGINATED_FROM_CRD: "RayJob"},
            "annotations": dict(rayjob["metadata"]["annotations"]),
            "finalizers": [constants.FINALIZER],
            "ownerReferences": [
                {
                    "apiVersion": constants.RAY_API_VERSION,
                    "kind": "RayJob",
                    "name": rayjob["metadata"]["name"],
                    "uid": created["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": rayjob["spec"]["rayClusterSpec"],
    }
    custom.create_namespaced_custom_object(
        constants.RAY_GROUP, constants.RAY_VERSION_API, "default", constants.RAYCLUSTER_PLURAL, raycluster
    )
    synthetic = write_sweep(s3_client, bucket, root.split("/", 3)[3], trials=2, checkpoints=1, files=1)
    for group, version, plural, obj_name in (
        (constants.GROUP, constants.VERSION, constants.PLURAL, name),
        (constants.RAY_GROUP, constants.RAY_VERSION_API, constants.RAYJOB_PLURAL, rayjob["metadata"]["name"]),
        (constants.RAY_GROUP, constants.RAY_VERSION_API, constants.RAYCLUSTER_PLURAL, raycluster["metadata"]["name"]),
    ):
        custom.delete_namespaced_custom_object(
            group,
            version,
            "default",
            plural,
            obj_name,
            body=kubernetes.client.V1DeleteOptions(propagation_policy="Orphan"),
        )
    return name, synthetic


def remaining(server: EmulatorServer, name: str) -> list[str]:
    custom = kubernetes.client.CustomObjectsApi(server.api_client())
    found = []
    for group, version, plural in (
        (constants.GROUP, constants.VERSION, constants.PLURAL),
        (constants.RAY_GROUP, constants.RAY_VERSION_API, constants.RAYJOB_PLURAL),
        (constants.RAY_GROUP, constants.RAY_VERSION_API, constants.RAYCLUSTER_PLURAL),
    ):
        for obj in custom.list_namespaced_custom_object(group, version, "default", plural)["items"]:
            if obj["metadata"]["name"].startswith(name):
                assert obj["metadata"].get("deletionTimestamp"), "every object of the run is being deleted"
                found.append(f"{plural}/{obj['metadata']['name']}")
    return found


def events(server: EmulatorServer, reason: str) -> list[Any]:
    core = kubernetes.client.CoreV1Api(server.api_client())
    return [e for e in core.list_namespaced_event("default").items if e.reason == reason]


def test_release_verifies_first_and_releases_only_a_verified_run(
    cluster: tuple[EmulatorServer, Path], s3_server: Any, s3_client: Any, s3_bucket: str
) -> None:
    server, kubeconfig = cluster
    name, synthetic = held_run(server, s3_client, s3_server.endpoint_url, s3_bucket)
    assert len(remaining(server, name)) == 3
    guarded = sweepctl(kubeconfig, "guarded", "-A")
    assert guarded.returncode == 1 and "3 object(s) still guarded" in guarded.stderr

    missing = synthetic.delete_file()
    refused = sweepctl(kubeconfig, "release", name, "--reason", "namespace teardown")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "missing-file" in refused.stderr and missing.split("/")[-1] in refused.stderr
    assert len(remaining(server, name)) == 3, "nothing is released while the run does not verify"

    write_sweep(s3_client, s3_bucket, synthetic.root.prefix, trials=2, checkpoints=1, files=1)
    released = sweepctl(kubeconfig, "release", name, "--reason", "namespace teardown")
    assert released.returncode == 0, released.stdout + released.stderr
    wait_for(lambda: not remaining(server, name), 10, what="all three objects gone")
    notes = events(server, "CheckpointGuardReleased")
    assert len(notes) == 3 and all(
        "verified complete" in e.message and "namespace teardown" in e.message for e in notes
    )
    assert sweepctl(kubeconfig, "guarded", "-A").returncode == 0


def test_release_force_records_who_and_why(
    cluster: tuple[EmulatorServer, Path], s3_server: Any, s3_client: Any, s3_bucket: str
) -> None:
    server, kubeconfig = cluster
    name, synthetic = held_run(server, s3_client, s3_server.endpoint_url, s3_bucket)
    synthetic.delete_manifest()
    forced = sweepctl(kubeconfig, "release", name, "--force", "--reason", "data is expendable (ticket 42)")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    wait_for(lambda: not remaining(server, name), 10, what="force-released")
    audits = events(server, "CheckpointGuardForceReleased")
    assert len(audits) == 3 and all(
        e.type == "Warning" and "ticket 42" in e.message and "WITHOUT" in e.message for e in audits
    )
    history = server.history(
        constants.RAY_GROUP, constants.RAY_VERSION_API, constants.RAYJOB_PLURAL, "default", f"{name}-r1abcd"
    )
    records = [h["metadata"].get("annotations", {}).get(constants.ANNOTATION_FORCE_RELEASED) for h in history]
    record = json.loads(next(r for r in records if r))
    assert record["reason"] == "data is expendable (ticket 42)" and record["by"]


def test_release_refuses_what_is_not_being_deleted(cluster: tuple[EmulatorServer, Path]) -> None:
    server, kubeconfig = cluster
    custom = kubernetes.client.CustomObjectsApi(server.api_client())
    doc = cpu_sweep("alive", "default")
    doc["metadata"]["finalizers"] = [constants.FINALIZER]
    custom.create_namespaced_custom_object(constants.GROUP, constants.VERSION, "default", constants.PLURAL, doc)
    result = sweepctl(kubeconfig, "release", "alive", "--reason", "x")
    assert result.returncode == 2 and "not being deleted" in result.stdout
    assert custom.get_namespaced_custom_object(constants.GROUP, constants.VERSION, "default", constants.PLURAL, "alive")
