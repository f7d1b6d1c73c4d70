"""The chart's ValidatingAdmissionPolicy that guards the checkpoint guard's marks (issues 15, 25, 28), its CEL
evaluated with cel-python (through the emulator's CelCompiler, sandbox/schema.py) against admission requests: only
our objects are matched, and on them only the operator, KubeRay and the allowed groups touch our marks."""

from __future__ import annotations

import copy
import functools
import re
from typing import Any

import pytest
import yaml

from sweep_contracts import constants
from sweep_sandbox.admission import StrictPolicyEvaluator as PolicyEvaluator
from tests.unit.test_chart import NAMESPACE, REPO, of_kind, one, render_values

OPERATOR = f"system:serviceaccount:{NAMESPACE}:sweeps-trainingsweep-operator"
KUBERAY = "system:serviceaccount:kuberay-system:kuberay-operator"
ADMINS = "sweeps:guard-admins"
ALICE = ("alice@team-a", ["system:authenticated", "team-a:developers"])
SKIP, GUARD, LABEL, FINALIZER = (
    constants.ANNOTATION_SKIP_VERIFICATION,
    constants.ANNOTATION_GUARD,
    constants.LABEL_SWEEP,
    constants.FINALIZER,
)
GUARD_VALUE = '{"runRoot": "s3://ckpt/sweeps/team-a/digits-r1", "endpointUrl": "", "verify": true}'


def guard_policy(docs: list[dict[str, Any]], kind: str = "ValidatingAdmissionPolicy") -> dict[str, Any]:
    """The checkpoint guard's policy (or binding); the chart's other one guards the GPU-hour ledgers."""
    return one([d for d in docs if d["metadata"]["name"].endswith("-checkpoint-guard")], kind)


@functools.cache
def _policy(groups: tuple[str, ...] = (ADMINS,)) -> tuple[dict[str, Any], dict[str, Any]]:
    docs = render_values({"guardPolicy": {"allowedGroups": list(groups)}})
    return guard_policy(docs), guard_policy(docs, "ValidatingAdmissionPolicyBinding")


@pytest.fixture(scope="module")
def policy() -> PolicyEvaluator:
    return PolicyEvaluator(_policy()[0])


def guarded(kind: str = "RayJob", **meta: Any) -> dict[str, Any]:
    metadata = {
        "name": "digits-r1",
        "namespace": "team-a",
        "labels": {LABEL: "digits", "app": "x"},
        "annotations": {GUARD: GUARD_VALUE},
        "finalizers": [FINALIZER],
    }
    metadata.update(meta)
    metadata = {key: value for key, value in metadata.items() if value is not None}  # None: the field is absent
    return {
        "apiVersion": "ray.io/v1" if kind != "TrainingSweep" else "sweeps.dev/v1alpha1",
        "kind": kind,
        "metadata": metadata,
        "spec": {"entrypoint": "python -m training_entrypoints.sweep"},
    }


def edited(obj: dict[str, Any], **changes: Any) -> dict[str, Any]:
    new = copy.deepcopy(obj)
    for key, value in changes.items():
        if value is None:
            new["metadata"].pop(key, None)
        else:
            new["metadata"][key] = value
    return new


RESOURCES = ["trainingsweeps", "rayjobs", "rayclusters"]


@pytest.mark.parametrize("resource", RESOURCES)
def test_a_user_with_patch_rights_cannot_set_the_escape_hatch(policy: PolicyEvaluator, resource: str) -> None:
    old = guarded()
    new = edited(old, annotations={GUARD: GUARD_VALUE, SKIP: "true"})
    decision = policy.review(resource=resource, operation="UPDATE", user=ALICE, old=old, new=new)
    assert decision.matched and len(decision.denials) == 1
    (message,) = decision.denials
    assert SKIP in message and ADMINS in message and "alice@team-a" in message


