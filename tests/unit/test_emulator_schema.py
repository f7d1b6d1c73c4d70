"""The emulator's structural-schema logic (sandbox/schema.py, schema_apply.py): pure, no server.

Sources named below are kubernetes/kubernetes paths under staging/src/k8s.io/ unless another repository is named.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from sweep_operator.crd import build_crd
from sweep_sandbox import emulator, schema_apply
from sweep_sandbox.schema import CrdSchema
from sweep_sandbox.schema_errors import FieldError, invalid_status
from sweep_sandbox.schema_nodes import SchemaError, compile_node, every_rule
from sweep_sandbox.schema_rules import CelCompiler
from tests.support.factories import DELETE, changed, cpu_sweep, gpu_sweep
from tests.support.schemas import require_kuberay_crds


@pytest.fixture(scope="module")
def sweeps() -> CrdSchema:
    version = build_crd()["spec"]["versions"][0]
    return emulator.compiled_schema("TrainingSweep", "sweeps.dev", version)


def admitted(schema: CrdSchema, obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    obj = copy.deepcopy(obj)
    schema.decode(obj)
    return [str(e) for e in schema.errors(obj, old)]


def every_loaded_crd() -> list[dict[str, Any]]:
    crds = [emulator.sweep_crd(), *emulator.KUBERAY_CRDS, *emulator.KOPF_PEERING_CRDS]
    if emulator.kuberay_crd_dir() is not None:
        crds += list(emulator.kuberay_crds())
    return crds


# ---- CEL rules compile


def test_every_cel_rule_of_every_crd_the_emulator_loads_compiles() -> None:
    """A rule cel-python cannot compile, or that names an unknown function or field, fails here (never silently).

    Models apiextensions-apiserver/pkg/apiserver/schema/cel/compilation.go Compile (a CRD with such a rule is
    refused by the real server's CRD validation).
    """
    counted = 0
    for crd in every_loaded_crd():
        for version in crd["spec"]["versions"]:
            compiled = emulator.compiled_schema(crd["spec"]["names"]["kind"], crd["spec"]["group"], version)
            for path, rule in every_rule(compiled.root):
                assert rule.program is not None, (crd["metadata"]["name"], path, rule.rule)
                counted += 1
    assert counted >= 9  # our CRD's spec rules at least (KubeRay's add theirs when ../shared has them)


@pytest.mark.parametrize(
    ("rule", "wanted"),
    [
        ("self.tune.metrc == 'x'", "undefined field 'metrc'"),
        ("self.image.startWith('x')", "undeclared reference to 'startWith'"),
        ("self.image ==", "compilation failed"),
    ],
)
def test_a_rule_that_would_not_compile_on_the_apiserver_is_refused(rule: str, wanted: str) -> None:
    """apiextensions-apiserver/pkg/apiserver/schema/cel/compilation.go Compile: undeclared references and undefined
    fields are compile errors (cel-go's checker)."""
    spec = copy.deepcopy(build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"])
    spec["x-kubernetes-validations"] = [{"rule": rule}]
    with pytest.raises(SchemaError, match=wanted):
        compile_node(spec, "spec", CelCompiler())


def test_kubernetes_cel_library_functions_missing_from_cel_python_are_provided() -> None:
    """apiserver/pkg/cel/library/lists.go (isSorted, sum, min, max, indexOf); cel-go ext/strings.go (lowerAscii,
    split)."""
    schema = CrdSchema(
        "K",
        "g",
        {
            "type": "object",
            "properties": {"xs": {"type": "array", "items": {"type": "integer"}}, "s": {"type": "string"}},
            "x-kubernetes-validations": [
                {"rule": "self.xs.isSorted()", "message": "sorted"},
                {"rule": "self.xs.sum() == 6", "message": "sum"},
                {"rule": "self.xs.min() == 1 && self.xs.max() == 3", "message": "minmax"},
                {"rule": "self.xs.indexOf(2) == 1", "message": "indexOf"},
                {"rule": "self.s.lowerAscii() == 'ab' && self.s.split('B') == ['A', '']", "message": "strings"},
            ],
        },
    )
    assert schema.errors({"metadata": {"name": "a"}, "xs": [1, 2, 3], "s": "AB"}) == []
    failed = schema.errors({"metadata": {"name": "a"}, "xs": [3, 2, 1], "s": "Ab"})
    assert [e.detail for e in failed] == ["sorted", "strings"]


# ---- pruning and defaulting


def test_unknown_fields_are_pruned_and_preserve_unknown_fields_kept(sweeps: CrdSchema) -> None:
    """apiextensions-apiserver/pkg/apiserver/schema/pruning/algorithm.go PruneWithOptions; metadata pruned to
    ObjectMeta."""
    obj = cpu_sweep()
    obj["spec"]["bogus"] = 1
    obj["spec"]["tune"]["typo"] = {"x": 1}
    obj["metadata"]["extra"] = "x"
    obj["status"] = {
        "phase": "Running",
        "notAField": "2026-01-01T00:00:00Z",
        "bestTrial": {"config": {"lr": 0.1, "any": {"thing": 1}}},
    }
    pruned = sweeps.decode(obj)
    assert sorted(pruned) == ["metadata.extra", "spec.bogus", "spec.tune.typo", "status.notAField"]
    assert obj["status"]["bestTrial"]["config"] == {"lr": 0.1, "any": {"thing": 1}}  # preserve-unknown-fields
    assert obj["spec"]["paramSpace"]["lr"] == {"loguniform": [1.0e-4, 1.0e-1]}  # additionalProperties preserved


def test_embedded_resource_keeps_type_meta_and_prunes_its_metadata() -> None:
    """apiextensions-apiserver/pkg/apiserver/schema/pruning/algorithm.go prune: x-kubernetes-embedded-resource keeps
    apiVersion/kind/metadata, metadata as ObjectMeta."""
    node = compile_node(
        {
            "type": "object",
            "properties": {
                "template": {
                    "type": "object",
                    "x-kubernetes-embedded-resource": True,
                    "properties": {"spec": {"type": "object", "properties": {"a": {"type": "string"}}}},
                }
            },
        }
    )
    from sweep_sandbox.schema_validation import prune

    obj = {
        "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", "bad": 1}, "spec": {"a": "1", "b": 2}}
    }
    assert sorted(prune(obj, node)) == ["template.metadata.bad", "template.spec.b"]
    assert obj == {"template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": {"a": "1"}}}


