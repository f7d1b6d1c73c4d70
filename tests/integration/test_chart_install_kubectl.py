"""The README's install, applied with the real kubectl to an emulated cluster that has only KubeRay's CRDs (no
cert-manager, no Prometheus Operator) (issue 28): every object of the chart is accepted, and with KubeRay installed in
a namespace of the platform team's choosing, the chart's guard policy leaves RayJobs that are not ours alone and
guards ours (the emulator evaluates the stored policy for each request's user: sweep_sandbox/admission.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from sweep_contracts import constants
from sweep_sandbox import rbac
from sweep_sandbox.admission import UserInfo, service_account_user
from sweep_sandbox.chart_admission import create_rbac
from sweep_sandbox.emulator import EmulatorServer
from tests.unit.test_chart import render_values
from tests.unit.test_chart_install import _commands, _set_values

pytestmark = pytest.mark.integration

KUBECTL = str(Path(sys.executable).parent / "kubectl")
CHART_CRDS = Path(__file__).resolve().parents[2] / "charts" / "trainingsweep-operator" / "crds"
KUBERAY_NAMESPACE = "ray-ops"  # not the README's: the identity comes from the value, whatever the namespace


def _readme_values() -> dict[str, Any]:
    (chart,) = [c for c in _commands() if c[:2] == ["helm", "install"] and "charts/trainingsweep-operator" in c]
    values = _set_values(chart)
    values.setdefault("kuberay", {})["namespace"] = KUBERAY_NAMESPACE
    return values


def _as(server: EmulatorServer, token: str) -> Any:
    api = server.api_client()
    api.set_default_header("Authorization", f"Bearer {token}")
    return kubernetes.client.CustomObjectsApi(api)


def _rayjob(name: str, namespace: str, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": constants.RAY_API_VERSION,
        "kind": constants.RAYJOB_KIND,
        "metadata": {"name": name, "namespace": namespace, **meta},
        "spec": {"entrypoint": "python train.py", "shutdownAfterJobFinishes": True},
    }


def test_the_readmes_install_applies_with_kubectl_and_guards_only_our_rayjobs(tmp_path: Path) -> None:
    values = _readme_values()
    # helm install creates the chart's objects (its hooks run at uninstall only) after the CRDs in crds/.
    docs = [d for d in render_values(values) if "helm.sh/hook" not in (d["metadata"].get("annotations") or {})]
    assert not [d for d in docs if d["apiVersion"].startswith(("cert-manager.io/", "monitoring.coreos.com/"))]
    crds = [d for p in sorted(CHART_CRDS.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]
    namespaces = sorted({d["metadata"]["namespace"] for d in docs if d["metadata"].get("namespace")})
    with EmulatorServer() as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path)}
        core = kubernetes.client.CoreV1Api(server.api_client())
        for namespace in [*namespaces, KUBERAY_NAMESPACE, "team-b"]:  # the README creates them (kubectl, helm)
            core.create_namespace({"metadata": {"name": namespace}})

        def apply(objects: list[dict[str, Any]], name: str) -> None:
            path = tmp_path / name
            path.write_text(yaml.safe_dump_all(objects))
            done = subprocess.run(
                [KUBECTL, "apply", "--server-side", "--validate=false", "-f", str(path)],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr
            assert done.stdout.count("serverside-applied") == len(objects), done.stdout

        apply(crds, "crds.yaml")
        apply(docs, "chart.yaml")

        (account,) = [
            d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["namespace"] == "sweeps-system"
        ]
        tokens = {
            "operator": service_account_user("sweeps-system", account["metadata"]["name"]),
            "kuberay": service_account_user(KUBERAY_NAMESPACE, "kuberay-operator"),
            "tenant": UserInfo("bob@team-b", ("team-b:developers", "system:authenticated")),
        }
        for token, user in tokens.items():
            server.emulator.admission.users[token] = user
        # RBAC as on the cluster: the chart's roles (applied above) for the operator, KubeRay's chart's for KubeRay,
        # and bob owns team-b (every verb there), so what refuses bob below is the guard policy, not RBAC
        owner = rbac.binding("team-b-owner", "cluster-admin", [rbac.subject("Group", "team-b:developers")], "team-b")
        create_rbac(server, [*rbac.kuberay_operator_rbac(KUBERAY_NAMESPACE, "kuberay-operator"), owner])
        kuberay, tenant = _as(server, "kuberay"), _as(server, "tenant")
        group, version, plural = constants.RAY_GROUP, constants.RAY_VERSION_API, constants.RAYJOB_PLURAL

        # A RayJob that is not ours: KubeRay (in its own namespace) and its owner write it as they like.
        tenant.create_namespaced_custom_object(group, version, "team-b", plural, _rayjob("theirs", "team-b"))
        status = {"status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}}
        kuberay.patch_namespaced_custom_object_status(group, version, "team-b", plural, "theirs", status)
        tenant.patch_namespaced_custom_object_status(group, version, "team-b", plural, "theirs", status)

        # Ours: KubeRay may write it; a tenant may neither make a look-alike nor unguard one.
        ours = _rayjob(
            "digits-r1", "team-b", labels={constants.LABEL_SWEEP: "digits"}, finalizers=[constants.FINALIZER]
        )
        with pytest.raises(kubernetes.client.ApiException) as refused:
            tenant.create_namespaced_custom_object(group, version, "team-b", plural, ours)
        assert refused.value.status == 403 and "checkpoint-guard" in str(refused.value.body)
        _as(server, "operator").create_namespaced_custom_object(group, version, "team-b", plural, ours)
        kuberay.patch_namespaced_custom_object_status(group, version, "team-b", plural, "digits-r1", status)
        with pytest.raises(kubernetes.client.ApiException) as unguard:
            tenant.patch_namespaced_custom_object(
                group, version, "team-b", plural, "digits-r1", {"metadata": {"finalizers": []}}
            )
        assert unguard.value.status == 403 and constants.FINALIZER in str(unguard.value.body)
