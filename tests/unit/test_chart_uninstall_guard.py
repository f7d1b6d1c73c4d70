"""The chart's pre-delete hook (issue 12, defect 11): `helm uninstall` fails while the guard's finalizer still holds
objects, and the hook checks exactly the namespaces the operator watches, with the operator's own rights."""

from __future__ import annotations

from tests.unit.test_chart import grants, of_kind, render, render_values


def _hook(docs: list[dict]) -> dict:
    (job,) = [d for d in of_kind(docs, "Job") if d["metadata"]["name"].endswith("uninstall-guard")]
    return job


def test_uninstall_is_refused_while_objects_are_guarded_cluster_wide() -> None:
    docs = render("defaults")
    job = _hook(docs)
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-delete"
    assert "hook-succeeded" in annotations["helm.sh/hook-delete-policy"]  # a failed check stays for `kubectl logs`
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["python", "-m", "sweep_operator.cli", "guarded"]
    assert container["args"] == ["--all-namespaces"]
    assert job["spec"]["backoffLimit"] == 0 and pod["restartPolicy"] == "Never"
    (deployment,) = of_kind(docs, "Deployment")
    assert pod["serviceAccountName"] == deployment["spec"]["template"]["spec"]["serviceAccountName"]
    assert container["image"] == deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # The operator's service account may list everything the check lists.
    table = grants(of_kind(docs, "ClusterRole"))
    for key in (("sweeps.dev", "trainingsweeps"), ("ray.io", "rayjobs"), ("ray.io", "rayclusters")):
        assert "list" in table[key], key


def test_uninstall_check_covers_each_watched_namespace() -> None:
    job = _hook(render("watch-namespaces"))
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["--namespace=team-a", "--namespace=team-b"]


def test_uninstall_check_can_be_turned_off() -> None:
    assert not [
        d
        for d in of_kind(render_values({"uninstallGuard": {"enabled": False}}), "Job")
        if d["metadata"]["name"].endswith("uninstall-guard")
    ]
