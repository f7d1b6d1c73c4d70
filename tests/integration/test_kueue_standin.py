"""The Kueue stand-in beside the KubeRay one on the emulator, one test per behaviour, each naming the Kueue source
(kubernetes-sigs/kueue) or doc page it models:

JF = pkg/controller/jobframework/reconciler.go ReconcileGenericJob, RJ = pkg/controller/jobs/rayjob/rayjob_controller.go,
WH = pkg/controller/jobs/rayjob/rayjob_webhook.go (+ raycluster/common.go ValidateCreate, jobframework/validation.go),
FA = pkg/scheduler/flavorassigner/flavorassigner.go, WL = pkg/workload/workload.go, AC = pkg/workload/admissionchecks.go,
PR = pkg/scheduler/preemption/preemption.go, DOC = site/content/en/docs/tasks/run/rayjobs.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from sweep_contracts import constants
from sweep_sandbox.emulator import EmulatorServer
from sweep_sandbox.kuberay import KubeRayStandIn, Outcome, ScriptedRunner
from sweep_sandbox.kueue import (
    PRIORITY_CLASS_LABEL,
    QUEUE_LABEL,
    KueueStandIn,
    cluster_queue,
    local_queue,
    resource_flavor,
    workload_name,
    workload_priority_class,
)
from tests.support import standins
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

RAY = (constants.RAY_GROUP, constants.RAY_VERSION_API)
KUEUE = ("kueue.x-k8s.io", "v1beta2")
GPU = constants.GPU_RESOURCE


# The emulator, runner and KubeRay stand-in fixtures the KubeRay stand-in's tests use too (tests/support/standins.py).
server = standins.emulator()
runner = standins.scripted_runner(Outcome.succeed(0.3))
kuberay = standins.kuberay()
ns = standins.namespace("q-")
custom = standins.kube_api("CustomObjectsApi")


@pytest.fixture(scope="module")
def kueue(server: EmulatorServer, kuberay: KubeRayStandIn) -> Iterator[KueueStandIn]:
    with KueueStandIn(server.api_client(), server=server, poll_interval=0.1) as running:
        running.apply(resource_flavor())
        yield running


def queues(kueue: KueueStandIn, ns: str, gpus: int, *, strategy: str = "BestEffortFIFO") -> str:
    """A ClusterQueue of `gpus` GPUs (and ample CPU/memory) with a LocalQueue `team` in `ns`; returns its name."""
    cq = f"cq-{ns}"
    kueue.apply_queues(
        cluster_queue(cq, {"cpu": 64, "memory": "256Gi", GPU: gpus}, strategy=strategy), local_queue(ns, "team", cq)
    )
    return cq


def rayjob_body(
    name: str,
    *,
    workers: int = 2,
    gpus: int = 1,
    queue: str | None = "team",
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A RayJob as the operator renders it for Kueue: suspended, queue-name label, static worker group."""
    template = {
        "spec": {
            "containers": [
                {
                    "name": "ray-head",
                    "image": "trainer:1",
                    "resources": {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"cpu": "2", "memory": "8Gi"}},
                }
            ]
        }
    }
    worker_resources = {"cpu": "4", "memory": "16Gi", GPU: gpus}
    worker = {
        "spec": {
            "containers": [
                {
                    "name": "ray-worker",
                    "image": "trainer:1",
                    "resources": {"requests": dict(worker_resources), "limits": dict(worker_resources)},
                }
            ]
        }
    }
    meta_labels = {constants.LABEL_SWEEP: name, **(labels or {})}
    if queue:
        meta_labels[QUEUE_LABEL] = queue
    return {
        "apiVersion": constants.RAY_API_VERSION,
        "kind": constants.RAYJOB_KIND,
        "metadata": {"name": name, "labels": meta_labels},
        "spec": {
            "entrypoint": constants.ENTRYPOINT_COMMAND,
            "suspend": True,
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": 0,
            "submitterPodTemplate": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "ray-job-submitter",
                            "image": "trainer:1",
                            "resources": {
                                "requests": {"cpu": "200m", "memory": "512Mi"},
                                "limits": {"cpu": "200m", "memory": "512Mi"},
                            },
                        }
                    ],
                }
            },
            "rayClusterSpec": {
                "rayVersion": constants.SUPPORTED_RAY_VERSION,
                "enableInTreeAutoscaling": False,
                "headGroupSpec": {"rayStartParams": {}, "template": template},
                "workerGroupSpecs": [
                    {
                        "groupName": "gpu-workers",
                        "replicas": workers,
                        "minReplicas": workers,
                        "maxReplicas": workers,
                        "rayStartParams": {},
                        "template": worker,
                    }
                ],
            },
            **spec,
        },
    }


