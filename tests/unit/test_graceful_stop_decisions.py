"""The operator's graceful stop before a RayJob delete (reconcile.graceful_stop, issue 26): KubeRay's deletion path
stops a job at once (`rayjob_controller.go`, the deletion branch: StopJob), so the operator asks Ray's Jobs API first
and holds the delete by state, never longer than the window."""

from __future__ import annotations

from typing import Any

import pytest

from sweep_operator.reconcile import graceful_stop as gs
from sweep_operator.status import read_status, status_document, updated


def stored(model: Any) -> Any:
    """A status part as the API stores it (camelCase, unset fields left out)."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True) if model is not None else None


def rayjob(job_status: str = "RUNNING", *, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "s-r1", "uid": "u1"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-05T00:00:00Z"
    return {"metadata": meta, "status": {"jobStatus": job_status, "jobId": "s-r1-abc", "dashboardURL": "h:8265"}}


@pytest.mark.parametrize(
    "body,why",
    [
        (None, "no RayJob"),
        (rayjob("SUCCEEDED"), "ended"),
        (rayjob("STOPPED"), "stopped"),
        (rayjob("FAILED"), "failed"),
        (rayjob(""), "never submitted"),
        (rayjob(deleting=True), "KubeRay's deletion branch already stopped it"),
    ],
)
def test_nothing_to_stop_deletes_at_once(body: Any, why: str) -> None:
    step = gs.decide_graceful_stop(body, addressable=True, requested_at=None, now=100.0, window=60)
    assert step == gs.StopStep(False, None, step.why), why


def test_a_running_job_is_asked_then_waited_for_at_most_the_window() -> None:
    first = gs.decide_graceful_stop(rayjob(), addressable=True, requested_at=None, now=100.0, window=60)
    assert first.request and first.wait_s == gs.FIRST_LOOK_S
    waiting = gs.decide_graceful_stop(rayjob(), addressable=True, requested_at=100.0, now=130.0, window=60)
    assert not waiting.request and waiting.wait_s is not None and 0 < waiting.wait_s <= 30
    assert gs.decide_graceful_stop(rayjob(), addressable=True, requested_at=100.0, now=160.0, window=60).wait_s is None
    # The job ended while asked: delete now, whatever the window says.
    assert (
        gs.decide_graceful_stop(rayjob("STOPPED"), addressable=True, requested_at=100.0, now=101, window=60).wait_s
        is None
    )
    # The driver recorded its own stop in _sweep/status.json: nothing left to wait for.
    done = gs.decide_graceful_stop(
        rayjob(), addressable=True, requested_at=100.0, now=101.0, window=60, driver_stopped=True
    )
    assert done.wait_s is None


def test_a_job_without_a_dashboard_url_or_id_is_left_to_kuberays_stop() -> None:
    step = gs.decide_graceful_stop(rayjob(), addressable=False, requested_at=None, now=100.0, window=60)
    assert not step.request and step.wait_s is None and "dashboard" in step.why


def test_the_window_is_the_graceful_stop_plus_kuberays_look_capped_by_the_operator() -> None:
    assert gs.window_s(300, 900) == 300 + gs.OBSERVE_MARGIN_S
    assert gs.window_s(3000, 900) == 900
    assert gs.window_s(0, 900) == gs.OBSERVE_MARGIN_S


def workload(uid: str, evicted: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "rayjob-s-r1-x",
            "creationTimestamp": "2026-12-05T00:00:00Z",
            "ownerReferences": [{"kind": "RayJob", "uid": uid, "controller": True}],
        },
        "spec": {"queueName": "team"},
        "status": {"conditions": [{"type": "Evicted", "status": evicted, "reason": "Preempted"}]},
    }


def test_a_kueue_eviction_is_read_from_the_workload_it_controls_never_from_spec_suspend() -> None:
    """Kueue's evict.IsEvicted (Evicted=True on the Workload whose controller is the RayJob, kueue.workload_of)."""
    job = {**rayjob(), "metadata": {"name": "s-r1", "uid": "u1", "labels": {"kueue.x-k8s.io/queue-name": "team"}}}
    assert gs.evicted_by_kueue(job, [workload("u1", "True")])
    assert not gs.evicted_by_kueue(job, [workload("u1", "False")])
    assert not gs.evicted_by_kueue(job, [workload("someone-else", "True")])
    suspended = {**job, "spec": {"suspend": True}}  # a suspend alone (anyone may set it) is no eviction
    assert not gs.evicted_by_kueue(suspended, [])
    assert not gs.evicted_by_kueue(rayjob(), [workload("u1", "True")]), "not a Kueue RayJob (no queue-name label)"


