"""Admission and the worker cap as tables over facts (no Kubernetes): a sweep without a run -> Invalid, Suspended,
Queued or a CreateRayJob, and the create's outcome -> the status; a worker group above its cap -> the correction."""

from __future__ import annotations

from typing import Any

import pytest

from sweep_contracts import constants
from sweep_contracts.problems import Problem
from sweep_operator.policy import Admit, Demand, Queue, Reject
from sweep_operator.reconcile.actions import CreateRayJob, ReleaseBudget
from sweep_operator.reconcile.admission import (
    CreateOutcome,
    after_create,
    decide_after_budget,
    decide_before_budget,
    spec_change_problems,
)
from sweep_operator.reconcile.drift import RunBounds, bounds_of, decide_drift, may_exceed_cap, worker_cap
from sweep_operator.reconcile.facts import SweepFacts
from sweep_operator.rendering import RenderContext
from sweep_operator.settings import OperatorLimits, Settings
from sweep_operator.status import rfc3339, status_document
from sweep_operator.validation import parse_sweep
from tests.support.factories import changed, gpu_sweep
from tests.support.fakes import T0

LIMITS = OperatorLimits(max_gpus_per_namespace=8)
RENDER = RenderContext.from_settings(Settings(limits=LIMITS))


def facts(
    status: dict[str, Any] | None = None,
    *,
    valid: bool = True,
    suspend: bool = False,
    generation: int = 1,
    retry_at: float | None = None,
) -> SweepFacts:
    doc = changed(gpu_sweep(), {"spec.suspend": suspend})
    doc["metadata"].update(uid="uid-1", generation=generation, creationTimestamp=rfc3339(T0))
    doc["status"] = status or {}
    sweep = parse_sweep(doc, LIMITS) if valid else None
    return SweepFacts(
        doc, T0, LIMITS, sweep, () if valid else ("spec.trainLoop: not module:function",), create_retry_at=retry_at
    )


# (case, facts, expected: None (ask the ledger), "unchanged", or (phase, Admitted reason, frees the budget))
BEFORE_BUDGET = [
    ("a valid sweep asks the ledger", facts(), None),
    ("invalid", facts(valid=False), ("Invalid", "Invalid", True)),
    (
        "invalid, already said for this generation",
        facts({"phase": "Invalid", "observedGeneration": 1}, valid=False),
        "unchanged",
    ),
    (
        "invalid said for an older generation",
        facts({"phase": "Invalid", "observedGeneration": 1}, valid=False, generation=2),
        ("Invalid", "Invalid", True),
    ),
    ("suspended waits and holds no budget", facts(suspend=True), ("Suspended", "Suspended", True)),
    ("a failed create backs off", facts(retry_at=T0 + 5), "unchanged"),
    ("the backoff passed", facts(retry_at=T0), None),
]


@pytest.mark.parametrize("case,given,expected", BEFORE_BUDGET, ids=[row[0] for row in BEFORE_BUDGET])
def test_decide_before_budget(case: str, given: SweepFacts, expected: Any) -> None:
    decision = decide_before_budget(given)
    if expected is None:
        assert decision is None, case
        return
    assert decision is not None
    if expected == "unchanged":
        assert decision.status is None and not decision.actions
        return
    phase, reason, frees = expected
    assert decision.status is not None and decision.status.phase == phase
    assert ("Admitted", "False", reason) in [(c.type, c.status, c.reason) for c in decision.status.conditions or []]
    assert decision.status.observed_generation == given.generation
    assert (ReleaseBudget(admit_next=False) in decision.actions) is frees


def test_the_budget_decides_queued_rejected_or_a_create() -> None:
    queued_status = decide_after_budget(
        facts(), Queue(Demand(4, 4), "namespace budget 8 GPUs: 6 in use"), "6/8", RENDER
    ).status
    assert queued_status is not None
    queued = status_document(queued_status)
    assert queued["phase"] == "Queued" and queued["queuedAt"] == rfc3339(T0)
    assert queued["replicas"] == {"workers": 4, "gpus": 4, "namespaceBudget": "6/8"}
    rejected = decide_after_budget(facts(), Reject((Problem("spec.tune", "over the cap"),)), "0/8", RENDER).status
    assert rejected is not None and rejected.phase == "Invalid" and "over the cap" in (rejected.message or "")
    (create,) = decide_after_budget(facts(), Admit(Demand(4, 4)), "4/8", RENDER).actions
    assert isinstance(create, CreateRayJob) and create.deadline_at == int(T0 + 21600)
    assert create.rayjob["metadata"]["labels"][constants.LABEL_RUN_ID] == create.run_id