class Namespace:
    def __init__(self, custom: Any, ns: str) -> None:
        self.custom, self.ns = custom, ns

    def submit(self, name: str, **kwargs: Any) -> dict[str, Any]:
        return dict(self.custom.create_namespaced_custom_object(*RAY, self.ns, "rayjobs", rayjob_body(name, **kwargs)))

    def rayjob(self, name: str) -> dict[str, Any]:
        return dict(self.custom.get_namespaced_custom_object(*RAY, self.ns, "rayjobs", name))

    def workload_of(self, rayjob: dict[str, Any]) -> dict[str, Any]:
        return dict(self.custom.get_namespaced_custom_object(*KUEUE, self.ns, "workloads", workload_name(rayjob)))

    def condition(self, rayjob: dict[str, Any], type_: str) -> dict[str, Any] | None:
        wl = self.workload_of(rayjob)
        return next((c for c in (wl.get("status") or {}).get("conditions") or [] if c["type"] == type_), None)

    def is_true(self, rayjob: dict[str, Any], type_: str) -> bool:
        c = self.condition(rayjob, type_)
        return c is not None and c["status"] == "True"

    def wait_admitted(self, rayjob: dict[str, Any], timeout: float = 15.0) -> dict[str, Any]:
        wait_for(lambda: self.is_true(rayjob, "Admitted"), timeout, what=f"{rayjob['metadata']['name']} admitted")
        return self.workload_of(rayjob)

    def wait_pending(self, rayjob: dict[str, Any], timeout: float = 15.0) -> dict[str, Any]:
        def pending() -> dict[str, Any] | None:
            c = self.condition(rayjob, "QuotaReserved")
            return c if c is not None and c["status"] == "False" and c.get("message") else None

        return wait_for(pending, timeout, what=f"{rayjob['metadata']['name']} pending with a message")

    def deployment(self, name: str) -> str:
        return str((self.rayjob(name).get("status") or {}).get("jobDeploymentStatus", ""))


@pytest.fixture
def space(custom: Any, ns: str, kueue: KueueStandIn) -> Namespace:
    return Namespace(custom, ns)


# ---- the API: CRDs and the RayJob webhook


def test_kueue_kinds_are_served_with_strict_schemas(custom: Any, kueue: KueueStandIn, ns: str) -> None:
    """config/components/crd/bases: Workload.spec.podSets minItems 1 / maxItems 18, LocalQueue spec.clusterQueue
    required, ClusterQueue queueingStrategy enum, nominalQuota a Quantity."""
    import kubernetes.client

    bad = [
        (
            "workloads",
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "Workload",
                "metadata": {"name": "w"},
                "spec": {"podSets": [], "queueName": "team"},
            },
            "spec.podSets",
        ),
        (
            "localqueues",
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "lq"}, "spec": {}},
            "spec.clusterQueue",
        ),
    ]
    for plural, body, field in bad:
        with pytest.raises(kubernetes.client.ApiException) as refused:
            custom.create_namespaced_custom_object(*KUEUE, ns, plural, body)
        assert refused.value.status == 422 and field in refused.value.body
    for strategy, quota, field in (("Random", 4, "spec.queueingStrategy"), ("StrictFIFO", "four", "nominalQuota")):
        with pytest.raises(kubernetes.client.ApiException) as refused:
            custom.create_cluster_custom_object(
                *KUEUE, "clusterqueues", cluster_queue(f"bad-{ns}", {GPU: quota}, strategy=strategy)
            )
        assert refused.value.status == 422 and field in refused.value.body


@pytest.mark.parametrize(
    "change,message",
    [
        (
            {"shutdownAfterJobFinishes": False},
            "spec.shutdownAfterJobFinishes: Invalid value: false: a kueue managed job "
            "should delete the cluster after finishing",
        ),
        ({"clusterSelector": {"ray.io/cluster": "shared"}}, "a kueue managed job should not use an existing cluster"),
        (
            {"rayClusterSpec.enableInTreeAutoscaling": True},
            "a kueue managed job should only use autoscaling when workload slicing is enabled",
        ),
        ({"rayClusterSpec.workerGroupSpecs.0.groupName": "head"}, '"head" is reserved for the head group'),
    ],
)
def test_the_rayjob_webhook_refuses_what_kueue_cannot_manage(
    space: Namespace, change: dict[str, Any], message: str
) -> None:
    """WH validateCreate, raycluster.ValidateCreate (DOC "Limitations"): refused at the API with 403."""
    import kubernetes.client

    body = rayjob_body("bad")
    for path, value in change.items():
        node: Any = body["spec"]
        *parents, leaf = path.split(".")
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[leaf] = value
    with pytest.raises(kubernetes.client.ApiException) as refused:
        space.custom.create_namespaced_custom_object(*RAY, space.ns, "rayjobs", body)
    assert refused.value.status == 403
    text = json.loads(refused.value.body)["message"]
    assert text.startswith('admission webhook "vrayjob.kb.io" denied the request: ')
    assert message in text