def test_defaults_apply_top_down_and_replace_non_nullable_nulls(sweeps: CrdSchema) -> None:
    """apiextensions-apiserver/pkg/apiserver/schema/defaulting/algorithm.go Default and prunenulls.go
    PruneNonNullableNullsWithoutDefaults."""
    obj = changed(cpu_sweep(), {"spec.tune.scheduler": DELETE, "spec.deletion": DELETE, "spec.suspend": None})
    sweeps.decode(obj)
    assert obj["spec"]["tune"]["scheduler"]["type"] == "fifo"  # defaulted {} got its own defaults
    assert obj["spec"]["deletion"]["verificationTimeoutSeconds"] == 900
    assert obj["spec"]["suspend"] is False  # a null non-nullable field takes its default
    assert obj["spec"]["trial"]["resourcesPerWorker"]["memory"] == "1Gi"  # given values stay


# ---- validation messages, as the apiserver writes them


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"spec.tune.numSamples": 0},
            "spec.tune.numSamples: Invalid value: 0: spec.tune.numSamples in body should be greater than or equal to 1",
        ),
        ({"spec.rayVersion": "2.9.0"}, 'spec.rayVersion: Unsupported value: "2.9.0": supported values: "2.58.0"'),
        ({"spec.image": ""}, 'spec.image: Invalid value: "": spec.image in body should be at least 1 chars long'),
        ({"spec.trainLoop": DELETE}, "spec.trainLoop: Required value"),
        (
            {"spec.trial.workers": "2"},
            'spec.trial.workers: Invalid value: "string": spec.trial.workers in body must be of type integer: "string"',
        ),
        (
            {"spec.trial.resourcesPerWorker.gpu": 17},
            "spec.trial.resourcesPerWorker.gpu: Invalid value: 17: spec.trial.resourcesPerWorker.gpu in body should be "
            "less than or equal to 16",
        ),
        (
            {"spec.trial.resourcesPerWorker.memory": "lots"},
            'spec.trial.resourcesPerWorker.memory: Invalid value: "lots": spec.trial.resourcesPerWorker.memory in body '
            "should match '^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\\+|-)?(([0-9]+"
            "(\\.[0-9]*)?)|(\\.[0-9]+))))?$'",
        ),
        (
            {"spec.trial.resourcesPerWorker.memory": True},
            'spec.trial.resourcesPerWorker.memory: Invalid value: "boolean": spec.trial.resourcesPerWorker.memory in body '
            'must be of type integer,string: "boolean"',
        ),
        (
            {"spec.tune.mode": DELETE},
            'spec.tune.mode: Invalid value: "object": tune.metric and tune.mode must be set together',
        ),
        (
            {"spec.deadlines.startupSeconds": 30000},  # `!has(..) || ..`: cel-python's compiled runner got it wrong
            'spec.deadlines.startupSeconds: Invalid value: "object": deadlines.startupSeconds must be less than '
            "deadlines.activeSeconds",
        ),
        (
            {"spec.deletion.retryBackoffSeconds": 900, "spec.deletion.maxRetryBackoffSeconds": 60},
            'spec.deletion.maxRetryBackoffSeconds: Invalid value: "object": deletion.maxRetryBackoffSeconds must be >= '
            "deletion.retryBackoffSeconds",
        ),
    ],
)
def test_refusals_read_as_the_apiserver_writes_them(sweeps: CrdSchema, changes: dict[str, Any], message: str) -> None:
    """apiextensions-apiserver/pkg/apiserver/validation/validation.go kubeOpenAPIResultToFieldErrors over
    kubernetes/kube-openapi pkg/validation/errors/schema.go messages;
    apiextensions-apiserver/pkg/apiserver/schema/cel/validation.go for rules;
    apimachinery/pkg/util/validation/field/errors.go Error.Error() for the text."""
    assert admitted(sweeps, changed(cpu_sweep(), changes))[0] == message