def test_a_stop_request_is_recorded_in_the_sweeps_status_and_read_back_only_for_its_rayjob() -> None:
    """An operator restart in the middle of a stop neither restarts the window nor forgets it: the request time is
    in status.gracefulStop (only the operator writes status), keyed by the RayJob's uid (a new run's RayJob of the
    same name is another stop)."""
    recorded = updated(read_status({}), gs.request_status("uid-1", 1_800_000_000.4))
    assert status_document(recorded) == {"gracefulStop": {"rayJobUid": "uid-1", "requestedAt": "2027-01-15T08:00:00Z"}}
    assert gs.recorded_request(recorded, "uid-1") == 1_800_000_000.0  # whole seconds: the window only shortens
    assert gs.recorded_request(recorded, "uid-2") is None
    assert gs.recorded_request(read_status({}), "uid-1") is None
    garbage = read_status({"gracefulStop": {"rayJobUid": "uid-1", "requestedAt": "garbage"}})
    assert gs.recorded_request(garbage, "uid-1") is None
    assert gs.recorded_request(recorded, "") is None


# ---- the head's address: the head Service KubeRay made for the RayJob's own cluster, or nothing is sent


def _made_by_kuberay() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], str]:
    """A RayJob, the RayCluster KubeRay made for it, the head Service KubeRay made for that (the stand-in's model of
    common/service.go BuildServiceForHeadPod and createService's controller reference) and the dashboard URL
    utils.FetchHeadServiceURL writes from it."""
    from sweep_sandbox.kuberay.builders import head_service_body, head_service_url

    job = {
        "metadata": {"name": "s-r1", "namespace": "team-a", "uid": "job-uid"},
        "status": {"jobStatus": "RUNNING", "jobId": "s-r1-abc", "rayClusterName": "s-r1-x7k2p"},
    }
    owner = {"apiVersion": "ray.io/v1", "kind": "RayJob", "name": "s-r1", "uid": "job-uid", "controller": True}
    cluster = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "s-r1-x7k2p", "namespace": "team-a", "uid": "cluster-uid", "ownerReferences": [owner]},
        "spec": {"headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head"}]}}}},
    }
    service = head_service_body(cluster)
    url = head_service_url(service)
    assert url == "s-r1-x7k2p-head-svc.team-a.svc.cluster.local:8265"
    return job, cluster, service, url