def test_a_rayjob_without_a_queue_name_is_not_kueues(space: Namespace, kueue: KueueStandIn) -> None:
    """JF: with manageJobsWithoutQueueName off (the default), a job without the queue-name label is ignored and
    not validated (WH)."""
    space.submit("plain", queue=None, shutdownAfterJobFinishes=False, suspend=False, ttlSecondsAfterFinished=0)
    rayjob = wait_for(lambda: space.deployment("plain") in ("Running", "Complete") and space.rayjob("plain"), 15)
    assert not [w for w in kueue.workloads.items() if w["metadata"]["namespace"] == space.ns]
    assert QUEUE_LABEL not in rayjob["metadata"]["labels"]


def test_the_queue_name_cannot_change_while_the_rayjob_runs(space: Namespace, kueue: KueueStandIn) -> None:
    """jobframework validation.go validateUpdateForQueueName: immutable unless the job is suspended."""
    import kubernetes.client

    queues(kueue, space.ns, 8)
    space.submit("moving")
    rayjob = space.rayjob("moving")
    space.wait_admitted(rayjob)
    wait_for(lambda: not space.rayjob("moving")["spec"].get("suspend"), 10, what="unsuspended")
    with pytest.raises(kubernetes.client.ApiException) as refused:
        space.custom.patch_namespaced_custom_object(
            *RAY, space.ns, "rayjobs", "moving", {"metadata": {"labels": {QUEUE_LABEL: "other"}}}
        )
    assert refused.value.status == 403 and "field is immutable" in json.loads(refused.value.body)["message"]


# ---- Workload creation