def _created(**meta: Any) -> tuple[CreateRayJob, dict[str, Any]]:
    (create,) = decide_after_budget(facts(), Admit(Demand(4, 4)), "4/8", RENDER).actions
    assert isinstance(create, CreateRayJob)
    rayjob = {**create.rayjob, "metadata": {**create.rayjob["metadata"], "creationTimestamp": rfc3339(T0 - 60), **meta}}
    return create, rayjob


@pytest.mark.parametrize(
    "case,outcome,phase,reason,event",
    [
        ("created", lambda c, r: CreateOutcome(r, True), "Starting", "Admitted", None),
        (
            "adopted after a crash before the status write",
            lambda c, r: CreateOutcome(r, False),
            "Starting",
            "Admitted",
            None,
        ),
        (
            "the name is held by a foreign object",
            lambda c, r: CreateOutcome(
                {**r, "metadata": {**r["metadata"], "ownerReferences": [{"uid": "someone-else"}]}}, False
            ),
            "Pending",
            "RayJobNameTaken",
            "RayJobNameTaken",
        ),
        (
            "the API refused",
            lambda c, r: CreateOutcome(error="HTTP 422 Invalid: bad", failures=2, retry_in=10.0),
            "Pending",
            "RayJobCreateFailed",
            "RayJobCreateFailed",
        ),
    ],
    ids=["created", "adopted", "name taken", "create failed"],
)
def test_after_create(case: str, outcome: Any, phase: str, reason: str, event: str | None) -> None:
    create, rayjob = _created()
    decision = after_create(facts(), create, Admit(Demand(4, 4)), outcome(create, rayjob), "4/8", RENDER)
    assert decision.status is not None
    new = status_document(decision.status)
    assert new["phase"] == phase, case
    assert reason in [c["reason"] for c in new["conditions"] if c["type"] == "Admitted"]
    assert [e.reason for e in decision.events] == ([event] if event else [])
    if phase == "Starting":
        assert new["runId"] == create.run_id and new["guard"]["runRoot"].endswith(create.run_id)
        assert new["replicas"]["cap"] == 4
        started = T0 if case == "created" else T0 - 60  # an adopted run keeps its RayJob's start
        assert new["startedAt"] == rfc3339(started)
    else:
        assert ReleaseBudget(admit_next=False) in decision.actions


def test_while_a_run_is_active_only_suspend_may_change() -> None:
    old = {"spec": {"suspend": False, "image": "a"}, "status": {"runId": "r1", "phase": "Running"}}
    assert spec_change_problems({"spec": {"suspend": True, "image": "a"}}, old) == []
    assert spec_change_problems({"spec": {"suspend": False, "image": "b"}}, old) == [
        "spec.image: cannot change while run r1 is active; only spec.suspend may change (delete and re-create the sweep for a new run)"
    ]
    assert (
        spec_change_problems({"spec": {"image": "b"}}, {**old, "status": {"runId": "r1", "phase": "Succeeded"}}) == []
    )


# --------------------------------------------------------------------------------------------- the worker cap


def group(**replicas: int) -> dict[str, Any]:
    return {"groupName": "workers", **replicas}


def cluster(*groups: dict[str, Any], labelled: bool = True, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "c", "labels": {constants.LABEL_SWEEP: "digits"} if labelled else {}}
    if deleting:
        meta["deletionTimestamp"] = rfc3339(T0)
    return {"metadata": meta, "spec": {"workerGroupSpecs": list(groups)}}


