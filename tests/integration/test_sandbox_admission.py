"""The emulator enforces what EKS enforces (issue 25; issue 28 item 7), through the real kubectl with one token per
user: the chart's guard ValidatingAdmissionPolicy refuses a tenant's forged `sweeps.dev/` annotation or look-alike
RayCluster and lets the operator, KubeRay and the guard admins through; the operator's mutating webhook gives a
RayCluster KubeRay creates with the guard annotation its finalizer (while the operator watches nothing there); the
operator's validating webhook refuses a bad sweep at `kubectl apply`; objects that are not ours never meet either
webhook, even when it is down.

Modelled on k8s.io/apiserver: policy/validating/dispatcher.go (Dispatch: the first denial, `ValidatingAdmissionPolicy
'<p>' with binding '<b>' denied request: <msg>`, code from the validation's reason), webhook/errors/statuserror.go
(ToStatusErr: `admission webhook "<name>" denied the request: <msg>`), webhook/mutating/dispatcher.go (the JSONPatch
applied before validation), webhook/generic/webhook.go ShouldCallHook (rules, selectors, matchConditions)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweep_contracts import constants
from sweep_operator.settings import Settings
from sweep_sandbox import chart_admission, rbac
from sweep_sandbox.emulator import EmulatorServer
from sweep_sandbox.operator_thread import OperatorThread
from tests.support.factories import changed, cpu_sweep
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

KUBECTL = Path(sys.executable).parent / "kubectl"
POLICY = f"{chart_admission.RELEASE}-trainingsweep-operator-checkpoint-guard"
FORGED = "sweeps.dev/build_registry._locals_.rayjob_deleted"
GUARD_VALUE = '{"runRoot": "s3://b/sweeps/team-a/digits-r1", "endpointUrl": "", "verify": true}'
OWNER = "cluster-admin"  # bound in one namespace: every verb there


@dataclass
class World:
    server: EmulatorServer
    kubeconfig: Path
    namespace: str

    def kubectl(self, context: str, *args: str, stdin: Any = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(KUBECTL), "--kubeconfig", str(self.kubeconfig), "--context", context, "-n", self.namespace, *args],
            input=json.dumps(stdin) if stdin is not None else None,
            env={**os.environ, "HOME": str(self.kubeconfig.parent)},
            capture_output=True,
            text=True,
            timeout=60,
        )

    def ok(self, context: str, *args: str, stdin: Any = None) -> dict[str, Any]:
        done = self.kubectl(context, *args, "-o", "json", stdin=stdin)
        assert done.returncode == 0, done.stderr
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    def refused(self, context: str, *args: str, stdin: Any = None) -> str:
        done = self.kubectl(context, *args, stdin=stdin)
        assert done.returncode != 0, f"admitted: {done.stdout}"
        return done.stderr


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """The emulator with the chart's admission objects and users, and the operator serving its webhooks (it watches
    another namespace only: whatever happens to the test's objects is admission's doing). The tenant owns its
    namespace (a RoleBinding to cluster-admin there): RBAC lets it do anything there, so what stops it is admission."""
    state = tmp_path_factory.mktemp("admission")
    docs = chart_admission.render()
    port = chart_admission.free_port()
    with EmulatorServer(tls=True) as server:
        namespace = f"team-{uuid.uuid4().hex[:6]}"
        people = chart_admission.install(server, docs, port, (namespace,), tenant_role=OWNER)
        server.emulator.admission.default_user = chart_admission.SANDBOX_ADMIN
        kubeconfig = server.write_kubeconfig(
            state / "kubeconfig", namespace=namespace, users={c: i.token for c, i in people.items()}
        )
        settings = chart_admission.operator_settings(
            docs,
            Settings(metrics_port=0, liveness_port=0, namespaces=(chart_admission.RELEASE_NAMESPACE,)),
            port,
            state / "tls",
        )
        with OperatorThread(settings, server.url, token=people["operator"].token, ca_file=server.ca_file):
            chart_admission.wait_for_webhook(server)
            yield World(server, kubeconfig, namespace)


def rayjob(name: str, *, ours: bool = True) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": {"app": "x"}}
    if ours:
        metadata["labels"][constants.LABEL_SWEEP] = "digits"
        metadata["annotations"] = {constants.ANNOTATION_GUARD: GUARD_VALUE}
        metadata["finalizers"] = [constants.FINALIZER]
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": metadata, "spec": {"entrypoint": "python x.py"}}


def raycluster(name: str, **metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name, **metadata},
        "spec": {"headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head", "image": "ray"}]}}}},
    }


def test_a_tenants_forged_progress_record_on_a_guarded_rayjob_is_refused_and_the_operators_write_passes(
    world: World,
) -> None:
    name = f"digits-{uuid.uuid4().hex[:6]}"
    world.ok("operator", "create", "-f", "-", stdin=rayjob(name))
    forged = f'{FORGED}={{"success": true}}'
    error = world.refused("tenant", "annotate", "rayjob", name, forged)
    assert f"ValidatingAdmissionPolicy '{POLICY}' with binding '{POLICY}' denied request:" in error
    assert f"annotations under sweeps.dev/ belong to the operator ({FORGED})" in error
    assert "(request by alice@team-a)" in error
    assert "forbidden" in error  # the policy's reason Forbidden: 403, "... is forbidden: ..."
    # the guard annotation itself, re-pointed at another run root
    assert "belong to the operator" in world.refused(
        "tenant", "annotate", "--overwrite", "rayjob", name, f"{constants.ANNOTATION_GUARD}={{}}"
    )
    # an ordinary edit by the tenant, and the marks written by the operator and a guard admin, pass
    world.ok("tenant", "label", "rayjob", name, "team=a")
    world.ok("operator", "annotate", "rayjob", name, "sweeps.dev/operator-note=1")
    world.ok("guard-admin", "annotate", "rayjob", name, f"{constants.ANNOTATION_SKIP_VERIFICATION}=true")


def test_a_hand_made_raycluster_with_our_finalizer_or_label_is_refused(world: World) -> None:
    for marks in ({"finalizers": [constants.FINALIZER]}, {"labels": {constants.LABEL_SWEEP: "digits"}}):
        error = world.refused("tenant", "create", "-f", "-", stdin=raycluster(f"fake-{uuid.uuid4().hex[:6]}", **marks))
        assert "only the operator and KubeRay give a rayclusters the operator marks" in error
        assert f"with binding '{POLICY}'" in error


def test_kuberay_creates_a_guarded_raycluster_and_the_mutating_webhook_adds_the_finalizer(world: World) -> None:
    name = f"digits-r1-{uuid.uuid4().hex[:5]}"
    copied = {"labels": {constants.LABEL_SWEEP: "digits"}, "annotations": {constants.ANNOTATION_GUARD: GUARD_VALUE}}
    created = world.ok("kuberay", "create", "-f", "-", stdin=raycluster(name, **copied))
    assert created["metadata"]["finalizers"] == [constants.FINALIZER]
    stored = world.ok("tenant", "get", "raycluster", name)
    assert stored["metadata"]["finalizers"] == [constants.FINALIZER]
    # the tenant cannot take it off again
    error = world.refused("tenant", "patch", "raycluster", name, "--type=merge", "-p", '{"metadata":{"finalizers":[]}}')
    assert "the finalizer sweeps.dev/checkpoint-guard is removed by the checkpoint guard" in error


def test_objects_that_are_not_ours_never_meet_our_webhooks_even_when_they_are_down(world: World) -> None:
    services = world.server.emulator.admission.services
    saved = dict(services)
    plain_job = world.ok("tenant", "create", "-f", "-", stdin=rayjob(f"mine-{uuid.uuid4().hex[:6]}", ours=False))
    assert "finalizers" not in plain_job["metadata"]
    try:
        for key in services:  # the operator's pods gone: the Service has no endpoint answering
            services[key] = ("127.0.0.1", chart_admission.free_port())
        plain = world.ok("tenant", "create", "-f", "-", stdin=raycluster(f"mine-{uuid.uuid4().hex[:6]}"))
        assert "finalizers" not in plain["metadata"]
        world.ok("tenant", "annotate", "rayjob", plain_job["metadata"]["name"], "note=1")
        guarded = raycluster(f"digits-r2-{uuid.uuid4().hex[:5]}", annotations={constants.ANNOTATION_GUARD: GUARD_VALUE})
        error = world.refused("kuberay", "create", "-f", "-", stdin=guarded)  # failurePolicy Fail: held, not unguarded
        assert 'failed calling webhook "guard-finalizer.rayclusters.sweeps.dev"' in error
    finally:
        services.update(saved)


def test_a_tenants_sweep_is_stored_with_the_guards_finalizer(world: World) -> None:
    """The chart's sweep webhook (issue 30) adds the finalizer at the tenant's `kubectl apply` (the operator watches
    another namespace here: nothing else could have); the tenant cannot take it off; with no operator pod
    answering, a sweep is not created at all (failurePolicy Fail), never created unguarded."""
    name = f"digits-{uuid.uuid4().hex[:6]}"
    doc = cpu_sweep(name, world.namespace)
    assert "finalizers" not in doc["metadata"]
    created = world.ok("tenant", "apply", "-f", "-", stdin=doc)
    assert created["metadata"]["finalizers"] == [constants.FINALIZER]
    (first,) = world.server.history(constants.GROUP, constants.VERSION, constants.PLURAL, world.namespace, name)
    assert first["metadata"]["finalizers"] == [constants.FINALIZER]
    error = world.refused("tenant", "patch", "tsw", name, "--type=merge", "-p", '{"metadata":{"finalizers":[]}}')
    assert "the finalizer sweeps.dev/checkpoint-guard is removed by the checkpoint guard" in error
    services = world.server.emulator.admission.services
    saved = dict(services)
    try:
        for key in services:
            services[key] = ("127.0.0.1", chart_admission.free_port())
        error = world.refused("tenant", "apply", "-f", "-", stdin=cpu_sweep(f"{name}-2", world.namespace))
        assert 'failed calling webhook "guard-finalizer.trainingsweeps.sweeps.dev"' in error
    finally:
        services.update(saved)
    assert world.kubectl("tenant", "get", "tsw", f"{name}-2").returncode != 0  # nothing stored


def test_a_gpu_hour_ledger_is_written_by_the_operator_alone_and_deleted_only_with_its_namespace(world: World) -> None:
    """The chart's ledger policy through the real kubectl: the operator creates and replaces the ledger; a tenant
    cannot edit or delete it, nor can a guard admin, the sandbox's cluster admin or the operator delete it; deleting
    the namespace takes it (the namespace controller, under the same policy, empties a terminating namespace)."""
    from kubernetes import client as k8s

    from sweep_sandbox.emulator_store import NAMESPACE_CONTROLLER

    namespace = f"ledger-{uuid.uuid4().hex[:6]}"
    core = k8s.CoreV1Api(world.server.api_client())  # kubectl sends built-in kinds as protobuf
    core.create_namespace({"metadata": {"name": namespace}})
    team = rbac.subject("Group", "team-a:developers")  # the tenant owns this namespace too: admission is what stops it
    chart_admission.create_rbac(world.server, [rbac.binding("team-a-owner", OWNER, [team], namespace)])
    ledger = {
        "apiVersion": constants.API_VERSION,
        "kind": constants.LEDGER_KIND,
        "metadata": {"name": constants.LEDGER_NAME},
        "spec": {"gpuHours": 10.0, "windowSeconds": 3600},
        "status": {"usedGpuHours": 9.5, "updatedAt": "2026-12-08T10:00:00Z"},
    }
    scope = ("-n", namespace)
    world.ok("operator", "create", *scope, "-f", "-", stdin=ledger)
    # a replace with the resourceVersion precondition, as the operator writes it (the chart grants update, not patch)
    stored = world.ok("operator", "get", *scope, "gpuledger", constants.LEDGER_NAME)
    stored["metadata"]["annotations"] = {"note": "1"}
    world.ok("operator", "replace", *scope, "-f", "-", stdin=stored)
    error = world.refused("tenant", "annotate", *scope, "gpuledger", constants.LEDGER_NAME, "note=2", "--overwrite")
    assert "is written by the operator only" in error and "alice@team-a" in error
    for context in ("tenant", "guard-admin", "sandbox"):
        error = world.refused(context, "delete", *scope, "gpuledger", constants.LEDGER_NAME)
        assert f"GPU-hour ledger {namespace}/{constants.LEDGER_NAME} is never deleted" in error, context
    # the chart grants the operator no delete on ledgers: RBAC refuses it before admission is asked
    error = world.refused("operator", "delete", *scope, "gpuledger", constants.LEDGER_NAME)
    assert f'cannot delete resource "gpuhourledgers" in API group "sweeps.dev" in the namespace "{namespace}"' in error
    assert "is never deleted" in world.refused("sandbox", "delete", *scope, constants.LEDGER_PLURAL, "--all")
    with pytest.raises(k8s.ApiException) as refused:  # a DeleteCollection: each object through admission
        k8s.CustomObjectsApi(world.server.api_client()).delete_collection_namespaced_custom_object(
            constants.GROUP, constants.VERSION, namespace, constants.LEDGER_PLURAL
        )
    assert refused.value.status == 403 and "is never deleted" in str(refused.value.body)
    assert world.ok("sandbox", "get", *scope, "gpuledger", constants.LEDGER_NAME)["status"]["usedGpuHours"] == 9.5
    core.delete_namespace(namespace)

    def gone() -> bool:
        return world.kubectl("sandbox", "get", "namespace", namespace).returncode != 0

    wait_for(gone, 30, 0.1, what=f"namespace {namespace} emptied by {NAMESPACE_CONTROLLER} and gone")


def test_the_namespace_controller_deletes_through_admission_as_kube_controller_managers_does(world: World) -> None:
    """A policy that refuses every DELETE of a kind keeps a terminating namespace waiting for it (the namespace
    controller deletes through the API server): the emulator is no laxer than a cluster about what a policy
    refuses, so a ledger policy without its terminating-namespace exemption would fail here."""
    from kubernetes import client as k8s

    api: Any = world.server.api_client()
    core, admission = k8s.CoreV1Api(api), k8s.AdmissionregistrationV1Api(api)
    namespace, name = f"held-{uuid.uuid4().hex[:6]}", f"no-configmap-deletes-{uuid.uuid4().hex[:6]}"
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["DELETE"], "resources": ["configmaps"]}
    admission.create_validating_admission_policy(
        {
            "metadata": {"name": name},
            "spec": {
                "matchConstraints": {"resourceRules": [rule]},
                "validations": [{"expression": "false", "message": "kept"}],
            },
        }
    )
    admission.create_validating_admission_policy_binding(
        {"metadata": {"name": name}, "spec": {"policyName": name, "validationActions": ["Deny"]}}
    )
    core.create_namespace({"metadata": {"name": namespace}})
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "kept"}, "data": {"a": "1"}})
    core.create_namespaced_secret(namespace, {"metadata": {"name": "goes"}, "stringData": {"b": "2"}})
    try:
        core.delete_namespace(namespace)

        def secret_deleted() -> bool:
            return not world.ok("sandbox", "get", "-n", namespace, "secrets")["items"]

        wait_for(secret_deleted, 30, 0.1, what="the namespace controller's pass (the Secret deleted)")
        held = world.ok("sandbox", "get", "namespace", namespace)
        assert held["status"]["phase"] == "Terminating"
        assert world.ok("sandbox", "get", "-n", namespace, "configmap", "kept")["data"] == {"a": "1"}
    finally:
        admission.delete_validating_admission_policy_binding(name)
        admission.delete_validating_admission_policy(name)
    wait_for(lambda: world.kubectl("sandbox", "get", "namespace", namespace).returncode != 0, 30, 0.1, what="gone")


def test_a_bad_sweep_is_refused_at_apply_and_a_running_sweeps_spec_is_frozen(world: World) -> None:
    def sweep(name: str, **changes: Any) -> dict[str, Any]:
        return changed(cpu_sweep(name, world.namespace), changes)

    lognormal = sweep("bad-dist", **{"spec.paramSpace.lr": {"lognormal": [0.0, 1.0]}})
    error = world.refused("tenant", "apply", "-f", "-", stdin=lognormal)
    assert 'admission webhook "validate.trainingsweeps.sweeps.dev" denied the request' in error
    assert "spec.paramSpace.lr" in error
    reversed_bounds = sweep("bad-bounds", **{"spec.paramSpace.lr": {"loguniform": [0.1, 0.0001]}})
    assert "spec.paramSpace.lr" in world.refused("tenant", "apply", "-f", "-", stdin=reversed_bounds)
    assert world.kubectl("tenant", "get", "tsw", "bad-dist").returncode != 0  # nothing stored

    name = f"digits-{uuid.uuid4().hex[:6]}"
    world.ok("tenant", "apply", "-f", "-", stdin=sweep(name))
    running = {"status": {"phase": "Running", "runId": "r1"}}
    world.ok("guard-admin", "patch", "tsw", name, "--subresource=status", "--type=merge", "-p", json.dumps(running))
    error = world.refused("tenant", "patch", "tsw", name, "--type=merge", "-p", '{"spec":{"tune":{"numSamples":99}}}')
    assert "spec.tune: cannot change while run r1 is active" in error
    # the status subresource is the operator's (and the guard admins'), not the tenant's
    assert "is written by the operator" in world.refused(
        "tenant", "patch", "tsw", name, "--subresource=status", "--type=merge", "-p", json.dumps(running)
    )
    assert (
        yaml.safe_load(world.kubectl("tenant", "get", "tsw", name, "-o", "yaml").stdout)["spec"]["tune"]["numSamples"]
        == cpu_sweep()["spec"]["tune"]["numSamples"]
    )


def test_the_sandbox_enforces_them_as_eks_does(tmp_path: Path) -> None:
    """`sweepctl sandbox up`'s stack (issue 28, item 7): its kubeconfig's default context applies a bad sweep and
    is refused at apply time; its tenant context cannot forge the guard's marks on a RayJob the operator made."""
    from sweep_sandbox.stack import Sandbox

    with Sandbox(tmp_path / "state") as sandbox:
        assert set(sandbox.identities) == {"operator", "kuberay", "tenant", "guard-admin"}
        world = World(sandbox.server, sandbox.kubeconfig, "default")
        bad = changed(cpu_sweep("bad", "default"), {"spec.paramSpace.lr": {"lognormal": [0.0, 1.0]}})
        error = world.refused("sandbox", "apply", "-f", "-", stdin=bad)
        assert 'admission webhook "validate.trainingsweeps.sweeps.dev" denied the request' in error
        name = f"digits-{uuid.uuid4().hex[:6]}"
        world.ok("operator", "create", "-f", "-", stdin=rayjob(name))
        assert "belong to the operator" in world.refused(
            "tenant", "annotate", "rayjob", name, f"{constants.ANNOTATION_SKIP_VERIFICATION}=true"
        )
        world.ok("sandbox", "annotate", "rayjob", name, f"{constants.ANNOTATION_SKIP_VERIFICATION}=true")