def _edited(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    import copy

    out = copy.deepcopy(obj)
    *parents, last = path.split(".")
    node = out
    for key in parents:
        node = node.setdefault(key, {})
    if value is None:
        node.pop(last, None)
    else:
        node[last] = value
    return out


def test_the_head_service_kuberay_made_is_addressed() -> None:
    job, cluster, service, url = _made_by_kuberay()
    assert gs.head_service_name(cluster) == "s-r1-x7k2p-head-svc"  # utils.GenerateHeadServiceName
    assert gs.head_address_refusal(job, cluster, service, url) == ""
    assert gs.head_address_refusal(job, cluster, service, "http://" + url) == ""


@pytest.mark.parametrize(
    "part, path, value, why",
    [
        ("service", "spec.type", "ExternalName", "is of type ExternalName, not the ClusterIP Service KubeRay makes"),
        ("service", "spec.type", "NodePort", "is of type NodePort"),
        ("service", "spec.ports", [{"name": "dashboard", "port": 6379}], "dashboard URL is not port 6379"),
        ("service", "spec.ports", [{"name": "http", "port": 8265}], "has no port named dashboard"),
        ("service", "spec.selector", None, "does not select the head pod of RayCluster s-r1-x7k2p"),
        ("service", "spec.selector", {"app": "internal-admin"}, "does not select the head pod"),
        ("service", "metadata.ownerReferences", None, "is not the one KubeRay made for RayCluster s-r1-x7k2p"),
        ("service", "metadata.ownerReferences", [{"kind": "RayCluster", "uid": "other", "controller": True}], "not"),
        ("cluster", "metadata.ownerReferences", None, "RayCluster s-r1-x7k2p is not the one KubeRay made"),
        ("url", "", "10.0.0.9:8265", "dashboard URL is not port 8265 of its head Service s-r1-x7k2p-head-svc"),
        ("url", "", "s-r1-x7k2p-head-svc.team-b.svc.cluster.local:8265", "dashboard URL is not"),
    ],
)
def test_a_head_service_or_address_that_is_not_kuberays_gets_no_request(
    part: str, path: str, value: Any, why: str
) -> None:
    """A tenant who may edit Services steers the head's name elsewhere (ExternalName to any host, another port, no
    selector and hand-made endpoints) or makes a look-alike: the operator sends its Jobs API request only to the
    dashboard port of the ClusterIP Service KubeRay made for the RayJob's own cluster, and says why not otherwise."""
    job, cluster, service, url = _made_by_kuberay()
    if part == "service":
        service = _edited(service, path, value)
    elif part == "cluster":
        cluster = _edited(cluster, path, value)
    else:
        url = value
    assert why in gs.head_address_refusal(job, cluster, service, url)


def test_no_cluster_or_no_service_gets_no_request() -> None:
    job, cluster, service, url = _made_by_kuberay()
    assert "its RayCluster s-r1-x7k2p is not there" in gs.head_address_refusal(job, None, service, url)
    assert "its head Service s-r1-x7k2p-head-svc does not exist" in gs.head_address_refusal(job, cluster, None, url)


def test_the_drivers_stop_record_becomes_status_last_stop_naming_what_it_could_not_wait_for() -> None:
    """The driver's `stop` block (training_entrypoints.graceful_stop.GracefulStop.record) as status.lastStop: what
    the stop waited for, what committed, each upload it could not wait for; valid against the CRD's schema."""
    from sweep_contracts.api import SweepStatus

    document = {
        "phase": "Stopped",
        "stop": {
            "signal": "SIGTERM",
            "requestedAt": "2026-12-07T12:15:38Z",
            "stoppedAt": "2026-12-07T12:15:49Z",
            "waitedSeconds": 10.7,
            "uploads": {
                "waitSeconds": 50.0,
                "waitedFor": 2,
                "committed": 1,
                "notWaitedFor": [
                    {"trial": "t1", "checkpoint": "checkpoint_epoch-000004"},
                    {"trial": "t2", "checkpoint": None},
                ],
                "notWaitedForCount": 2,
                "message": "could not wait for 2 checkpoint upload(s) in flight (trial t1 checkpoint "
                "checkpoint_epoch-000004, trial t2 (unnamed)): ...",
            },
        },
    }
    last = gs.last_stop_status(document, "u1")
    assert stored(last) == {
        "rayJobUid": "u1",
        "stoppedAt": "2026-12-07T12:15:49Z",
        "waitedSeconds": 10.7,
        "uploadsWaitedFor": 2,
        "uploadsCommitted": 1,
        "uploadsNotWaitedFor": [{"trial": "t1", "checkpoint": "checkpoint_epoch-000004"}, {"trial": "t2"}],
        "uploadsNotWaitedForCount": 2,
        "message": document["stop"]["uploads"]["message"],
    }
    SweepStatus.model_validate({"lastStop": last})
    assert gs.last_stop_status({"phase": "Running"}, "u1") is None and gs.last_stop_status(None, "u1") is None


def test_a_stop_record_of_the_wrong_shape_is_bounded_and_typed_never_copied_as_it_is() -> None:
    """status.json is written by the tenant's image: a wrong type is left out, long texts are cut, lists bounded."""
    from sweep_contracts.api import MAX_STOP_UPLOADS_LISTED, SweepStatus

    document = {
        "stop": {
            "stoppedAt": 5,
            "waitedSeconds": float("nan"),
            "uploads": {
                "waitedFor": True,
                "committed": -1,
                "notWaitedFor": [{"trial": "t" * 1000, "checkpoint": 7}, "junk", {"checkpoint": "c"}] * 30,
                "message": "m" * 5000,
            },
        }
    }
    found = gs.last_stop_status(document, "")
    assert found is not None
    last = stored(found)
    assert set(last) == {"uploadsNotWaitedFor", "message"}
    assert len(last["uploadsNotWaitedFor"]) == MAX_STOP_UPLOADS_LISTED
    assert all(set(u) == {"trial"} and len(u["trial"]) == gs.MAX_STOP_TEXT_CHARS for u in last["uploadsNotWaitedFor"])
    assert len(last["message"]) == gs.MAX_STOP_MESSAGE_CHARS
    SweepStatus.model_validate({"lastStop": last})
    # A driver without the upload wait records no uploads: the status says when it stopped, nothing about uploads.
    assert stored(gs.last_stop_status({"stop": {"stoppedAt": "2026-12-07T12:15:49Z"}}, "u1")) == {
        "rayJobUid": "u1",
        "stoppedAt": "2026-12-07T12:15:49Z",
    }