def test_schema_errors_that_block_cel_say_so(sweeps: CrdSchema) -> None:
    """apiextensions-apiserver/pkg/registry/customresource/strategy.go hasBlockingErr: a Required/type/enum error keeps
    the rules from running."""
    errors = admitted(sweeps, changed(cpu_sweep(), {"spec.image": DELETE, "spec.tune.mode": DELETE}))
    assert errors == [
        "spec.image: Required value",
        '<nil>: Invalid value: "null": some validation rules were not '
        "checked because the object was invalid; correct the existing errors to complete validation",
    ]


def test_metadata_name_must_be_a_dns_subdomain(sweeps: CrdSchema) -> None:
    """apimachinery/pkg/api/validation/objectmeta.go ValidateObjectMetaAccessor with NameIsDNSSubdomain, as
    apiextensions-apiserver/pkg/registry/customresource/validator.go Validate calls it."""
    errors = admitted(sweeps, changed(cpu_sweep(), {"metadata.name": "Digits_CPU"}))
    assert errors[0].startswith('metadata.name: Invalid value: "Digits_CPU": a lowercase RFC 1123 subdomain')


def test_invalid_status_is_the_422_body_kubectl_prints(sweeps: CrdSchema) -> None:
    """apimachinery/pkg/api/errors/errors.go NewInvalid: `<Kind>.<group> "<name>" is invalid: [a, b]`, causes per
    field."""
    obj = changed(gpu_sweep(), {"spec.tune.numSamples": 0, "spec.trial.workers": 0})
    sweeps.decode(obj)
    status = invalid_status("TrainingSweep", "sweeps.dev", "digits", sweeps.errors(obj))
    assert status["code"] == 422 and status["reason"] == "Invalid"
    assert status["message"].startswith('TrainingSweep.sweeps.dev "digits" is invalid: [spec.tune.numSamples: ')
    assert [c["field"] for c in status["details"]["causes"]] == ["spec.tune.numSamples", "spec.trial.workers"]
    assert status["details"]["causes"][0]["reason"] == "FieldValueInvalid"


def test_field_error_bodies_print_values_as_go_does() -> None:
    """apimachinery/pkg/util/validation/field/errors.go Error.ErrorBody: %q strings, %v numbers,
    Required/Forbidden/TooLong without the value."""
    assert FieldError("FieldValueInvalid", "a", 0.5, "d").body() == "Invalid value: 0.5: d"
    assert FieldError("FieldValueInvalid", "a", 4.0, "d").body() == "Invalid value: 4: d"
    assert (
        FieldError("FieldValueTooLong", "a", "xxx", "may not be longer than 2").body()
        == "Too long: may not be longer than 2"
    )
    assert (
        FieldError("FieldValueTooMany", "a", 3, "must have at most 2 items").body()
        == "Too many: 3: must have at most 2 items"
    )


def test_status_writes_validate_status_and_ratchet_unchanged_values(sweeps: CrdSchema) -> None:
    """apiextensions-apiserver/pkg/registry/customresource/status_strategy.go ValidateUpdate (status schema only) and
    apiextensions-apiserver/pkg/apiserver/schema/validation/ratcheting.go."""
    stored = cpu_sweep()
    sweeps.decode(stored)
    update = {**copy.deepcopy(stored), "status": {"phase": "Bogus"}}
    assert next(str(e) for e in sweeps.errors(update, stored, status_only=True)) == (
        'status.phase: Unsupported value: "Bogus": supported values: "Pending", "Queued", "Starting", "Running", '
        '"Succeeded", "Failed", "DeadlineExceeded", "Invalid", "Deleting", "Suspended", '
        '"BudgetExhausted"'
    )
    legacy = changed(stored, {"spec.tune.numSamples": 0})  # stored before the rule existed
    relabelled = changed(legacy, {"metadata.labels": {"a": "b"}})
    assert sweeps.errors(relabelled, legacy) == []  # unchanged invalid value is ratcheted
    assert sweeps.errors(changed(legacy, {"spec.tune.numSamples": -1}), legacy)