def test_a_whole_run_passes_admission_as_each_actor_and_its_cluster_is_born_guarded(
    s3_server: Any, tmp_path: Path
) -> None:
    """The operator (its token), the KubeRay stand-in (KubeRay's) and a tenant's kubectl through the chart's policy
    and webhooks: the sweep runs to Succeeded (no write of the operator's or KubeRay's is refused), and the first
    stored version of the RayCluster KubeRay creates already carries the guard's finalizer (the mutating webhook,
    not the operator's watch, put it there)."""
    from sweep_operator.s3 import S3ClientConfig, make_s3_client
    from sweep_sandbox.kuberay import KubeRayStandIn, Outcome, ScriptedRunner
    from tests.support.operator_env import OperatorEnv, S3Switch

    docs = chart_admission.render()
    port = chart_admission.free_port()
    bucket = f"adm-{uuid.uuid4().hex[:8]}"
    s3_client = s3_server.client()
    s3_client.create_bucket(Bucket=bucket)
    settings = chart_admission.operator_settings(
        docs,
        Settings(
            reconcile_seconds=1.0,
            status_poll_seconds=0.5,
            ttl_seconds_after_finished=600,  # the cluster stays: no guard run races the teardown
            s3_endpoint_url=s3_server.endpoint_url,
            s3_region="us-east-1",
            metrics_port=0,
            liveness_port=0,
        ),
        port,
        tmp_path / "tls",
    )
    client = make_s3_client(S3ClientConfig(endpoint_url=s3_server.endpoint_url, region="us-east-1", max_attempts=2))
    with EmulatorServer(tls=True) as server:
        people = chart_admission.install(server, docs, port)
        server.emulator.admission.default_user = chart_admission.SANDBOX_ADMIN
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig", users={c: i.token for c, i in people.items()})
        runner = ScriptedRunner(default=Outcome.succeed(1.0, startup=0.3))
        standin = KubeRayStandIn(
            server.api_client(people["kuberay"].token),
            runner,
            poll_interval=0.2,
            cluster_api_client=server.api_client(),
        )
        standin.start()
        try:
            with OperatorThread(
                settings,
                server.url,
                token=people["operator"].token,
                ca_file=server.ca_file,
                s3_client_for=lambda endpoint, region: client,
            ) as operator:
                chart_admission.wait_for_webhook(server)
                env = OperatorEnv(
                    server, runner, standin, operator, settings, s3_server.endpoint_url, s3_client, bucket,
                    S3Switch(lambda endpoint, region: client),
                )  # fmt: skip
                doc = env.new_sweep("adm")
                name = doc["metadata"]["name"]
                assert "finalizers" not in doc["metadata"]
                World(server, kubeconfig, "default").ok("tenant", "apply", "-f", "-", stdin=doc)
                env.wait_phase(name, "Succeeded")
                # the end-of-run verification writes the status too: through admission, and before the server stops
                env.wait_status(name, lambda s: "checkpoints" in s, "checkpoints verified")
                (rayjob_obj,) = env.rayjobs(name)
                cluster = rayjob_obj["status"]["rayClusterName"]
                first = server.history("ray.io", "v1", "rayclusters", "default", cluster)[0]
                assert constants.FINALIZER in first["metadata"]["finalizers"]
                # Issue 30: the sweep too was stored guarded (the webhook, not the operator's pass, put it there:
                # the pass patches a finalizer only onto a sweep that lacks it, and no stored version ever did).
                versions = server.history(constants.GROUP, constants.VERSION, constants.PLURAL, "default", name)
                assert all(constants.FINALIZER in v["metadata"].get("finalizers", []) for v in versions)
        finally:
            standin.stop()