@pytest.mark.parametrize("resource", RESOURCES)
def test_a_user_cannot_remove_the_finalizer_or_the_label_or_touch_the_guard_annotation(
    policy: PolicyEvaluator, resource: str
) -> None:
    old = guarded()
    cases = {
        "finalizer removed": (edited(old, finalizers=[]), FINALIZER),
        "finalizers dropped": (edited(old, finalizers=None), FINALIZER),
        "label removed": (edited(old, labels={"app": "x"}), LABEL),
        "label re-pointed": (edited(old, labels={LABEL: "other-sweep", "app": "x"}), LABEL),
        "guard annotation re-aimed": (
            edited(old, annotations={GUARD: GUARD_VALUE.replace('""', '"http://169.254.169.254"')}),
            GUARD,
        ),
        "guard annotation removed": (edited(old, annotations={}), GUARD),
    }
    for case, (new, named) in cases.items():
        decision = policy.review(resource=resource, operation="UPDATE", user=ALICE, old=old, new=new)
        assert len(decision.denials) == 1 and named in decision.denials[0], (case, decision)


def test_creating_an_object_with_the_escape_hatch_or_a_guard_annotation_is_refused(policy: PolicyEvaluator) -> None:
    sweep = guarded("TrainingSweep", annotations={SKIP: "true"}, finalizers=None)
    assert policy.review(resource="trainingsweeps", operation="CREATE", user=ALICE, new=sweep).denials
    forged = guarded("RayJob", annotations={GUARD: GUARD_VALUE.replace('""', '"http://10.0.0.1:9000"')})
    (message,) = policy.review(resource="rayjobs", operation="CREATE", user=ALICE, new=forged).denials
    assert GUARD in message


def test_ordinary_edits_pass(policy: PolicyEvaluator) -> None:
    old = guarded(annotations={GUARD: GUARD_VALUE, SKIP: "true"})
    cases = {
        "another annotation": edited(old, annotations={GUARD: GUARD_VALUE, SKIP: "true", "team": "a"}),
        "another label": edited(old, labels={LABEL: "digits", "app": "y"}),
        "the escape hatch removed": edited(old, annotations={GUARD: GUARD_VALUE}),
        "another finalizer added": edited(old, finalizers=[FINALIZER, "example.com/other"]),
    }
    for case, new in cases.items():
        decision = policy.review(resource="rayjobs", operation="UPDATE", user=ALICE, old=old, new=new)
        assert decision.matched and decision.allowed, (case, decision)
    plain = {
        "apiVersion": "sweeps.dev/v1alpha1",
        "kind": "TrainingSweep",
        "metadata": {"name": "digits", "namespace": "team-a"},
    }
    assert policy.review(resource="trainingsweeps", operation="CREATE", user=ALICE, new=plain).allowed


def test_the_allowed_group_may_use_the_escape_hatch_and_remove_the_marks(policy: PolicyEvaluator) -> None:
    old = guarded()
    new = edited(old, annotations={SKIP: "true"}, finalizers=[], labels={})
    admin = ("bob@platform", ["system:authenticated", ADMINS])
    decision = policy.review(resource="rayclusters", operation="UPDATE", user=admin, old=old, new=new)
    assert decision.allowed
    assert policy.review(resource="rayclusters", operation="UPDATE", user=ALICE, old=old, new=new).denials


def test_the_operator_removes_its_finalizer_and_spreads_the_escape_hatch(policy: PolicyEvaluator) -> None:
    """The guard is the operator: it must still release (controller._guard via kopf) and _propagate_skip."""
    old = guarded("RayCluster")
    operator = (OPERATOR, ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}", "system:authenticated"])
    released = edited(old, finalizers=[])
    assert policy.review(resource="rayclusters", operation="UPDATE", user=operator, old=old, new=released).allowed
    skipped = edited(old, annotations={GUARD: GUARD_VALUE, SKIP: "true"})
    assert policy.review(resource="rayclusters", operation="UPDATE", user=operator, old=old, new=skipped).allowed
    created = guarded("RayJob")
    assert policy.review(resource="rayjobs", operation="CREATE", user=operator, new=created).allowed