# ---- KubeRay's CRDs


def test_kuberay_transition_rule_makes_managed_by_immutable() -> None:
    """ray-project/kuberay ray-operator/config/crd/bases/ray.io_rayjobs.yaml spec.managedBy: `self == oldSelf` (a
    transition rule: apiextensions-apiserver/pkg/apiserver/schema/cel/validation.go with oldSelf)."""
    require_kuberay_crds()  # skips saying how to get them; fails under SWEEPS_REQUIRE_KUBERAY_CRDS=1 (.ci/run)
    rayjobs = next(c for c in emulator.kuberay_crds() if c["spec"]["names"]["kind"] == "RayJob")
    version = next(v for v in rayjobs["spec"]["versions"] if v["name"] == "v1")
    schema = emulator.compiled_schema("RayJob", "ray.io", version)
    job = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "j"},
        "spec": {"entrypoint": "python x.py", "managedBy": "ray.io/kuberay-operator"},
    }
    assert admitted(schema, job) == []
    moved = changed(job, {"spec.managedBy": "kueue.x-k8s.io/multikueue"})
    assert admitted(schema, moved, job) == ['spec.managedBy: Invalid value: "string": the managedBy field is immutable']
    other = changed(job, {"spec.managedBy": "me"})
    assert "the managedBy field value must be either" in admitted(schema, other)[0]


# ---- server-side apply


def test_apply_conflict_names_the_field_and_the_updater() -> None:
    """apimachinery/pkg/util/managedfields/internal/conflict.go NewConflictError and printManager (an Update manager
    `using` its version)."""
    stored = {
        "apiVersion": "sweeps.dev/v1alpha1",
        "kind": "TrainingSweep",
        "metadata": {"name": "a"},
        "spec": {"tune": {"numSamples": 2}, "image": "i"},
    }
    schema_apply.record(stored, None, "kubectl-client-side-apply", "sweeps.dev/v1alpha1")
    applied = {"metadata": {"name": "a"}, "spec": {"tune": {"numSamples": 5}, "image": "i"}}
    with pytest.raises(schema_apply.ApplyConflict) as raised:
        schema_apply.apply(stored, applied, "kubectl", "sweeps.dev/v1alpha1", False, None)
    assert str(raised.value) == (
        'Apply failed with 1 conflict: conflict with "kubectl-client-side-apply" using '
        "sweeps.dev/v1alpha1: .spec.tune.numSamples"
    )
    assert raised.value.status()["details"]["causes"][0]["field"] == ".spec.tune.numSamples"
    forced = schema_apply.apply(stored, applied, "kubectl", "sweeps.dev/v1alpha1", True, None)
    assert forced["spec"]["tune"]["numSamples"] == 5
    shared = schema_apply.apply(
        stored, {"metadata": {"name": "a"}, "spec": {"image": "i"}}, "kubectl", "sweeps.dev/v1alpha1", False, None
    )  # an equal value is co-owned, no conflict
    managers = {e["manager"] for e in shared["metadata"]["managedFields"]}
    assert managers == {"kubectl", "kubectl-client-side-apply"}


def test_apply_removes_fields_the_applier_stopped_sending() -> None:
    """kubernetes-sigs/structured-merge-diff merge/update.go Updater.Apply: a field only this applier owned goes when
    it is dropped."""
    stored = {"metadata": {"name": "a"}, "spec": {"image": "i"}}
    first = schema_apply.apply(
        stored, {"metadata": {"name": "a"}, "spec": {"image": "i", "suspend": True}}, "kubectl", "v", False, None
    )
    second = schema_apply.apply(first, {"metadata": {"name": "a"}, "spec": {"image": "i"}}, "kubectl", "v", False, None)
    assert "suspend" not in second["spec"] and second["spec"]["image"] == "i"


