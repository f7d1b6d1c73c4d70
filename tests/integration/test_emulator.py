"""The Kubernetes API emulator: what kopf, kubectl and the kubernetes client rely on, on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sweep_contracts import constants
from sweep_sandbox.emulator import EmulatorServer, build_emulator, parse_label_selector
from tests.support.factories import cpu_sweep
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

REPO = Path(__file__).resolve().parents[2]
KUBECTL = Path(sys.executable).parent / "kubectl"
G, V, P = constants.GROUP, constants.VERSION, constants.PLURAL
RAY = (constants.RAY_GROUP, constants.RAY_VERSION_API)


@pytest.fixture(scope="module")
def server() -> Iterator[EmulatorServer]:
    with EmulatorServer() as running:
        yield running


@pytest.fixture(autouse=True)
def _no_leftover_errors(server: EmulatorServer) -> Iterator[None]:
    yield
    server.emulator.errors.clear()


@pytest.fixture
def ns() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def api(server: EmulatorServer) -> Any:
    return server.api_client()


@pytest.fixture
def custom(api: Any) -> Any:
    import kubernetes.client

    return kubernetes.client.CustomObjectsApi(api)


@pytest.fixture
def core(api: Any) -> Any:
    import kubernetes.client

    return kubernetes.client.CoreV1Api(api)


def sweep(name: str, **labels: str) -> dict[str, Any]:
    """A valid TrainingSweep (the strict emulator refuses an incomplete spec), namespace left to the request."""
    body = cpu_sweep(name)
    body["metadata"] = {"name": name, "labels": labels}
    body["spec"]["image"] = "img:1"
    return body


def owned(kind_obj: dict[str, Any], name: str, kind: str, api_version: str) -> dict[str, Any]:
    """An object of `kind` owned (controller) by `kind_obj`."""
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {
            "name": name,
            "ownerReferences": [
                {
                    "apiVersion": kind_obj["apiVersion"],
                    "kind": kind_obj["kind"],
                    "name": kind_obj["metadata"]["name"],
                    "uid": kind_obj["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": RAYCLUSTER_SPEC if kind == "RayCluster" else {},
    }


# The least RayCluster spec KubeRay v1.7.0's schema takes (headGroupSpec, its pod template and a container).
RAYCLUSTER_SPEC = {"headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head", "image": "ray:1"}]}}}}


def get_json(server: EmulatorServer, path: str) -> Any:
    with urllib.request.urlopen(server.url + path, timeout=5) as response:
        return json.loads(response.read())


def gone(fn: Any) -> bool:
    import kubernetes.client

    try:
        fn()
    except kubernetes.client.ApiException as e:
        return e.status == 404
    return False


# ---- discovery and object metadata


def test_discovery_serves_core_v1_our_crd_and_kuberay(server: EmulatorServer) -> None:
    core_v1 = get_json(server, "/api/v1")
    assert core_v1["groupVersion"] == "v1"  # kmock says "/v1": kubectl then ignores every core kind
    assert {"pods", "events", "namespaces", "pods/status"} <= {r["name"] for r in core_v1["resources"]}
    groups = {g["name"] for g in get_json(server, "/apis")["groups"]}
    assert {constants.GROUP, constants.RAY_GROUP} <= groups
    ours = {r["name"]: r for r in get_json(server, f"/apis/{G}/{V}")["resources"]}
    assert ours[P]["shortNames"] == [constants.SHORT_NAME] and ours[P]["kind"] == constants.KIND
    assert f"{P}/status" in ours
    ray = {r["name"] for r in get_json(server, f"/apis/{constants.RAY_GROUP}/{constants.RAY_VERSION_API}")["resources"]}
    assert {"rayjobs", "rayjobs/status", "rayclusters", "rayclusters/status"} <= ray


def test_create_fills_server_owned_metadata(custom: Any, ns: str) -> None:
    created = custom.create_namespaced_custom_object(G, V, ns, P, sweep("a"))
    meta = created["metadata"]
    assert created["kind"] == constants.KIND and created["apiVersion"] == constants.API_VERSION
    assert meta["namespace"] == ns and meta["generation"] == 1
    assert meta["uid"] and int(meta["resourceVersion"]) > 0 and meta["creationTimestamp"].endswith("Z")
    generated = custom.create_namespaced_custom_object(
        G, V, ns, P, {**sweep(""), "metadata": {"generateName": "sweep-"}}
    )
    assert generated["metadata"]["name"].startswith("sweep-") and len(generated["metadata"]["name"]) == 11


def test_create_twice_conflicts_with_already_exists(custom: Any, ns: str) -> None:
    import kubernetes.client

    custom.create_namespaced_custom_object(G, V, ns, P, sweep("a"))
    with pytest.raises(kubernetes.client.ApiException) as raised:
        custom.create_namespaced_custom_object(G, V, ns, P, sweep("a"))
    assert raised.value.status == 409 and json.loads(raised.value.body)["reason"] == "AlreadyExists"


def test_list_has_kind_api_version_selectors_and_pages(custom: Any, ns: str) -> None:
    for i in range(5):
        custom.create_namespaced_custom_object(G, V, ns, P, sweep(f"s{i}", team="a" if i % 2 else "b"))
    listed = custom.list_namespaced_custom_object(G, V, ns, P)
    assert listed["kind"] == f"{constants.KIND}List" and listed["apiVersion"] == constants.API_VERSION
    assert all(item["kind"] == constants.KIND for item in listed["items"])
    assert [
        i["metadata"]["name"]
        for i in custom.list_namespaced_custom_object(G, V, ns, P, label_selector="team=a")["items"]
    ] == ["s1", "s3"]
    assert len(custom.list_namespaced_custom_object(G, V, ns, P, label_selector="team in (a,b),team!=b")["items"]) == 2
    assert [
        i["metadata"]["name"]
        for i in custom.list_namespaced_custom_object(G, V, ns, P, field_selector="metadata.name=s4")["items"]
    ] == ["s4"]
    first = custom.list_namespaced_custom_object(G, V, ns, P, limit=2)
    rest = custom.list_namespaced_custom_object(G, V, ns, P, limit=10, _continue=first["metadata"]["continue"])
    assert [i["metadata"]["name"] for i in first["items"] + rest["items"]] == [f"s{i}" for i in range(5)]


def test_label_selector_grammar() -> None:
    labels = {"a": "1", "b": "2"}
    assert parse_label_selector("a=1,b==2,c!=3,!d,a,b in (2, 3),a notin (4)")(labels)
    assert not parse_label_selector("a=1,d")(labels)


def test_namespaces_are_listed_and_created_on_demand(core: Any, custom: Any, ns: str) -> None:
    custom.create_namespaced_custom_object(G, V, ns, P, sweep("a"))
    names = {n.metadata.name for n in core.list_namespace().items}  # kmock answers this with an error
    assert {"default", ns} <= names
    assert core.read_namespace(ns).status.phase == "Active"


def test_creating_a_crd_serves_its_kind(server: EmulatorServer, api: Any, ns: str) -> None:
    import kubernetes.client

    from sweep_sandbox.emulator import minimal_crd

    crd = minimal_crd("example.dev", "v1", "Widget", "widgets", short_names=["wd"])
    kubernetes.client.ApiextensionsV1Api(api).create_custom_resource_definition(crd)
    assert "widgets" in {r["name"] for r in get_json(server, "/apis/example.dev/v1")["resources"]}
    widgets = kubernetes.client.CustomObjectsApi(api)
    widgets.create_namespaced_custom_object("example.dev", "v1", ns, "widgets", {"metadata": {"name": "w"}})
    assert widgets.list_namespaced_custom_object("example.dev", "v1", ns, "widgets")["kind"] == "WidgetList"


# ---- updates: status subresource, generation, optimistic concurrency


def test_status_subresource_owns_status_and_generation_counts_spec_changes(custom: Any, ns: str) -> None:
    created = custom.create_namespaced_custom_object(G, V, ns, P, {**sweep("a"), "status": {"phase": "Fake"}})
    assert "status" not in created  # create ignores status when the status subresource exists
    patched = custom.patch_namespaced_custom_object_status(
        G, V, ns, P, "a", {"status": {"phase": "Running"}, "spec": {"image": "x"}}
    )
    assert patched["status"] == {"phase": "Running"} and patched["spec"]["image"] == "img:1"
    assert patched["metadata"]["generation"] == 1
    patched = custom.patch_namespaced_custom_object(
        G, V, ns, P, "a", {"spec": {"image": "y"}, "status": {"phase": "No"}}
    )
    assert patched["spec"]["image"] == "y" and patched["status"] == {"phase": "Running"}
    assert patched["metadata"]["generation"] == 2
    patched = custom.patch_namespaced_custom_object(G, V, ns, P, "a", {"metadata": {"labels": {"x": "1"}}})
    assert patched["metadata"]["generation"] == 2  # metadata is not spec


def test_stale_resource_version_conflicts(custom: Any, ns: str) -> None:
    import kubernetes.client

    created = custom.create_namespaced_custom_object(G, V, ns, P, sweep("a"))
    stale = created["metadata"]["resourceVersion"]
    custom.patch_namespaced_custom_object(G, V, ns, P, "a", {"spec": {"image": "b"}})
    with pytest.raises(kubernetes.client.ApiException) as merge:
        custom.patch_namespaced_custom_object(G, V, ns, P, "a", {"metadata": {"resourceVersion": stale}, "spec": {}})
    assert merge.value.status == 409
    with pytest.raises(kubernetes.client.ApiException) as json_patch:  # kopf's finalizer patches carry this test op
        custom.patch_namespaced_custom_object(
            G,
            V,
            ns,
            P,
            "a",
            [
                {"op": "test", "path": "/metadata/resourceVersion", "value": stale},
                {"op": "add", "path": "/metadata/finalizers", "value": ["x"]},
            ],
            _content_type="application/json-patch+json",
        )
    assert json_patch.value.status == 422


def test_no_op_patch_keeps_the_resource_version(custom: Any, ns: str) -> None:
    created = custom.create_namespaced_custom_object(G, V, ns, P, sweep("a"))
    again = custom.patch_namespaced_custom_object(G, V, ns, P, "a", {"spec": {"image": "img:1"}})
    assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


def test_strategic_merge_patch_is_refused_on_custom_resources(api: Any, ns: str, custom: Any) -> None:
    import kubernetes.client

    custom.create_namespaced_custom_object(G, V, ns, P, sweep("a"))
    with pytest.raises(kubernetes.client.ApiException) as raised:
        custom.patch_namespaced_custom_object(
            G, V, ns, P, "a", {"spec": {}}, _content_type="application/strategic-merge-patch+json"
        )
    assert raised.value.status == 415


def test_pod_quantities_are_stored_as_strings(server: EmulatorServer, core: Any, ns: str) -> None:
    pod = {
        "metadata": {"name": "p"},
        "spec": {
            "containers": [
                {"name": "c", "image": "i", "resources": {"limits": {constants.GPU_RESOURCE: 1, "cpu": 0.5}}}
            ]
        },
    }
    request = urllib.request.Request(  # raw JSON: the typed client refuses the ints the API server accepts
        f"{server.url}/api/v1/namespaces/{ns}/pods",
        data=json.dumps(pod).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    urllib.request.urlopen(request, timeout=5).close()
    read = core.read_namespaced_pod("p", ns)
    assert read.spec.containers[0].resources.limits == {constants.GPU_RESOURCE: "1", "cpu": "500m"}
    assert read.status.phase == "Pending"


# ---- deletion: finalizers, deletionTimestamp, garbage collection


def test_finalizer_holds_deletion_until_removed(custom: Any, ns: str) -> None:
    import kubernetes.client

    custom.create_namespaced_custom_object(
        G, V, ns, P, {**sweep("a"), "metadata": {"name": "a", "finalizers": [constants.FINALIZER]}}
    )
    custom.delete_namespaced_custom_object(G, V, ns, P, "a")
    held = custom.get_namespaced_custom_object(G, V, ns, P, "a")
    assert held["metadata"]["deletionTimestamp"] and held["metadata"]["finalizers"] == [constants.FINALIZER]
    with pytest.raises(kubernetes.client.ApiException) as raised:
        custom.patch_namespaced_custom_object(
            G, V, ns, P, "a", {"metadata": {"finalizers": [constants.FINALIZER, "x/y"]}}
        )
    assert raised.value.status == 422  # no new finalizers once deleting
    custom.patch_namespaced_custom_object(G, V, ns, P, "a", {"metadata": {"finalizers": None}})
    assert gone(lambda: custom.get_namespaced_custom_object(G, V, ns, P, "a"))


def test_owner_deletion_cascades_to_dependents_in_the_background(custom: Any, core: Any, ns: str) -> None:
    owner = custom.create_namespaced_custom_object(G, V, ns, P, sweep("s"))
    rayjob = custom.create_namespaced_custom_object(
        *RAY, ns, "rayjobs", owned(owner, "j", "RayJob", constants.RAY_API_VERSION)
    )
    cluster = custom.create_namespaced_custom_object(
        *RAY, ns, "rayclusters", owned(rayjob, "c", "RayCluster", constants.RAY_API_VERSION)
    )
    pod = owned(cluster, "c-head", "Pod", "v1")
    pod["spec"] = {"containers": [{"name": "ray", "image": "i"}]}
    core.create_namespaced_pod(ns, pod)
    custom.delete_namespaced_custom_object(G, V, ns, P, "s")
    wait_for(lambda: gone(lambda: core.read_namespaced_pod("c-head", ns)), 5, what="the cascade to reach the pod")
    assert gone(lambda: custom.get_namespaced_custom_object(*RAY, ns, "rayjobs", "j"))
    assert gone(lambda: custom.get_namespaced_custom_object(*RAY, ns, "rayclusters", "c"))


def test_garbage_collection_respects_finalizers_on_owner_and_dependent(custom: Any, ns: str) -> None:
    guarded = {"name": "j", "finalizers": [constants.FINALIZER]}
    rayjob = custom.create_namespaced_custom_object(*RAY, ns, "rayjobs", {"metadata": guarded, "spec": {}})
    dependent = owned(rayjob, "c", "RayCluster", constants.RAY_API_VERSION)
    dependent["metadata"]["finalizers"] = [constants.FINALIZER]
    custom.create_namespaced_custom_object(*RAY, ns, "rayclusters", dependent)
    custom.delete_namespaced_custom_object(*RAY, ns, "rayjobs", "j")
    cluster = custom.get_namespaced_custom_object(*RAY, ns, "rayclusters", "c")
    assert "deletionTimestamp" not in cluster["metadata"]  # background: the owner must be gone first
    custom.patch_namespaced_custom_object(*RAY, ns, "rayjobs", "j", {"metadata": {"finalizers": None}})
    wait_for(
        lambda: custom.get_namespaced_custom_object(*RAY, ns, "rayclusters", "c")["metadata"].get("deletionTimestamp"),
        5,
        what="the collector to delete the dependent",
    )
    custom.patch_namespaced_custom_object(*RAY, ns, "rayclusters", "c", {"metadata": {"finalizers": None}})
    assert gone(lambda: custom.get_namespaced_custom_object(*RAY, ns, "rayclusters", "c"))


def test_orphan_propagation_keeps_dependents(custom: Any, ns: str) -> None:
    import kubernetes.client

    rayjob = custom.create_namespaced_custom_object(*RAY, ns, "rayjobs", {"metadata": {"name": "j"}, "spec": {}})
    custom.create_namespaced_custom_object(
        *RAY, ns, "rayclusters", owned(rayjob, "c", "RayCluster", constants.RAY_API_VERSION)
    )
    custom.delete_namespaced_custom_object(
        *RAY, ns, "rayjobs", "j", body=kubernetes.client.V1DeleteOptions(propagation_policy="Orphan")
    )
    cluster = custom.get_namespaced_custom_object(*RAY, ns, "rayclusters", "c")
    assert "ownerReferences" not in cluster["metadata"]


def test_foreground_deletion_waits_for_dependents(custom: Any, ns: str) -> None:
    import kubernetes.client

    rayjob = custom.create_namespaced_custom_object(*RAY, ns, "rayjobs", {"metadata": {"name": "j"}, "spec": {}})
    custom.create_namespaced_custom_object(
        *RAY, ns, "rayclusters", owned(rayjob, "c", "RayCluster", constants.RAY_API_VERSION)
    )
    custom.delete_namespaced_custom_object(
        *RAY, ns, "rayjobs", "j", body=kubernetes.client.V1DeleteOptions(propagation_policy="Foreground")
    )
    wait_for(lambda: gone(lambda: custom.get_namespaced_custom_object(*RAY, ns, "rayjobs", "j")), 5, what="the owner")
    assert gone(lambda: custom.get_namespaced_custom_object(*RAY, ns, "rayclusters", "c"))


def test_dangling_owner_reference_is_collected(custom: Any, ns: str) -> None:
    ghost = {"apiVersion": constants.RAY_API_VERSION, "kind": "RayJob", "metadata": {"name": "ghost", "uid": "nope"}}
    custom.create_namespaced_custom_object(
        *RAY, ns, "rayclusters", owned(ghost, "c", "RayCluster", constants.RAY_API_VERSION)
    )
    wait_for(
        lambda: gone(lambda: custom.get_namespaced_custom_object(*RAY, ns, "rayclusters", "c")),
        5,
        what="the collector to remove a dependent of a missing owner",
    )


def test_namespace_deletion_removes_its_contents(core: Any, custom: Any, ns: str) -> None:
    custom.create_namespaced_custom_object(G, V, ns, P, sweep("a"))
    core.delete_namespace(ns)
    wait_for(lambda: gone(lambda: core.read_namespace(ns)), 5, what="the namespace to go")
    assert custom.list_namespaced_custom_object(G, V, ns, P)["items"] == []


def test_nothing_is_created_in_a_namespace_being_deleted(core: Any, custom: Any, ns: str) -> None:
    """NamespaceLifecycle (k8s.io/apiserver/pkg/admission/plugin/namespace/lifecycle/admission.go `Admit`): while a
    finalizer holds the namespace Terminating, creates of any kind are Forbidden with the NamespaceTerminating
    cause; updates (the finalizer's removal) still pass, and then the namespace goes."""
    import kubernetes.client

    held = sweep("held")
    held["metadata"]["finalizers"] = [constants.FINALIZER]
    custom.create_namespaced_custom_object(G, V, ns, P, held)
    core.delete_namespace(ns)
    wait_for(lambda: core.read_namespace(ns).metadata.deletion_timestamp is not None, 5, what="Terminating")
    with pytest.raises(kubernetes.client.ApiException) as refused:
        custom.create_namespaced_custom_object(G, V, ns, P, sweep("late"))
    status = json.loads(refused.value.body)
    assert (refused.value.status, status["reason"]) == (403, "Forbidden")
    assert status["message"] == (
        f'trainingsweeps.sweeps.dev "late" is forbidden: unable to create new content in namespace {ns} because it '
        "is being terminated"
    )
    assert status["details"]["causes"] == [
        {
            "type": "NamespaceTerminating",
            "message": f"namespace {ns} is being terminated",
            "field": "metadata.namespace",
        }
    ]
    event = {"metadata": {"generateName": "held."}, "involvedObject": {"kind": "TrainingSweep", "name": "held"}}
    with pytest.raises(kubernetes.client.ApiException) as no_event:
        core.create_namespaced_event(ns, event)
    assert json.loads(no_event.value.body)["message"].startswith("events is forbidden: unable to create new content")
    custom.patch_namespaced_custom_object(G, V, ns, P, "held", {"metadata": {"finalizers": []}})
    wait_for(lambda: gone(lambda: core.read_namespace(ns)), 5, what="the namespace to go")


def test_a_create_in_a_namespace_that_does_not_exist_is_not_found_where_the_emulator_is_strict() -> None:
    """NamespaceLifecycle again (lifecycle/admission.go `Admit`: "refuse to operate on non-existent namespaces", the
    live lookup's NotFound returned as it is): the operator's integration environment runs the emulator so
    (`auto_create_namespaces=False`); the Namespace itself and cluster-scoped kinds need none."""
    import kubernetes.client

    with EmulatorServer(build_emulator(auto_create_namespaces=False)) as strict:
        api = strict.api_client()
        core, custom = kubernetes.client.CoreV1Api(api), kubernetes.client.CustomObjectsApi(api)
        with pytest.raises(kubernetes.client.ApiException) as refused:
            custom.create_namespaced_custom_object(G, V, "nowhere", P, sweep("early"))
        status = json.loads(refused.value.body)
        assert (refused.value.status, status["reason"]) == (404, "NotFound")
        assert status["message"] == 'namespaces "nowhere" not found'
        assert status["details"] == {"name": "nowhere", "kind": "namespaces"}
        assert gone(lambda: core.read_namespace("nowhere")), "nothing made the namespace"
        core.create_namespace({"metadata": {"name": "nowhere"}})
        assert custom.create_namespaced_custom_object(G, V, "nowhere", P, sweep("early"))["metadata"]["uid"]


# ---- watches


def test_watch_replays_from_a_resource_version_and_follows_selectors(custom: Any, ns: str) -> None:
    import kubernetes.watch

    start = custom.list_namespaced_custom_object(G, V, ns, P)["metadata"]["resourceVersion"]
    custom.create_namespaced_custom_object(G, V, ns, P, sweep("a", team="x"))
    custom.patch_namespaced_custom_object_status(G, V, ns, P, "a", {"status": {"phase": "Running"}})
    custom.patch_namespaced_custom_object(G, V, ns, P, "a", {"metadata": {"labels": {"team": "y"}}})
    custom.delete_namespaced_custom_object(G, V, ns, P, "a")
    seen = [
        (e["type"], (e["object"].get("status") or {}).get("phase"))
        for e in kubernetes.watch.Watch().stream(
            custom.list_namespaced_custom_object,
            G,
            V,
            ns,
            P,
            resource_version=start,
            label_selector="team=x",
            timeout_seconds=1,
        )
    ]
    assert seen == [("ADDED", None), ("MODIFIED", "Running"), ("DELETED", "Running")]  # leaving the selection


def test_watch_from_an_expired_resource_version_answers_410(server: EmulatorServer, ns: str) -> None:
    server.call(server.emulator.changes.compact)  # as etcd compacts old revisions
    url = f"{server.url}/apis/{G}/{V}/namespaces/{ns}/{P}?watch=true&resourceVersion=1&timeoutSeconds=1"
    with urllib.request.urlopen(url, timeout=5) as response:
        event = json.loads(response.readline())
    assert event["type"] == "ERROR" and event["object"]["code"] == 410


def test_watch_streams_live_changes(custom: Any, ns: str) -> None:
    import kubernetes.watch

    events: list[str] = []
    watch = kubernetes.watch.Watch()

    def follow() -> None:
        for event in watch.stream(custom.list_namespaced_custom_object, G, V, ns, P, timeout_seconds=5):
            events.append(f"{event['type']} {event['object']['metadata']['name']}")
            if event["type"] == "DELETED":
                watch.stop()

    thread = threading.Thread(target=follow)
    thread.start()
    custom.create_namespaced_custom_object(G, V, ns, P, sweep("live"))
    wait_for(lambda: "ADDED live" in events, 5, what="the watch to see the object")  # then delete it
    custom.delete_namespaced_custom_object(G, V, ns, P, "live")
    thread.join(6)
    assert events[-1] == "DELETED live" and "ADDED live" in events


# ---- injected errors


def test_injected_errors_answer_the_next_matching_requests(server: EmulatorServer, custom: Any, ns: str) -> None:
    import kubernetes.client

    custom.create_namespaced_custom_object(G, V, ns, P, sweep("a"))
    conflict = server.emulator.errors.inject(409, times=1, verb="patch", plural=P, subresource="status")
    failure = server.emulator.errors.inject(500, times=2, verb="patch", plural=P, namespace=ns)
    for expected in (409, 500, 500):
        with pytest.raises(kubernetes.client.ApiException) as raised:
            custom.patch_namespaced_custom_object_status(G, V, ns, P, "a", {"status": {"phase": "Running"}})
        assert raised.value.status == expected
    assert custom.get_namespaced_custom_object(G, V, ns, P, "a").get("status") is None  # refused, not applied
    patched = custom.patch_namespaced_custom_object_status(G, V, ns, P, "a", {"status": {"phase": "Running"}})
    assert patched["status"]["phase"] == "Running"
    assert (conflict.hits, failure.hits) == (1, 2) and server.emulator.errors.pending == []


def test_injected_errors_can_target_one_client(server: EmulatorServer, custom: Any, ns: str) -> None:
    server.emulator.errors.inject(503, times=None, verb="list", user_agent="kopf")
    assert custom.list_namespaced_custom_object(G, V, ns, P)["items"] == []  # the python client passes


# ---- kopf


OPERATOR = """
import os
import kopf

@kopf.on.login()
def login(**_):
    return kopf.ConnectionInfo(server=os.environ["EMULATOR_URL"], insecure=True)

@kopf.on.create("sweeps.dev", "v1alpha1", "trainingsweeps")
def created(body, patch, **_):
    patch.status["phase"] = "Running"
    kopf.info(body, reason="Admitted", message="admitted by the test operator")

@kopf.on.delete("sweeps.dev", "v1alpha1", "trainingsweeps")
def deleted(**_):
    pass
"""


def test_kopf_watches_patches_status_posts_events_and_finalizes(
    server: EmulatorServer, custom: Any, core: Any, ns: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kopf.testing

    script = tmp_path / "operator_under_test.py"
    script.write_text(OPERATOR)
    monkeypatch.setenv("EMULATOR_URL", server.url)
    args = ["run", "--standalone", "--namespace", ns, str(script)]
    with kopf.testing.KopfRunner(args, timeout=30) as runner:
        custom.create_namespaced_custom_object(G, V, ns, P, sweep("k"))
        handled = wait_for(
            lambda: (
                (o := custom.get_namespaced_custom_object(G, V, ns, P, "k")).get("status", {}).get("phase") == "Running"
                and o
            ),
            15,
            what="kopf to handle the creation",
        )
        assert handled["metadata"]["finalizers"] == ["kopf.zalando.org/KopfFinalizerMarker"]
        events = wait_for(lambda: core.list_namespaced_event(ns, field_selector="involvedObject.name=k").items, 10)
        assert [e.reason for e in events] == ["Admitted"]
        custom.delete_namespaced_custom_object(G, V, ns, P, "k")
        wait_for(
            lambda: gone(lambda: custom.get_namespaced_custom_object(G, V, ns, P, "k")),
            15,
            what="kopf to release its finalizer",
        )
    assert runner.exit_code == 0 and runner.exception is None


# ---- kubectl


@pytest.fixture
def kubectl(server: EmulatorServer, tmp_path: Path, ns: str) -> Any:
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig", namespace=ns)
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(KUBECTL), *args], env=env, capture_output=True, text=True, timeout=30)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} -> {done.returncode}\n{done.stdout}\n{done.stderr}")
        return done

    run.env = env
    return run