def test_kuberay_creates_the_raycluster_with_the_annotations_it_copies(policy: PolicyEvaluator) -> None:
    """KubeRay's constructRayClusterForRayJob copies the RayJob's annotations (guard, and a spread escape hatch)."""
    cluster = guarded("RayCluster", annotations={GUARD: GUARD_VALUE, SKIP: "true"})
    kuberay = (KUBERAY, ["system:serviceaccounts", "system:authenticated"])
    assert policy.review(resource="rayclusters", operation="CREATE", user=kuberay, new=cluster).allowed
    assert policy.review(resource="rayclusters", operation="CREATE", user=ALICE, new=cluster).denials


def test_the_allowed_groups_come_from_values_and_nothing_else_is_matched() -> None:
    policy = PolicyEvaluator(_policy(("corp:sre",))[0])
    old = guarded()
    new = edited(old, finalizers=[])
    assert policy.review(resource="rayjobs", operation="UPDATE", user=("carol", ["corp:sre"]), old=old, new=new).allowed
    assert policy.review(resource="rayjobs", operation="UPDATE", user=("dave", [ADMINS]), old=old, new=new).denials
    assert not policy._matches("", "pods", "UPDATE") and not policy._matches("ray.io", "rayjobs", "DELETE")


def test_the_binding_denies_and_follows_the_watched_namespaces() -> None:
    policy, binding = _policy()
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert "matchResources" not in binding["spec"]  # cluster-wide
    docs = render_values({"watchNamespaces": ["team-a", "team-b"]})
    scoped = guard_policy(docs, "ValidatingAdmissionPolicyBinding")
    assert scoped["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}
    ]
    assert not of_kind(render_values({"guardPolicy": {"enabled": False}}), "ValidatingAdmissionPolicy")


@pytest.mark.parametrize("resource", RESOURCES)
def test_only_the_operator_and_kuberay_write_status(policy: PolicyEvaluator, resource: str) -> None:
    """A forged status.guard would aim the guard (and the operator's credentials) elsewhere."""
    old = guarded("TrainingSweep")
    new = {**copy.deepcopy(old), "status": {"guard": {"runRoot": "s3://other/x", "endpointUrl": "http://10.0.0.1"}}}
    (message,) = policy.review(
        resource=resource, operation="UPDATE", user=ALICE, old=old, new=new, subresource="status"
    ).denials
    assert "status" in message and "alice@team-a" in message
    # KubeRay writes RayJob and RayCluster status, never a sweep's.
    for trusted in (OPERATOR, KUBERAY) if resource != "trainingsweeps" else (OPERATOR,):
        assert policy.review(
            resource=resource, operation="UPDATE", user=(trusted, []), old=old, new=new, subresource="status"
        ).allowed
    assert not policy.review(
        resource=resource, operation="UPDATE", user=ALICE, old=old, new=new, subresource="scale"
    ).matched


# --- issue 28: only our objects; KubeRay's identity is a value ---------------------------------------------------

STRANGERS = {
    "a tenant": ALICE,
    "KubeRay installed in default": ("system:serviceaccount:default:kuberay-operator", ["system:serviceaccounts"]),
    "KubeRay in kuberay-system": (KUBERAY, ["system:serviceaccounts"]),
    "an allowed-group member": ("bob@platform", [ADMINS]),
    "another controller": ("system:serviceaccount:argo:argo-workflows", ["system:serviceaccounts"]),
}


def not_ours(kind: str = "RayJob", **meta: Any) -> dict[str, Any]:
    """A RayJob or RayCluster someone else made: none of our labels, annotations or finalizer."""
    return guarded(kind, labels={"app": "theirs"}, annotations={"team": "b"}, finalizers=["ray.io/rayjob-finalizer"])


@pytest.mark.parametrize("user", STRANGERS.values(), ids=STRANGERS.keys())
@pytest.mark.parametrize("resource", ["rayjobs", "rayclusters"])
def test_a_rayjob_that_is_not_ours_is_never_refused_whoever_writes_it(
    policy: PolicyEvaluator, resource: str, user: tuple[str, list[str]]
) -> None:
    old = not_ours()
    writes = {
        "create": ("CREATE", None, old, ""),
        "relabel": ("UPDATE", old, edited(old, labels={"app": "other"}), ""),
        "finalizer removed": ("UPDATE", old, edited(old, finalizers=[]), ""),
        "annotations dropped": ("UPDATE", old, edited(old, annotations=None), ""),
        "status": ("UPDATE", old, {**old, "status": {"jobDeploymentStatus": "Running"}}, "status"),
    }
    for case, (operation, before, after, subresource) in writes.items():
        decision = policy.review(
            resource=resource, operation=operation, user=user, old=before, new=after, subresource=subresource
        )
        assert not decision.matched and decision.allowed, (case, decision)


