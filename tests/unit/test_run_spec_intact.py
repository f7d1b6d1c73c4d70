"""The run spec a RayJob carries in `spec.runtimeEnvYAML` (its deadlines, its GPU-hour budget) is enforced only as
the operator wrote it: anyone who may edit the RayJob may rewrite that field, so the operator records the run
spec's digest in a protected annotation at the create and, where the two differ, enforces the sweep's own spec."""

from __future__ import annotations

import json

import yaml

from sweep_contracts import constants, runtime_env
from tests.unit.test_controller import add_sweep
from tests.unit.test_stops_not_lost import make_world


def tampered(text: str) -> str:
    """The runtime env with its run spec rewritten as a tenant would: no budget, a week-long graceful window."""
    doc = yaml.safe_load(text)
    spec = json.loads(doc["env_vars"][constants.ENV_RUN_SPEC])
    spec["spec"]["deadlines"]["gracefulStopSeconds"] = 604_800
    spec["spec"].pop("budget", None)
    doc["env_vars"][constants.ENV_RUN_SPEC] = json.dumps(spec)
    return yaml.safe_dump(doc)


def test_the_run_spec_as_rendered_is_intact_and_survives_the_operators_own_rewrites() -> None:
    world = make_world()
    add_sweep(world, "digits", **{"spec.budget": {"gpuHours": 100}})
    name = world.reconcile("digits")["rayJobName"]
    rayjob = world.kube.get_rayjob("ml", name) or {}
    assert constants.ANNOTATION_RUN_SPEC in rayjob["metadata"]["annotations"]
    run_spec = runtime_env.run_spec_of(rayjob)
    assert run_spec is not None and runtime_env.run_spec_intact(rayjob, run_spec)
    # Kueue mode rewrites the runtime env with a new SWEEP_DEADLINE_AT: the same run spec, still intact.
    rewritten = {**rayjob, "spec": {**rayjob["spec"], "runtimeEnvYAML": runtime_env.encode(run_spec, 1_900_000_000)}}
    again = runtime_env.run_spec_of(rewritten)
    assert again is not None and runtime_env.run_spec_intact(rewritten, again)


def test_a_rewritten_run_spec_is_not_enforced_the_sweeps_own_spec_is() -> None:
    world = make_world()
    add_sweep(world, "digits", **{"spec.budget": {"gpuHours": 100}})
    name = world.reconcile("digits")["rayJobName"]
    rayjob = world.kube.get("RayJob", "ml", name) or {}
    rayjob["spec"]["runtimeEnvYAML"] = tampered(rayjob["spec"]["runtimeEnvYAML"])
    world.kube.objects[("RayJob", "ml", name)] = rayjob
    edited = runtime_env.run_spec_of(rayjob)
    assert edited is not None and edited.spec.budget.gpu_hours is None, "the premise: the tenant's run spec reads"
    assert not runtime_env.run_spec_intact(rayjob, edited)

    world.watch_rayjobs()
    reads = world.controller.reads
    facts = reads.run_facts(reads.sweep_facts(world.sweep("digits"), world.clock()))
    assert facts.run_spec is None
    admitted = facts.admitted_spec
    assert admitted is not None and admitted.budget is not None and admitted.budget.gpu_hours == 100
    assert admitted.deadlines.graceful_stop_seconds != 604_800
    said = [e for e in world.events if e[2] == "RunSpecRewritten"]
    assert len(said) == 1 and said[0][1] == "Warning" and constants.ANNOTATION_RUN_SPEC in said[0][3], said
    reads.run_facts(reads.sweep_facts(world.sweep("digits"), world.clock()))
    assert len([e for e in world.events if e[2] == "RunSpecRewritten"]) == 1, "said once per RayJob"


def test_a_rayjob_from_before_the_digest_keeps_its_run_spec() -> None:
    world = make_world()
    add_sweep(world, "digits")
    name = world.reconcile("digits")["rayJobName"]
    rayjob = world.kube.get_rayjob("ml", name) or {}
    del rayjob["metadata"]["annotations"][constants.ANNOTATION_RUN_SPEC]
    run_spec = runtime_env.run_spec_of(rayjob)
    assert run_spec is not None and runtime_env.run_spec_intact(rayjob, run_spec)