def example(ns: str) -> str:
    """examples/digits-cpu.yaml, in the test's namespace."""
    text = (REPO / "examples" / "digits-cpu.yaml").read_text()
    return text.replace("namespace: default", f"namespace: {ns}")


def test_kubectl_apply_get_custom_columns_describe_and_delete(
    kubectl: Any, custom: Any, tmp_path: Path, ns: str
) -> None:
    from sweep_operator.crd import PRINTER_COLUMNS

    manifest = tmp_path / "sweep.yaml"
    manifest.write_text(example(ns))
    assert "created" in kubectl("apply", "-f", str(manifest)).stdout
    assert "unchanged" in kubectl("apply", "-f", str(manifest)).stdout
    custom.patch_namespaced_custom_object_status(
        G,
        V,
        ns,
        P,
        "digits-cpu",
        {
            "status": {
                "phase": "Running",
                "trialsSummary": "1/2",
                "bestTrial": {"value": 0.25},
                "bestSummary": "0.25",
                "checkpoints": {"verified": True, "summary": "4 committed"},
            }
        },
    )

    table = kubectl("get", constants.SHORT_NAME).stdout.splitlines()
    assert table[0].split()[:4] == ["NAME", "PHASE", "TRIALS", "BEST"]  # the CRD's printer columns, server-side
    assert table[1].split()[:6] == ["digits-cpu", "Running", "1/2", "0.25", "4", "committed"]

    columns = ",".join(f"{c['name'].upper()}:{c['jsonPath']}" for c in PRINTER_COLUMNS if c["type"] != "date")
    custom_table = kubectl("get", constants.SHORT_NAME, "-o", f"custom-columns=NAME:.metadata.name,{columns}").stdout
    assert custom_table.splitlines()[1].split()[:6] == ["digits-cpu", "Running", "1/2", "0.25", "4", "committed"]

    described = kubectl("describe", constants.SHORT_NAME, "digits-cpu").stdout
    assert "Kind:         TrainingSweep" in described and "Trials Summary:  1/2" in described

    assert "deleted" in kubectl("delete", "-f", str(manifest)).stdout
    assert "No resources found" in kubectl("get", constants.SHORT_NAME).stderr