@pytest.mark.parametrize("kuberay_namespace", ["default", "ray-system"])
def test_kuberays_identity_in_any_namespace_comes_from_the_value(kuberay_namespace: str) -> None:
    docs = render_values({"kuberay": {"namespace": kuberay_namespace}})
    policy = PolicyEvaluator(guard_policy(docs))
    kuberay = (f"system:serviceaccount:{kuberay_namespace}:kuberay-operator", ["system:serviceaccounts"])
    cluster = guarded("RayCluster", annotations={GUARD: GUARD_VALUE, SKIP: "true"}, finalizers=None)
    assert policy.review(resource="rayclusters", operation="CREATE", user=kuberay, new=cluster).allowed
    ours = guarded("RayJob")
    status = {**ours, "status": {"jobDeploymentStatus": "Running"}}
    assert policy.review(
        resource="rayjobs", operation="UPDATE", user=kuberay, old=ours, new=status, subresource="status"
    ).allowed
    # The default identity is no longer trusted once the value names another.
    assert policy.review(
        resource="rayclusters", operation="CREATE", user=(KUBERAY, ["system:serviceaccounts"]), new=cluster
    ).denials


def test_kuberay_creating_our_raycluster_with_every_copied_annotation_is_allowed(policy: PolicyEvaluator) -> None:
    """KubeRay copies all of a RayJob's labels and annotations, kopf's progress records included."""
    kuberay = (KUBERAY, ["system:serviceaccounts", "system:authenticated"])
    annotations = {GUARD: GUARD_VALUE, SKIP: "true", PROGRESS: '{"started": "2026-12-05T00:00:00Z"}'}
    labels = {LABEL: "digits", RUN_ID: "r1"}
    cluster = guarded("RayCluster", annotations=annotations, labels=labels, finalizers=None)
    assert policy.review(resource="rayclusters", operation="CREATE", user=kuberay, new=cluster).allowed
    assert policy.review(resource="rayclusters", operation="CREATE", user=ALICE, new=cluster).denials


# --- issue 25: every key under the prefix is the operator's; no look-alikes ---------------------------------------

PROGRESS = f"{constants.OPERATOR_ANNOTATION_PREFIX}build_registry._locals_.rayjob_deleted"
RUN_ID = constants.LABEL_RUN_ID
ANY_KEY = f"{constants.OPERATOR_ANNOTATION_PREFIX}anything-new"


def annotation_constants() -> dict[str, str]:
    return {name: getattr(constants, name) for name in dir(constants) if name.startswith("ANNOTATION_")}


PREFIX_KEYS = sorted({*annotation_constants().values(), PROGRESS, ANY_KEY})


@pytest.mark.parametrize("key", PREFIX_KEYS)
@pytest.mark.parametrize("resource", RESOURCES)
def test_every_key_under_the_prefix_is_protected_on_our_objects(
    policy: PolicyEvaluator, resource: str, key: str
) -> None:
    base = guarded("TrainingSweep" if resource == "trainingsweeps" else "RayJob")
    with_key = edited(base, annotations={**base["metadata"]["annotations"], key: '{"success": true}'})
    changed = edited(base, annotations={**base["metadata"]["annotations"], key: '{"success": false}'})
    writes = {
        "added": (base, with_key),
        "changed": (with_key, changed),
        "removed": (with_key, base),
        "forged on create": (None, with_key),
    }
    admin = ("bob@platform", [ADMINS])
    operator = (OPERATOR, ["system:serviceaccounts"])
    for case, (old, new) in writes.items():
        operation = "CREATE" if old is None else "UPDATE"
        if resource != "trainingsweeps" and operation == "CREATE":
            continue  # a RayJob/RayCluster created with our marks: the look-alike test below
        decision = policy.review(resource=resource, operation=operation, user=ALICE, old=old, new=new)
        if key == SKIP and case == "removed":
            assert decision.allowed, (case, decision)  # dropping the escape hatch is always allowed
            continue
        assert len(decision.denials) == 1 and key in decision.denials[0], (case, decision)
        assert "alice@team-a" in decision.denials[0] and ADMINS in decision.denials[0]
        for trusted in (admin, operator):
            assert policy.review(resource=resource, operation=operation, user=trusted, old=old, new=new).allowed


