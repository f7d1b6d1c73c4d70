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
from sweep_sandbox.emulator import EmulatorServer
from tests.support.factories import changed, cpu_sweep
from tests.support.sweep_factory import SyntheticSweep, write_sweep
from tests.support.waiting import wait_for

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


def held_run(
    server: EmulatorServer,
    s3_client: Any,
    endpoint: str,
    bucket: str,
    *,
    name: str | None = None,
    run_id: str = "r1abcd",
    write: bool = True,
) -> tuple[str, SyntheticSweep | None]:
    """A sweep, RayJob and RayCluster as an operator left them, all being deleted, the run complete in S3 (nothing
    written with `write=False`)."""
    custom = kubernetes.client.CustomObjectsApi(server.api_client())
    name = name or f"rel-{uuid.uuid4().hex[:5]}"
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
    rayjob = build_rayjob(parsed, run_id, RenderContext())
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
                "runId": run_id,
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
    synthetic = (
        write_sweep(s3_client, bucket, root.split("/", 3)[3], trials=2, checkpoints=1, files=1) if write else None
    )
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
    assert synthetic is not None
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
    assert synthetic is not None
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


def _drop_finalizer(server: EmulatorServer, plural: str, name: str) -> None:
    """What a release of that object did earlier (the operator's guard, before this run's)."""
    group, version = (
        (constants.GROUP, constants.VERSION)
        if plural == constants.PLURAL
        else (constants.RAY_GROUP, constants.RAY_VERSION_API)
    )
    custom = kubernetes.client.CustomObjectsApi(server.api_client())
    custom.patch_namespaced_custom_object(
        group,
        version,
        "default",
        plural,
        name,
        [{"op": "remove", "path": "/metadata/finalizers/0"}],
        _content_type="application/json-patch+json",
    )


def test_release_matches_objects_by_the_run_in_their_guard_record_and_refuses_several_runs(
    cluster: tuple[EmulatorServer, Path], s3_server: Any, s3_client: Any, s3_bucket: str
) -> None:
    """Issue 25, defect 4: an older run's RayCluster is held (a checkpoint file missing); the sweep was deleted and
    re-created under the same name, and its new run (nothing in S3 yet) is being deleted too. `release` by name
    sees two runs: it refuses and lists them; `--run-id` releases only that run's objects, verified against that
    run's own root, and the older run's cluster stays held (the new empty root never speaks for it)."""
    server, kubeconfig = cluster
    name, old = held_run(server, s3_client, s3_server.endpoint_url, s3_bucket, run_id="r1abcd")
    assert old is not None
    old_objects = remaining(server, name)
    old_cluster = next(o.split("/", 1)[1] for o in old_objects if o.startswith(constants.RAYCLUSTER_PLURAL))
    _drop_finalizer(server, constants.PLURAL, name)
    _drop_finalizer(server, constants.RAYJOB_PLURAL, next(o.split("/", 1)[1] for o in old_objects if "rayjobs/" in o))
    wait_for(lambda: remaining(server, name) == [f"{constants.RAYCLUSTER_PLURAL}/{old_cluster}"], 10, what="old run")
    missing = old.delete_file()
    held_run(server, s3_client, s3_server.endpoint_url, s3_bucket, name=name, run_id="r2efgh", write=False)

    refused = sweepctl(kubeconfig, "release", name, "--reason", "cleanup")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "several runs" in refused.stderr and "r1abcd" in refused.stderr and "r2efgh" in refused.stderr
    assert len(remaining(server, name)) == 4, "nothing is released when the runs are ambiguous"

    newer = sweepctl(kubeconfig, "release", name, "--reason", "cleanup", "--run-id", "r2efgh")
    assert newer.returncode == 0, newer.stdout + newer.stderr
    wait_for(
        lambda: remaining(server, name) == [f"{constants.RAYCLUSTER_PLURAL}/{old_cluster}"], 10, what="run 2 released"
    )
    older = sweepctl(kubeconfig, "release", name, "--reason", "cleanup", "--run-id", "r1abcd")
    assert older.returncode == 1 and "missing-file" in older.stderr and missing.split("/")[-1] in older.stderr
    assert remaining(server, name) == [f"{constants.RAYCLUSTER_PLURAL}/{old_cluster}"], "the older run stays held"
