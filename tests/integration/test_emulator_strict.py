"""The strict emulator through the real kubectl: refusals naming the field, explain, tables, server-side apply.

Sources named below are kubernetes/kubernetes paths under staging/src/k8s.io/.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweep_contracts import constants
from sweep_sandbox.emulator import EmulatorServer
from tests.support.factories import DELETE, changed, cpu_sweep, gpu_sweep

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

KUBECTL = Path(sys.executable).parent / "kubectl"
G, V, P = constants.GROUP, constants.VERSION, constants.PLURAL


@pytest.fixture(scope="module")
def server() -> Iterator[EmulatorServer]:
    with EmulatorServer() as running:
        yield running


@pytest.fixture
def ns() -> str:
    return f"s-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def kubectl(server: EmulatorServer, tmp_path: Path, ns: str) -> Any:
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig", namespace=ns)
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path)}  # a fresh discovery cache

    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(KUBECTL), *args], env=env, capture_output=True, text=True, timeout=60, input=stdin)

    return run


def manifest(doc: dict[str, Any], ns: str) -> str:
    doc = {**doc, "metadata": {**doc["metadata"], "namespace": ns}}
    return yaml.safe_dump(doc, sort_keys=False)


# (changes to a valid sweep, the field the refusal must name, a piece of its message)
INVALID: list[tuple[Any, dict[str, Any], str, str]] = [
    (cpu_sweep, {"spec.tune.numSamples": 0}, "spec.tune.numSamples", "should be greater than or equal to 1"),
    (cpu_sweep, {"spec.tune.maxConcurrentTrials": 0}, "spec.tune.maxConcurrentTrials", "greater than or equal to 1"),
    (cpu_sweep, {"spec.trial.workers": 0}, "spec.trial.workers", "should be greater than or equal to 1"),
    (cpu_sweep, {"spec.trial.workers": "two"}, "spec.trial.workers", "must be of type integer"),
    (cpu_sweep, {"spec.trial.resourcesPerWorker.gpu": 17}, "spec.trial.resourcesPerWorker.gpu", "less than or equal"),
    (
        cpu_sweep,
        {"spec.trial.resourcesPerWorker.memory": "lots"},
        "spec.trial.resourcesPerWorker.memory",
        "should match",
    ),
    (cpu_sweep, {"spec.rayVersion": "2.9.0"}, "spec.rayVersion", 'Unsupported value: "2.9.0"'),
    (cpu_sweep, {"spec.image": ""}, "spec.image", "should be at least 1 chars long"),
    (cpu_sweep, {"spec.image": DELETE}, "spec.image", "Required value"),
    (cpu_sweep, {"spec.trainLoop": DELETE}, "spec.trainLoop", "Required value"),
    (cpu_sweep, {"spec.storage": DELETE}, "spec.storage", "Required value"),
    (cpu_sweep, {"spec.tune.mode": "minimise"}, "spec.tune.mode", "Unsupported value"),
    (cpu_sweep, {"spec.tune.searcher.type": "bayes"}, "spec.tune.searcher.type", "Unsupported value"),
    (cpu_sweep, {"spec.tune.scheduler.type": "pbt2"}, "spec.tune.scheduler.type", "Unsupported value"),
    (cpu_sweep, {"spec.suspend": "yes"}, "spec.suspend", "must be of type boolean"),
    (cpu_sweep, {"spec.deadlines.activeSeconds": 10}, "spec.deadlines.activeSeconds", "greater than or equal to 30"),
    (
        cpu_sweep,
        {"spec.deletion.verificationTimeoutSeconds": 1},
        "spec.deletion.verificationTimeoutSeconds",
        "greater than or equal to 10",
    ),
    (cpu_sweep, {"metadata.name": "Digits_CPU"}, "metadata.name", "RFC 1123 subdomain"),
    # CEL rules (x-kubernetes-validations), with their fieldPath
    (cpu_sweep, {"spec.tune.mode": DELETE}, "spec.tune.mode", "tune.metric and tune.mode must be set together"),
    (
        cpu_sweep,
        {"spec.tune.metric": DELETE, "spec.tune.mode": DELETE, "spec.tune.scheduler": {"type": "asha"}},
        "spec.tune.metric",
        "required by every scheduler but fifo",
    ),
    (
        cpu_sweep,
        {"spec.tune.metric": DELETE, "spec.tune.mode": DELETE, "spec.tune.searcher": {"type": "optuna"}},
        "spec.tune.metric",
        "required by searcher optuna",
    ),
    (gpu_sweep, {"spec.tune.scheduler.gracePeriod": 7}, "spec.tune.scheduler.gracePeriod", "must be <= maxT"),
    (
        gpu_sweep,
        {"spec.workerGroup.instanceType": ""},
        "spec.workerGroup.instanceType",
        "workerGroup.instanceType is required",
    ),
    (
        cpu_sweep,
        {"spec.workerGroup.minReplicas": 99},
        "spec.workerGroup.minReplicas",
        "workerGroup.minReplicas must be <= trial.workers x tune.maxConcurrentTrials",
    ),
    (
        cpu_sweep,
        {"spec.deadlines.startupSeconds": 30000},
        "spec.deadlines.startupSeconds",
        "deadlines.startupSeconds must be less than deadlines.activeSeconds",
    ),
    (
        cpu_sweep,
        {"spec.deadlines.gracefulStopSeconds": 30000},
        "spec.deadlines.gracefulStopSeconds",
        "gracefulStopSeconds must be less than deadlines.activeSeconds",
    ),
    (
        cpu_sweep,
        {"spec.deletion.retryBackoffSeconds": 900, "spec.deletion.maxRetryBackoffSeconds": 60},
        "spec.deletion.maxRetryBackoffSeconds",
        "must be >= deletion.retryBackoffSeconds",
    ),
]


def test_kubectl_apply_of_invalid_sweeps_prints_the_servers_refusal_naming_the_field(
    kubectl: Any, server: EmulatorServer, ns: str
) -> None:
    """27 invalid TrainingSweeps, schema and CEL rules alike, through plain `kubectl apply -f` (no flag).

    Models apiextensions-apiserver/pkg/registry/customresource/strategy.go Validate (schema validation through
    apiextensions-apiserver/pkg/apiserver/validation/validation.go kubeOpenAPIResultToFieldErrors, CEL through
    apiextensions-apiserver/pkg/apiserver/schema/cel/validation.go validateExpressions with fieldPath) and
    apimachinery/pkg/api/errors/errors.go NewInvalid; kubectl prints `The <Kind> "<name>" is invalid: ...`.
    """
    assert len(INVALID) >= 20
    for factory, changes, field_path, text in INVALID:
        doc = changed(factory(f"bad-{len(changes)}"), changes)
        done = kubectl("apply", "-f", "-", stdin=manifest(doc, ns))
        assert done.returncode != 0, (changes, done.stdout)
        name = doc["metadata"]["name"]
        assert f'The TrainingSweep "{name}" is invalid:' in done.stderr, (changes, done.stderr)
        assert f"{field_path}: " in done.stderr and text in done.stderr, (changes, done.stderr)
    stored = server.call(
        lambda: [
            k for k in server.emulator.store.live_keys.get(server.emulator.resource_type(G, V, P).key, ()) if k[1] == ns
        ]
    )
    assert stored == []  # nothing invalid was stored


def test_plain_kubectl_apply_validates_on_the_server_and_refuses_unknown_fields(kubectl: Any, ns: str) -> None:
    """kubectl's default --validate=strict: cli-runtime/pkg/resource/query_param_verifier_v3.go HasSupport finds
    fieldValidation on the kind's PATCH in /openapi/v3 and sends fieldValidation=Strict;
    apiserver/pkg/endpoints/handlers/create.go answers a strict decoding error with 400 (transformDecodeError); Warn
    answers `Warning: unknown field` and prunes."""
    doc = cpu_sweep("typo")
    doc["spec"]["tune"]["numSampels"] = 4
    strict = kubectl("apply", "-f", "-", stdin=manifest(doc, ns))
    assert strict.returncode != 0
    assert (
        'TrainingSweep in version "v1alpha1" cannot be handled as a TrainingSweep: strict decoding error: '
        'unknown field "spec.tune.numSampels"'
    ) in strict.stderr
    warned = kubectl("apply", "--validate=warn", "-f", "-", stdin=manifest(doc, ns))
    assert warned.returncode == 0 and 'Warning: unknown field "spec.tune.numSampels"' in warned.stderr
    stored = yaml.safe_load(kubectl("get", "tsw", "typo", "-o", "yaml").stdout)
    assert "numSampels" not in stored["spec"]["tune"] and stored["spec"]["tune"]["numSamples"] == 8
    # on an existing object kubectl patches: handlers/patch.go answers 422 on the field `patch` quoting the result
    patched = kubectl("apply", "-f", "-", stdin=manifest(changed(doc, {"spec.tune.numSampels": 5}), ns))
    assert patched.returncode != 0 and "The request is invalid: patch: Invalid value: " in patched.stderr
    assert 'strict decoding error: unknown field "spec.tune.numSampels"' in patched.stderr
    assert stored["spec"]["deletion"]["maxRetryBackoffSeconds"] == 600  # a schema default, applied by the server


def test_kubectl_explain_prints_our_field_descriptions(kubectl: Any) -> None:
    """kubectl explain reads /openapi/v3/apis/sweeps.dev/v1alpha1
    (apiextensions-apiserver/pkg/controller/openapi/builder/builder.go)."""
    from sweep_operator.crd import build_crd

    explained = kubectl("explain", "trainingsweep.spec.deadlines")
    assert explained.returncode == 0, explained.stderr
    deadlines = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "deadlines"
    ]
    assert "KIND:       TrainingSweep" in explained.stdout and "FIELD: deadlines <Object>" in explained.stdout
    assert deadlines["description"].split()[0] in explained.stdout
    for name in deadlines["properties"]:
        assert f"  {name}\t<integer>" in explained.stdout
    assert kubectl("explain", "rayjob.spec").returncode == 0


def test_kubectl_get_tsw_prints_the_server_side_table(kubectl: Any, server: EmulatorServer, ns: str) -> None:
    """apiextensions-apiserver/pkg/registry/customresource/tableconvertor/tableconvertor.go ConvertToTable: the CRD's
    additionalPrinterColumns, as Table rows."""
    assert kubectl("apply", "-f", "-", stdin=manifest(cpu_sweep("t"), ns)).returncode == 0
    import kubernetes.client

    custom = kubernetes.client.CustomObjectsApi(server.api_client())
    custom.patch_namespaced_custom_object_status(
        G, V, ns, P, "t", {"status": {"phase": "Running", "trialsSummary": "1/8"}}
    )
    lines = kubectl("get", "tsw").stdout.splitlines()
    header = ["NAME", "PHASE", "TRIALS", "BEST", "VERIFIED", "RAYJOB", "GPU-HOURS", "DEADLINE", "FINISHED", "AGE"]
    assert lines[0].split() == header
    assert lines[1].split()[:3] == ["t", "Running", "1/8"]


def test_server_side_apply_reports_conflicts_and_force_takes_the_fields(kubectl: Any, ns: str) -> None:
    """apimachinery/pkg/util/managedfields/internal/conflict.go NewConflictError (409, `conflict with "<manager>" using
    <version>`); --force-conflicts takes ownership (kubernetes-sigs/structured-merge-diff merge/update.go
    Updater.Apply with force)."""
    assert kubectl("apply", "-f", "-", stdin=manifest(cpu_sweep("ssa"), ns)).returncode == 0
    edited = manifest(changed(cpu_sweep("ssa"), {"spec.tune.numSamples": 5}), ns)
    refused = kubectl("apply", "--server-side", "-f", "-", stdin=edited)
    assert refused.returncode != 0
    assert (
        'Apply failed with 1 conflict: conflict with "kubectl-client-side-apply" using sweeps.dev/v1alpha1: '
        ".spec.tune.numSamples"
    ) in refused.stderr
    forced = kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=edited)
    assert forced.returncode == 0 and "serverside-applied" in forced.stdout
    stored = yaml.safe_load(kubectl("get", "tsw", "ssa", "-o", "yaml", "--show-managed-fields").stdout)
    assert stored["spec"]["tune"]["numSamples"] == 5
    owners = {e["manager"]: e for e in stored["metadata"]["managedFields"]}
    assert owners["kubectl"]["operation"] == "Apply"
    assert "f:numSamples" in owners["kubectl"]["fieldsV1"]["f:spec"]["f:tune"]
    assert "f:numSamples" not in owners["kubectl-client-side-apply"]["fieldsV1"]["f:spec"].get("f:tune", {})
    fresh = kubectl("apply", "--server-side", "-f", "-", stdin=manifest(cpu_sweep("ssa-new"), ns))
    assert fresh.returncode == 0, fresh.stderr  # an apply creates a missing object
    invalid = kubectl(
        "apply",
        "--server-side",
        "-f",
        "-",
        stdin=manifest(changed(cpu_sweep("ssa-new"), {"spec.trial.workers": 0}), ns),
    )
    assert invalid.returncode != 0 and "spec.trial.workers: Invalid value: 0" in invalid.stderr


def test_status_writes_are_pruned_and_validated_and_spec_writes_ignore_status(server: EmulatorServer, ns: str) -> None:
    """apiextensions-apiserver/pkg/registry/customresource/status_strategy.go PrepareForUpdate (only status kept) and
    ValidateUpdate; strategy.go PrepareForUpdate (status kept from the stored object; generation moves on spec
    changes only); the Warn default sends `Warning: 299` headers (apiserver/pkg/warning)."""
    import kubernetes.client

    api = server.api_client()
    custom = kubernetes.client.CustomObjectsApi(api)
    custom.create_namespaced_custom_object(G, V, ns, P, cpu_sweep("st", ns))
    patched = custom.patch_namespaced_custom_object_status(
        G, V, ns, P, "st", {"status": {"phase": "Running", "notInSchema": "x"}, "spec": {"image": "other"}}
    )
    assert patched["status"] == {"phase": "Running"} and patched["spec"]["image"] == cpu_sweep()["spec"]["image"]
    assert patched["metadata"]["generation"] == 1
    with pytest.raises(kubernetes.client.ApiException) as refused:
        custom.patch_namespaced_custom_object_status(G, V, ns, P, "st", {"status": {"phase": "Exploded"}})
    assert refused.value.status == 422 and "status.phase: Unsupported value" in refused.value.body
    main = custom.patch_namespaced_custom_object(
        G, V, ns, P, "st", {"spec": {"suspend": True}, "status": {"phase": "Failed"}}
    )
    assert main["status"]["phase"] == "Running" and main["metadata"]["generation"] == 2
    _, _, headers = custom.patch_namespaced_custom_object_with_http_info(G, V, ns, P, "st", {"spec": {"zzz": 1}})
    assert 'unknown field \\"spec.zzz\\"' in headers.get("Warning", "")


def test_a_new_default_in_the_crd_reaches_stored_objects_on_read(server: EmulatorServer, ns: str) -> None:
    """The CR codec defaults what it decodes from etcd
    (apiextensions-apiserver/pkg/apiserver/customresource_handler.go, structuraldefaulting.Default in the storage
    decoder): objects stored before the default read with it."""
    import copy

    import kubernetes.client

    from sweep_operator.crd import build_crd

    custom = kubernetes.client.CustomObjectsApi(server.api_client())
    created = custom.create_namespaced_custom_object(G, V, ns, P, cpu_sweep("old", ns))
    assert "image" in created["spec"]
    crd = build_crd()
    updated = copy.deepcopy(crd)
    schema = updated["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    schema["extraKnob"] = {"type": "string", "default": "on", "description": "a field added later"}
    crds = ("apiextensions.k8s.io", "v1", "customresourcedefinitions", crd["metadata"]["name"])
    try:
        custom.patch_cluster_custom_object(*crds, {"spec": {"versions": updated["spec"]["versions"]}})
        read = custom.get_namespaced_custom_object(G, V, ns, P, "old")
        assert read["spec"]["extraKnob"] == "on"
        assert read["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    finally:
        custom.patch_cluster_custom_object(*crds, {"spec": {"versions": crd["spec"]["versions"]}})


def test_every_example_manifest_passes_plain_kubectl_apply(kubectl: Any, ns: str) -> None:
    """The README's examples against the strict server (apiextensions-apiserver/pkg/registry/customresource/strategy.go
    Validate, CEL rules included)."""
    examples = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
    assert examples
    for path in examples:
        doc = yaml.safe_load(path.read_text())
        done = kubectl("apply", "-f", "-", stdin=manifest(doc, ns))
        assert done.returncode == 0 and "created" in done.stdout, (path.name, done.stderr)


def test_server_dry_run_validates_and_stores_nothing(kubectl: Any, ns: str) -> None:
    """dryRun=All (kubectl --dry-run=server): admission and validation run, storage does not
    (apiserver/pkg/registry/generic/registry/dryrun.go DryRunnableStorage)."""
    created = kubectl("apply", "--dry-run=server", "-f", "-", stdin=manifest(cpu_sweep("dry"), ns))
    assert created.returncode == 0 and "created (server dry run)" in created.stdout, created.stderr
    assert "NotFound" in kubectl("get", "tsw", "dry").stderr
    refused = kubectl(
        "apply", "--dry-run=server", "-f", "-", stdin=manifest(changed(cpu_sweep("dry"), {"spec.trial.workers": 0}), ns)
    )
    assert refused.returncode != 0 and "spec.trial.workers: Invalid value: 0" in refused.stderr
    assert kubectl("apply", "-f", "-", stdin=manifest(cpu_sweep("dry"), ns)).returncode == 0
    edited = kubectl(
        "apply",
        "--dry-run=server",
        "-f",
        "-",
        stdin=manifest(changed(cpu_sweep("dry"), {"spec.tune.numSamples": 3}), ns),
    )
    assert edited.returncode == 0 and "configured (server dry run)" in edited.stdout, edited.stderr
    assert kubectl("get", "tsw", "dry", "-o", "jsonpath={.spec.tune.numSamples}").stdout == "8"
    assert kubectl("delete", "tsw", "dry", "--dry-run=server").returncode == 0
    assert kubectl("get", "tsw", "dry", "-o", "name").stdout.strip().endswith("/dry")


def test_custom_resources_take_no_unconditional_update_nor_a_create_with_a_resource_version(
    server: EmulatorServer, ns: str
) -> None:
    """apiextensions-apiserver/pkg/registry/customresource/strategy.go AllowUnconditionalUpdate() false ->
    apiserver/pkg/registry/generic/registry/store.go Update's
    `metadata.resourceVersion: Invalid value: 0x0: must be specified for an update`;
    apiserver/pkg/storage/etcd3/store.go Create:
    `resourceVersion should not be set on objects to be created`."""
    import kubernetes.client

    custom = kubernetes.client.CustomObjectsApi(server.api_client())
    created = custom.create_namespaced_custom_object(G, V, ns, P, cpu_sweep("rv", ns))
    body = {**created, "metadata": {k: v for k, v in created["metadata"].items() if k != "resourceVersion"}}
    with pytest.raises(kubernetes.client.ApiException) as unconditional:
        custom.replace_namespaced_custom_object(G, V, ns, P, "rv", body)
    assert unconditional.value.status == 422
    assert (
        'trainingsweeps.sweeps.dev \\"rv\\" is invalid: metadata.resourceVersion: Invalid value: 0x0: must be '
        "specified for an update"
    ) in unconditional.value.body
    replaced = custom.replace_namespaced_custom_object(G, V, ns, P, "rv", created)  # with it, fine
    assert replaced["metadata"]["name"] == "rv"
    with pytest.raises(kubernetes.client.ApiException) as recreated:
        custom.create_namespaced_custom_object(
            G,
            V,
            ns,
            P,
            {**created, "metadata": {"name": "rv2", "resourceVersion": created["metadata"]["resourceVersion"]}},
        )
    assert recreated.value.status == 500 and "should not be set on objects to be created" in recreated.value.body


def test_pruned_fields_are_recorded_for_tests_to_assert_on(server: EmulatorServer, ns: str) -> None:
    """What a real server drops silently (Warn: a warning header no client library shows) is kept in
    `emulator.unknown_fields`, so a component's test can assert it writes nothing the schema lacks."""
    import kubernetes.client

    custom = kubernetes.client.CustomObjectsApi(server.api_client())
    custom.create_namespaced_custom_object(G, V, ns, P, cpu_sweep("pr", ns))
    custom.patch_namespaced_custom_object_status(
        G, V, ns, P, "pr", {"status": {"phase": "Running", "startedAtt": "typo"}}
    )
    assert (f"{P}.{G}", "status.startedAtt") in server.call(lambda: list(server.emulator.unknown_fields))