def test_forging_kopfs_progress_record_to_skip_the_guard_is_refused(policy: PolicyEvaluator) -> None:
    """kopf would take `{"success": true}` for a finished deletion handler and drop the finalizer unverified."""
    old = guarded("RayJob")
    forged = edited(old, annotations={GUARD: GUARD_VALUE, PROGRESS: '{"success": true}'})
    (message,) = policy.review(resource="rayjobs", operation="UPDATE", user=ALICE, old=old, new=forged).denials
    assert PROGRESS in message


LOOK_ALIKE_MARKS = {
    "sweep label": {"labels": {LABEL: "digits"}},
    "run-id label": {"labels": {RUN_ID: "r1"}},
    "finalizer": {"finalizers": [FINALIZER]},
    "guard annotation": {"annotations": {GUARD: GUARD_VALUE}},
    "any key under the prefix": {"annotations": {ANY_KEY: "x"}},
}


@pytest.mark.parametrize("mark", LOOK_ALIKE_MARKS.values(), ids=LOOK_ALIKE_MARKS.keys())
@pytest.mark.parametrize("resource", ["rayjobs", "rayclusters"])
def test_a_tenant_cannot_make_a_look_alike_of_our_rayjobs_or_rayclusters(
    policy: PolicyEvaluator, resource: str, mark: dict[str, Any]
) -> None:
    plain = not_ours()
    marked = edited(
        plain,
        **{
            field: [*plain["metadata"][field], *value]
            if field == "finalizers"
            else {**plain["metadata"][field], **value}
            for field, value in mark.items()
        },
    )
    for user in (ALICE, ("bob@platform", [ADMINS])):  # the allowed groups release ours; they do not make them
        create = policy.review(resource=resource, operation="CREATE", user=user, new=marked)
        assert len(create.denials) == 1 and "look-alike" in create.denials[0], create
        update = policy.review(resource=resource, operation="UPDATE", user=user, old=plain, new=marked)
        assert len(update.denials) == 1 and "look-alike" in update.denials[0], update
    for maker in (OPERATOR, KUBERAY):
        assert policy.review(resource=resource, operation="CREATE", user=(maker, []), new=marked).allowed


def test_the_run_id_label_is_protected_like_the_sweep_label(policy: PolicyEvaluator) -> None:
    old = guarded(labels={LABEL: "digits", RUN_ID: "r1"})
    for case, labels in {"removed": {LABEL: "digits"}, "re-pointed": {LABEL: "digits", RUN_ID: "r2"}}.items():
        (message,) = policy.review(
            resource="rayjobs", operation="UPDATE", user=ALICE, old=old, new=edited(old, labels=labels)
        ).denials
        assert RUN_ID in message, case
    added = edited(guarded(), labels={LABEL: "digits", "app": "x", RUN_ID: "r9"})
    (message,) = policy.review(resource="rayjobs", operation="UPDATE", user=ALICE, old=guarded(), new=added).denials
    assert RUN_ID in message


def test_trainingsweeps_keep_their_rules_tenants_create_them(policy: PolicyEvaluator) -> None:
    """Tenants create sweeps (with labels and even our finalizer); the prefix, the finalizer and status stay ours."""
    sweep = guarded("TrainingSweep", annotations=None, labels={LABEL: "x", "team": "a"})
    assert policy.review(resource="trainingsweeps", operation="CREATE", user=ALICE, new=sweep).allowed
    admin = ("bob@platform", [ADMINS])
    skipped = edited(sweep, annotations={SKIP: "true"})
    assert policy.review(resource="trainingsweeps", operation="UPDATE", user=admin, old=sweep, new=skipped).allowed
    released = edited(sweep, finalizers=[])
    assert policy.review(resource="trainingsweeps", operation="UPDATE", user=ALICE, old=sweep, new=released).denials
    assert policy.review(resource="trainingsweeps", operation="UPDATE", user=admin, old=sweep, new=released).allowed