def test_kubectl_get_watch_prints_changes(kubectl: Any, custom: Any, ns: str) -> None:
    custom.create_namespaced_custom_object(G, V, ns, P, sweep("w"))
    process = subprocess.Popen(
        [str(KUBECTL), "get", constants.SHORT_NAME, "-w"],
        env=kubectl.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().split()[:2] == ["NAME", "PHASE"]
        assert process.stdout.readline().split()[0] == "w"
        custom.patch_namespaced_custom_object_status(G, V, ns, P, "w", {"status": {"phase": "Running"}})
        assert process.stdout.readline().split()[:2] == ["w", "Running"]
    finally:
        process.kill()
        process.communicate(timeout=5)


def test_kubectl_get_pods_shows_waiting_reasons(kubectl: Any, core: Any, ns: str) -> None:
    core.create_namespaced_pod(ns, {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}})
    core.patch_namespaced_pod_status(
        "p",
        ns,
        {
            "status": {
                "phase": "Pending",
                "containerStatuses": [
                    {
                        "name": "c",
                        "image": "i",
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {"waiting": {"reason": "ImagePullBackOff"}},
                    }
                ],
            }
        },
    )
    assert kubectl("get", "pods").stdout.splitlines()[1].split()[:3] == ["p", "0/1", "ImagePullBackOff"]