def test_a_workload_is_created_for_the_suspended_rayjob(space: Namespace, kueue: KueueStandIn) -> None:
    """JF handleJobWithNoWorkload -> ConstructWorkload; RJ PodSets (head count 1, worker group count = replicas,
    the K8sJobMode submitter); workload_names.go GetWorkloadNameForOwnerWithGVK; the queue from the label (DOC
    "Queue selection"); the priority from the WorkloadPriorityClass label."""
    kueue.apply(workload_priority_class(f"high-{space.ns}", 1000))
    rayjob = space.submit("sized", workers=3, gpus=2, labels={PRIORITY_CLASS_LABEL: f"high-{space.ns}"})
    wl = wait_for(lambda: space.workload_of(rayjob), 10, what="the Workload")
    name = wl["metadata"]["name"]
    assert name.startswith("rayjob-sized-") and len(name) == len("rayjob-sized-") + 5
    assert wl["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "ray.io/v1",
            "kind": "RayJob",
            "name": "sized",
            "uid": rayjob["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert wl["metadata"]["labels"]["kueue.x-k8s.io/job-uid"] == rayjob["metadata"]["uid"]
    assert wl["spec"]["queueName"] == "team"
    assert wl["spec"]["priority"] == 1000
    assert wl["spec"]["priorityClassRef"] == {
        "group": "kueue.x-k8s.io",
        "kind": "WorkloadPriorityClass",
        "name": f"high-{space.ns}",
    }
    pod_sets = {ps["name"]: ps for ps in wl["spec"]["podSets"]}
    assert list(pod_sets) == ["head", "gpu-workers", "submitter"]
    assert (pod_sets["head"]["count"], pod_sets["gpu-workers"]["count"], pod_sets["submitter"]["count"]) == (1, 3, 1)
    worker = pod_sets["gpu-workers"]["template"]["spec"]["containers"][0]
    assert worker["resources"]["requests"][GPU] == 2
    # The stand-in records its Event after the Workload's create returns, as Kueue's recorder does: wait for it.
    created = ("sized", "CreatedWorkload", f"Created Workload: {space.ns}/{name}")
    wait_for(lambda: created in kueue.events, 10, what="the CreatedWorkload Event")


# ---- admission


def test_admission_within_quota_unsuspends_the_rayjob_and_kuberay_runs_it(
    space: Namespace, kueue: KueueStandIn
) -> None:
    """The scheduler reserves quota (WL SetQuotaReservation: "Quota reserved in ClusterQueue <cq>"), AC
    SyncAdmittedCondition admits ("The workload is admitted"), JF startJob sets spec.suspend false (DOC "Suspend
    control"); the finished RayJob finishes the Workload (RJ Finished) and frees the quota."""
    cq = queues(kueue, space.ns, 4)
    rayjob = space.submit("fits", workers=2, gpus=1)
    wl = space.wait_admitted(rayjob)
    reserved = space.condition(rayjob, "QuotaReserved")
    assert reserved is not None and reserved["message"] == f"Quota reserved in ClusterQueue {cq}"
    assert space.condition(rayjob, "Admitted")["message"] == "The workload is admitted"
    assignment = {a["name"]: a for a in wl["status"]["admission"]["podSetAssignments"]}
    assert wl["status"]["admission"]["clusterQueue"] == cq
    assert assignment["gpu-workers"]["flavors"][GPU] == "default-flavor"
    assert assignment["gpu-workers"]["resourceUsage"][GPU] == "2" and assignment["gpu-workers"]["count"] == 2
    wait_for(lambda: space.deployment("fits") == "Complete", 20, what="the RayJob completes")
    wait_for(lambda: space.is_true(rayjob, "Finished"), 10, what="the Workload finished")
    assert space.condition(rayjob, "Finished")["reason"] == "Succeeded"
    started = ("fits", "Started", f"Admitted by clusterQueue {cq}")
    wait_for(lambda: started in kueue.events, 10, what="the Started Event")


def test_over_quota_waits_with_kueues_message_and_is_admitted_fifo_as_quota_frees(
    space: Namespace, kueue: KueueStandIn, runner: ScriptedRunner
) -> None:
    """FA fitsResourceQuota / Assignment.Message ("couldn't assign flavors to pod set gpu-workers: insufficient
    unused quota for nvidia.com/gpu in flavor default-flavor, 2 more needed"); the queue orders by priority, then
    creation (WL GetQueueOrderTimestamp): the older waiting job goes first when quota frees."""
    queues(kueue, space.ns, 4)
    runner.script("first", Outcome.hang())
    first = space.submit("first", workers=4, gpus=1)
    space.wait_admitted(first)
    second = space.submit("second", workers=2, gpus=1)
    # Kueue makes a RayJob's Workload only once KubeRay has parked the job (jobframework: an active job without a
    # Workload is stopped first), so the queue's order is the Workloads' creation: third is submitted once
    # second's Workload waits, or KubeRay's parking order under load would decide which is older.
    waiting = space.wait_pending(second)
    third = space.submit("third", workers=2, gpus=1)
    assert waiting["reason"] == "WaitingForQuota"
    assert waiting["message"] == (
        "couldn't assign flavors to pod set gpu-workers: insufficient unused quota for "
        f"{GPU} in flavor default-flavor, 2 more needed"
    )
    space.wait_pending(third)
    # KubeRay takes a suspended RayJob New -> Initializing -> Suspending -> Suspended on its own clock (RJ
    # updateStatusToSuspendingIfNeeded), independent of Kueue's pending Workload: wait for the state, then read it.
    wait_for(lambda: space.deployment("second") == "Suspended", 10, what="KubeRay to park the queued RayJob")
    assert space.rayjob("second")["spec"]["suspend"] is True
    space.custom.delete_namespaced_custom_object(*RAY, space.ns, "rayjobs", "first")  # its quota goes with it
    space.wait_admitted(second)
    space.wait_admitted(third)
    order = [name for name, _, _ in kueue.admissions if name in (workload_name(second), workload_name(third))]
    assert order == [workload_name(second), workload_name(third)]


def test_a_job_larger_than_the_queue_says_it_exceeds_the_maximum(space: Namespace, kueue: KueueStandIn) -> None:
    """FA fitsResourceQuota, no fit: reason ExceedsMaxQuota, "... > maximum capacity (4)"."""
    queues(kueue, space.ns, 4)
    huge = space.submit("huge", workers=6, gpus=1)
    waiting = space.wait_pending(huge)
    assert waiting["reason"] == "ExceedsMaxQuota"
    assert waiting["message"] == (
        f"couldn't assign flavors to pod set gpu-workers: insufficient quota for {GPU} in "
        "flavor default-flavor, previously considered podsets requests (0) + current podset "
        "request (6) > maximum capacity (4)"
    )


def test_strict_fifo_blocks_behind_the_head_best_effort_does_not(
    space: Namespace, kueue: KueueStandIn, runner: ScriptedRunner
) -> None:
    """ClusterQueue queueingStrategy: StrictFIFO keeps later workloads behind one that does not fit."""
    queues(kueue, space.ns, 4, strategy="StrictFIFO")
    runner.script("holder", Outcome.hang())
    holder = space.submit("holder", workers=3, gpus=1)
    space.wait_admitted(holder)
    big = space.submit("big", workers=2, gpus=1)
    space.wait_pending(big)  # its Workload is older than small's (the queue orders Workloads, not RayJobs)
    small = space.submit("small", workers=1, gpus=1)
    blocked = space.wait_pending(small)
    assert "StrictFIFO" in blocked["message"]
    kueue.apply(cluster_queue(f"cq-{space.ns}", {"cpu": 64, "memory": "256Gi", GPU: 4}, strategy="BestEffortFIFO"))
    space.wait_admitted(small)
    assert not space.is_true(big, "Admitted")


def test_a_missing_local_queue_is_reported(space: Namespace, kueue: KueueStandIn) -> None:
    """core/workload_controller.go: QuotaReserved False, Misconfigured, "LocalQueue <name> doesn't exist"."""
    lost = space.submit("lost", queue="nowhere")
    waiting = space.wait_pending(lost)
    assert (waiting["reason"], waiting["message"]) == ("Misconfigured", "LocalQueue nowhere doesn't exist")


# ---- preemption and readmission


def test_eviction_suspends_the_rayjob_holds_quota_until_the_cluster_is_gone_and_readmits(
    space: Namespace, kueue: KueueStandIn, runner: ScriptedRunner, custom: Any
) -> None:
    """PR IssuePreemptions (Evicted=True reason Preempted + Preempted=True InClusterQueue); JF step 6: stopJob
    suspends the RayJob (KubeRay v1.7.0: Suspending deletes the RayCluster, which a finalizer holds), the quota is
    cleared only once the job is no longer active (RJ IsActive: Suspended), with Requeued=True; a higher-priority
    job takes the quota; when it finishes the evicted one is readmitted (WL SetQuotaReservation resets Evicted to
    False "Previously: ...") and KubeRay starts a new attempt on a new cluster."""
    queues(kueue, space.ns, 2)
    kueue.apply(workload_priority_class(f"urgent-{space.ns}", 100))
    runner.script("victim", Outcome.hang(), Outcome.succeed(0.3))
    victim = space.submit("victim", workers=2, gpus=1)
    space.wait_admitted(victim)
    running = wait_for(lambda: space.deployment("victim") == "Running" and space.rayjob("victim"), 15)
    cluster = running["status"]["rayClusterName"]
    custom.patch_namespaced_custom_object(
        *RAY, space.ns, "rayclusters", cluster, {"metadata": {"finalizers": [constants.FINALIZER]}}
    )
    urgent = space.submit("urgent", workers=2, gpus=1, labels={PRIORITY_CLASS_LABEL: f"urgent-{space.ns}"})
    space.wait_pending(urgent)
    kueue.evict(space.ns, workload_name(victim))
    wait_for(lambda: space.rayjob("victim")["spec"]["suspend"] is True, 10, what="the victim suspended")
    wait_for(lambda: space.deployment("victim") == "Suspending", 10)
    # held by the finalizer: Suspending, its quota still reserved, the urgent job still waiting
    assert space.is_true(victim, "QuotaReserved") and space.is_true(victim, "Evicted")
    assert not space.is_true(urgent, "QuotaReserved")
    custom.patch_namespaced_custom_object(*RAY, space.ns, "rayclusters", cluster, {"metadata": {"finalizers": []}})
    wait_for(lambda: space.deployment("victim") == "Suspended", 10)
    space.wait_admitted(urgent)
    requeued = space.condition(victim, "Requeued")
    assert requeued is not None and requeued["status"] == "True" and requeued["reason"] == "Preempted"
    reserved = space.condition(victim, "QuotaReserved")
    assert reserved["status"] == "False" and reserved["reason"] in ("PendingEvaluation", "WaitingForQuota")
    wait_for(lambda: space.deployment("urgent") == "Complete", 20)
    space.wait_admitted(victim)
    evicted = space.condition(victim, "Evicted")
    assert evicted["status"] == "False" and evicted["message"].startswith("Previously: Preempted")
    readmitted = wait_for(lambda: space.deployment("victim") in ("Running", "Complete") and space.rayjob("victim"), 15)
    assert readmitted["status"]["rayClusterName"] != cluster


def test_evicting_a_workload_without_quota_is_refused(space: Namespace, kueue: KueueStandIn) -> None:
    """evict.Evict is only called for admitted workloads (the preemptor picks them from the ClusterQueue's usage)."""
    lost = space.submit("unqueued", queue="nowhere")
    space.wait_pending(lost)
    with pytest.raises(ValueError, match="holds no quota"):
        kueue.evict(space.ns, workload_name(lost))