def test_without_kuberay_crds_the_minimal_definitions_serve(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """A fresh clone has no ../shared: RayJob/RayCluster are served from the built-in minimal CRDs."""
    monkeypatch.setenv("KUBERAY_CRDS", str(tmp_path))
    assert emulator.kuberay_crd_dir() is None
    assert emulator.kuberay_crds() is emulator.KUBERAY_CRDS
    built = emulator.build_emulator()
    rayjobs = built.resource_type("ray.io", "v1", "rayjobs")
    assert rayjobs is not None and rayjobs.schema is not None
    job = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "j"}, "spec": {"anything": 1}}
    assert rayjobs.schema.decode(job) == [] and rayjobs.schema.errors(job) == []


def test_with_kuberay_crds_rayjobs_are_pruned_by_the_v1_7_0_schema() -> None:
    """ray-project/kuberay ray-operator/config/crd/bases/ray.io_rayjobs.yaml v1 (v1.7.0): an unknown spec field is
    pruned, a known one kept."""
    require_kuberay_crds()  # skips saying how to get them; fails under SWEEPS_REQUIRE_KUBERAY_CRDS=1 (.ci/run)
    built = emulator.build_emulator()
    rayjobs = built.resource_type("ray.io", "v1", "rayjobs")
    assert rayjobs is not None and rayjobs.schema is not None
    job = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "j"},
        "spec": {"entrypoint": "python x.py", "notAField": 1},
    }
    assert rayjobs.schema.decode(job) == ["spec.notAField"] and job["spec"]["entrypoint"] == "python x.py"
    assert built.resource_type("ray.io", "v1alpha1", "rayjobs") is not None  # KubeRay serves v1alpha1 too


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        (
            {"labels": {"sweeps.dev/run": "a" * 64}},
            f'metadata.labels: Invalid value: "{"a" * 64}": must be no more than 63 characters',
        ),
        (
            {"labels": {"sweeps.dev/run": "has space"}},
            'metadata.labels: Invalid value: "has space": a valid label must be an empty string or consist of',
        ),
        ({"labels": {"bad key": "x"}}, 'metadata.labels: Invalid value: "bad key": name part must consist of'),
        ({"annotations": {"Sweeps.Dev/x": "1", "/x": "1"}}, 'metadata.annotations: Invalid value: "/x": prefix part'),
        (
            {"finalizers": ["sweeps.dev/guard", "not a finalizer"]},
            'metadata.finalizers[1]: Invalid value: "not a finalizer": name part must consist of',
        ),
    ],
)
def test_object_meta_is_validated_as_every_strategy_does(meta: dict[str, Any], message: str) -> None:
    """apimachinery/pkg/api/validation/objectmeta.go ValidateObjectMetaAccessor: labels (ValidateLabels),
    annotations (ValidateAnnotations: keys lower-cased, 256 KiB in all) and finalizers (qualified names)."""
    from sweep_sandbox.object_meta import object_meta_errors

    errors = [str(e) for e in object_meta_errors({"name": "a", **meta})]
    assert len(errors) == 1 and errors[0].startswith(message), errors
    assert (
        object_meta_errors(
            {
                "labels": {"sweeps.dev/sweep": "digits-cpu", "empty": ""},
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
                "finalizers": ["sweeps.dev/checkpoint-guard", "kubernetes"],
            }
        )
        == []
    )


def test_message_expression_reason_and_field_path_shape_the_cel_refusal() -> None:
    """apiextensions-apiserver/pkg/apiserver/schema/cel/validation.go validateExpressions: messageExpression (its
    value, or the message when it fails), reason (fieldErrorForReason) and fieldPath (appended to the rule's path);
    a transition rule runs only on an update."""
    schema = CrdSchema(
        "K",
        "g",
        {
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "properties": {"replicas": {"type": "integer"}, "mode": {"type": "string"}},
                    "x-kubernetes-validations": [
                        {
                            "rule": "self.replicas <= 3",
                            "messageExpression": "'replicas ' + string(self.replicas) + ' > 3'",
                            "fieldPath": ".replicas",
                        },
                        {
                            "rule": "self.mode != 'x'",
                            "message": "mode x is refused",
                            "messageExpression": "self.nope",
                            "reason": "FieldValueForbidden",
                            "fieldPath": ".mode",
                        },
                        {"rule": "!has(oldSelf.mode) || self.mode == oldSelf.mode", "message": "mode is immutable"},
                    ],
                }
            },
        },
    )
    obj = {"metadata": {"name": "a"}, "spec": {"replicas": 5, "mode": "x"}}
    assert [str(e) for e in schema.errors(obj)] == [
        'spec.replicas: Invalid value: "object": replicas 5 > 3',
        "spec.mode: Forbidden: mode x is refused",
    ]
    old = {"metadata": {"name": "a"}, "spec": {"replicas": 1, "mode": "y"}}
    assert 'spec: Invalid value: "object": mode is immutable' in [str(e) for e in schema.errors(obj, old)]