def test_the_protected_set_is_the_one_list_in_contracts_and_covers_every_key_the_operator_uses() -> None:
    policy, _ = _policy()
    annotations = policy["metadata"]["annotations"]
    prefix = constants.OPERATOR_ANNOTATION_PREFIX
    assert annotations["sweeps.dev/protected-annotation-prefix"] == prefix
    assert tuple(annotations["sweeps.dev/protected-labels"].split(",")) == constants.PROTECTED_LABELS
    assert tuple(annotations["sweeps.dev/protected-finalizers"].split(",")) == constants.PROTECTED_FINALIZERS
    text = yaml.safe_dump(policy["spec"])
    for key in (*constants.PROTECTED_LABELS, *constants.PROTECTED_FINALIZERS, prefix):
        assert key in text
    # kopf's progress records go under the same prefix (handlers.configure_kopf).
    handlers = (REPO / "operator" / "sweep_operator" / "handlers.py").read_text()
    assert "AnnotationsProgressStorage(prefix=constants.GROUP)" in handlers and prefix == f"{constants.GROUP}/"
    # Every label, annotation and finalizer the operator reads or writes is in the protected set.
    used = set()
    for path in [*(REPO / "operator").rglob("*.py"), *(REPO / "contracts").rglob("*.py")]:
        used.update(re.findall(r"\b((?:ANNOTATION|LABEL)_[A-Z_]+|FINALIZER)\b", path.read_text()))
    assert {"ANNOTATION_GUARD", "LABEL_RUN_ID", "FINALIZER"} <= used
    for name in sorted(used):
        value = getattr(constants, name)
        assert (
            value.startswith(prefix) if name.startswith("ANNOTATION_") else value in constants.PROTECTED_LABELS
        ) or value in constants.PROTECTED_FINALIZERS, name
    for name, value in annotation_constants().items():
        assert value.startswith(prefix), name


def _with_verify(sweep: dict[str, Any], verify: bool | None) -> dict[str, Any]:
    new = copy.deepcopy(sweep)
    new["spec"] = {**new["spec"], "deletion": {} if verify is None else {"verifyCheckpoints": verify}}
    return new


def test_only_the_allowed_groups_turn_verification_off_on_a_sweep(policy: PolicyEvaluator) -> None:
    """Issue 25, defect 2: `spec.deletion.verifyCheckpoints: false` is the escape hatch by another name (a release
    without verification); a tenant may neither create a sweep with it nor set it later, a guard admin may, and an
    unchanged false (a sweep an admin created) does not block the tenant's other edits."""
    sweep = _with_verify(guarded("TrainingSweep", annotations=None), True)
    off = _with_verify(sweep, False)
    admin = ("bob@platform", [ADMINS])
    created = policy.review(resource="trainingsweeps", operation="CREATE", user=ALICE, new=off)
    assert created.denials and "verifyCheckpoints: false" in created.denials[0] and ALICE[0] in created.denials[0]
    assert policy.review(resource="trainingsweeps", operation="UPDATE", user=ALICE, old=sweep, new=off).denials
    assert policy.review(resource="trainingsweeps", operation="CREATE", user=admin, new=off).allowed
    assert policy.review(resource="trainingsweeps", operation="UPDATE", user=admin, old=sweep, new=off).allowed
    relabelled = edited(off, labels={LABEL: "digits", "team": "b"})
    assert policy.review(resource="trainingsweeps", operation="UPDATE", user=ALICE, old=off, new=relabelled).allowed
    for verify in (True, None):  # on, or left to the default (on)
        assert policy.review(
            resource="trainingsweeps", operation="CREATE", user=ALICE, new=_with_verify(sweep, verify)
        ).allowed