@pytest.mark.parametrize("workers,cap,expected", [(8, 16, 8), (32, 16, 16)])
def test_worker_cap_is_the_ask_at_most_the_operators_cap(workers: int, cap: int, expected: int) -> None:
    spec = parse_sweep(
        changed(gpu_sweep(), {"spec.trial.workers": workers // 2}),
        OperatorLimits(max_workers_per_sweep=64, max_gpus_per_sweep=64),
    ).spec
    assert worker_cap(spec, OperatorLimits(max_workers_per_sweep=cap)) == expected


@pytest.mark.parametrize(
    "case,body,cap,may",
    [
        ("at the cap", cluster(group(replicas=4, maxReplicas=4)), 4, False),
        ("above it", cluster(group(replicas=4, maxReplicas=9)), 4, True),
        ("unknown cap on a cluster: ask", cluster(group(replicas=1)), None, True),
        ("not ours", cluster(group(maxReplicas=9), labelled=False), 4, False),
        ("being deleted", cluster(group(maxReplicas=9), deleting=True), 4, False),
        ("no worker group", cluster(), 4, False),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_may_exceed_cap(case: str, body: dict[str, Any], cap: int | None, may: bool) -> None:
    assert may_exceed_cap(body, constants.RAYCLUSTER_KIND, RunBounds(cap) if cap is not None else None) is may, case


def test_the_correction_sets_every_count_above_the_cap_back() -> None:
    body = cluster(group(replicas=6, minReplicas=1, maxReplicas=9))
    correction = decide_drift(body, constants.RAYCLUSTER_KIND, 4)
    assert correction is not None
    assert correction.patch == {"spec": {"workerGroupSpecs": [group(replicas=4, minReplicas=1, maxReplicas=4)]}}
    assert "workers.maxReplicas 9 -> 4" in correction.message and "workers.replicas 6 -> 4" in correction.message
    rayjob = {"metadata": body["metadata"], "spec": {"rayClusterSpec": body["spec"]}}
    on_rayjob = decide_drift(rayjob, constants.RAYJOB_KIND, 4)
    assert (
        on_rayjob is not None and on_rayjob.patch["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["maxReplicas"] == 4
    )
    assert decide_drift(cluster(group(maxReplicas=4)), constants.RAYCLUSTER_KIND, 4) is None


def _rendered(gpu: int = 1) -> dict[str, Any]:
    from sweep_operator.rendering import RenderContext, build_rayjob

    limits = OperatorLimits(max_workers_per_sweep=64, max_gpus_per_sweep=64)
    sweep = parse_sweep(changed(gpu_sweep(), {"spec.trial.resourcesPerWorker.gpu": gpu}), limits)
    return build_rayjob(sweep, "abc123", RenderContext(limits=limits))


def test_the_bounds_the_operator_renders_name_each_group_its_cap_and_gpus() -> None:
    rayjob = _rendered(gpu=1)
    bounds = bounds_of(rayjob)
    group = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    assert bounds is not None and bounds.groups == {group["groupName"]: 1} and bounds.cap == group["maxReplicas"]
    assert (bounds.workers, bounds.gpus) == (group["maxReplicas"], group["maxReplicas"])
    assert decide_drift(rayjob, constants.RAYJOB_KIND, bounds) is None  # as rendered: nothing to set back


def test_an_added_worker_group_and_raised_gpus_are_set_back_to_the_rendered_spec() -> None:
    """Issue 25, defect 6 (R21): with RayJob edit rights a tenant adds a worker group, raises a worker's
    nvidia.com/gpu and gives the head a GPU; the correction removes the group and sets every GPU count back to the
    rendered one. The bounds come from the operator's protected annotation, not the editable runtime env."""
    import copy

    rayjob = _rendered(gpu=1)
    bounds = bounds_of(rayjob)
    assert bounds is not None
    edited = copy.deepcopy(rayjob)
    cluster = edited["spec"]["rayClusterSpec"]
    extra = copy.deepcopy(cluster["workerGroupSpecs"][0])
    extra["groupName"] = "more-gpus"
    cluster["workerGroupSpecs"].append(extra)
    worker = cluster["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    worker["resources"]["limits"][constants.GPU_RESOURCE] = 8
    worker["resources"]["requests"][constants.GPU_RESOURCE] = "8"
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    head["resources"].setdefault("limits", {})[constants.GPU_RESOURCE] = 4
    assert may_exceed_cap(edited, constants.RAYJOB_KIND, bounds)
    correction = decide_drift(edited, constants.RAYJOB_KIND, bounds)
    assert correction is not None
    fixed = correction.patch["spec"]["rayClusterSpec"]
    assert [g["groupName"] for g in fixed["workerGroupSpecs"]] == [rayjob_group := worker_name(rayjob)]
    resources = fixed["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]
    assert resources["limits"][constants.GPU_RESOURCE] == 1 and resources["requests"][constants.GPU_RESOURCE] == 1
    assert (
        fixed["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"]["limits"][constants.GPU_RESOURCE] == 0
    )
    assert "more-gpus" in correction.message and rayjob_group in correction.message
    on_cluster = {"metadata": edited["metadata"], "spec": cluster}
    assert decide_drift(on_cluster, constants.RAYCLUSTER_KIND, bounds) is not None


def _added(where: str, *, sidecar: bool = False, gpus: int = 8) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": f"{where}-extra",
        "image": "busybox",
        "resources": {"limits": {constants.GPU_RESOURCE: gpus}, "requests": {constants.GPU_RESOURCE: gpus}},
    }
    return {**container, "restartPolicy": "Always"} if sidecar else container


@pytest.mark.parametrize(
    "part, kind, asked, kept",
    [
        ("worker", "initContainers", 8, 1),  # it runs before the Ray container: as many as one worker was rendered
        ("worker", "sidecar", 8, 0),  # it runs beside the Ray container, which keeps the rendered GPU
        ("worker", "containers", 1, 0),  # a second app container: the pod asks the sum
        ("head", "initContainers", 8, 0),  # the head is rendered without GPUs
        ("head", "sidecar", 8, 0),
    ],
)
def test_gpus_asked_by_an_init_container_a_sidecar_or_another_container_are_set_back(
    part: str, kind: str, asked: int, kept: int
) -> None:
    """An initContainer (or a native sidecar: an init container with restartPolicy Always, or a second app container)
    asking for nvidia.com/gpu: 8 in a worker or head template: Kubernetes sizes the pod by all of them
    (component-helpers/resource/helpers.go `PodRequests`), so the per-sweep and namespace GPU caps were bypassed
    while only `containers` was checked one by one. Each is set back until the pod asks for what was rendered."""
    import copy

    from sweep_operator.run_metadata import container_gpus

    rayjob = _rendered(gpu=1)
    bounds = bounds_of(rayjob)
    assert bounds is not None and bounds.groups[worker_name(rayjob)] == 1
    edited = copy.deepcopy(rayjob)
    cluster = edited["spec"]["rayClusterSpec"]
    group = cluster["workerGroupSpecs"][0] if part == "worker" else cluster["headGroupSpec"]
    pod = group["template"]["spec"]
    added = _added(part, sidecar=kind == "sidecar", gpus=asked)
    pod.setdefault("containers" if kind == "containers" else "initContainers", []).append(added)
    assert may_exceed_cap(edited, constants.RAYJOB_KIND, bounds)
    correction = decide_drift(edited, constants.RAYJOB_KIND, bounds)
    assert correction is not None and f"{added['name']} {constants.GPU_RESOURCE} -> {kept}" in correction.message
    fixed = correction.patch["spec"]["rayClusterSpec"]
    fixed_group = fixed["workerGroupSpecs"][0] if part == "worker" else fixed["headGroupSpec"]
    fixed_pod = fixed_group["template"]["spec"]
    assert fixed_pod["containers"][0] == pod["containers"][0], "the Ray container keeps what was rendered"
    everything = fixed_pod.get("initContainers", []) + fixed_pod["containers"]
    (fixed_added,) = [c for c in everything if c["name"] == added["name"]]
    assert container_gpus(fixed_added) == kept
    edited["spec"]["rayClusterSpec"] = {**cluster, **fixed}
    assert decide_drift(edited, constants.RAYJOB_KIND, bounds) is None, "the correction is its own fixed point"
    on_cluster = {"metadata": edited["metadata"], "spec": cluster}
    assert decide_drift(on_cluster, constants.RAYCLUSTER_KIND, bounds) is not None


def test_an_init_container_within_the_rendered_gpus_is_kept() -> None:
    """Kubernetes counts a pod's init container beside the app containers' sum by max: one asking for no more than
    the worker was rendered with adds nothing, and is not the operator's to change."""
    import copy

    rayjob = _rendered(gpu=1)
    bounds = bounds_of(rayjob)
    assert bounds is not None
    edited = copy.deepcopy(rayjob)
    worker = edited["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    worker["initContainers"] = [_added("worker", gpus=1)]
    assert decide_drift(edited, constants.RAYJOB_KIND, bounds) is None


def worker_name(rayjob: dict[str, Any]) -> str:
    return str(rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["groupName"])


@pytest.mark.parametrize("edit", [10**7, None, 0, "86400"], ids=["raised", "removed", "zero", "a string"])
def test_a_raised_or_removed_active_deadline_is_set_back_and_a_lower_one_kept(edit: Any) -> None:
    """KubeRay's backstop (spec.activeDeadlineSeconds, rendered from the sweep's deadline) is recorded in the
    operator's protected bounds annotation; raised or removed by anyone with RayJob edit rights, it is set back,
    alone (no worker group rewritten); lowered, it is the editor's own shorter run."""
    import copy

    rayjob = _rendered(gpu=1)
    bounds = bounds_of(rayjob)
    rendered = rayjob["spec"]["activeDeadlineSeconds"]
    assert bounds is not None and bounds.active_deadline_s == rendered > 0
    edited = copy.deepcopy(rayjob)
    if edit is None:
        del edited["spec"]["activeDeadlineSeconds"]
    else:
        edited["spec"]["activeDeadlineSeconds"] = edit
    assert may_exceed_cap(edited, constants.RAYJOB_KIND, bounds)
    correction = decide_drift(edited, constants.RAYJOB_KIND, bounds)
    assert correction is not None and correction.patch == {"spec": {"activeDeadlineSeconds": rendered}}
    assert f"activeDeadlineSeconds {edit} -> {rendered}" in correction.message
    edited["spec"]["activeDeadlineSeconds"] = rendered - 60
    assert decide_drift(edited, constants.RAYJOB_KIND, bounds) is None
    older = RunBounds(bounds.cap, bounds.groups, bounds.workers, bounds.gpus)  # a RayJob rendered before the field
    edited["spec"]["activeDeadlineSeconds"] = 10**7
    assert decide_drift(edited, constants.RAYJOB_KIND, older) is None
    assert RunBounds.from_annotation(older.to_annotation()) == older