def test_server_stops_cleanly_ending_watches() -> None:
    server = EmulatorServer()
    url = server.start()
    watch = urllib.request.urlopen(f"{url}/apis/{G}/{V}/{P}?watch=true", timeout=5)
    server.stop()
    assert not server.running
    assert watch.read() == b""  # the open watch ended with the server
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(url + "/version", timeout=2)


def test_a_subclass_sees_every_request_through_remember_and_kmocks_log_still_records_them() -> None:
    """`_remember` is the emulator's hook for observing traffic (bench/operator_scale.py counts requests by client
    with it): every request passes through the subclass's override, whose super() call keeps kmock's request log."""
    import attrs
    import kubernetes.client

    from sweep_sandbox.emulator import KubernetesApiEmulator

    @attrs.define(kw_only=True)
    class Observing(KubernetesApiEmulator):
        seen: list[tuple[str, str]] = attrs.field(factory=list)

        def _remember(self, raw: Any, body: bytes, target: Any, verb: str) -> Any:
            self.seen.append((verb, target.plural if target else raw.path))
            return super()._remember(raw, body, target, verb)

    observing = Observing()
    with EmulatorServer(observing) as running:
        core = kubernetes.client.CoreV1Api(running.api_client())
        core.create_namespaced_config_map("default", {"metadata": {"name": "seen"}})
        core.list_namespaced_config_map("default")
        assert ("create", "configmaps") in observing.seen and ("list", "configmaps") in observing.seen
        logged = running.call(lambda: [(r.method, r.resource.plural if r.resource else "") for r in observing])
        assert ("POST", "configmaps") in logged and ("GET", "configmaps") in logged
