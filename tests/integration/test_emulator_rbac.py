"""RBAC in the emulator through the real kubectl, one token per user: a tenant bound only to the standard `edit`
ClusterRole in its namespace (with the chart's roles aggregated into it, as the clusterrole-aggregation controller
does) applies a sweep, cannot write its status, reads its GPU-hour ledger and cannot write or delete it; a user with
no binding is refused everything but discovery. Each refusal is kube-apiserver's 403, as kubectl prints it
(handlers/responsewriters/errors.go Forbidden; plugin/pkg/auth/authorizer/rbac/rbac.go RuleAllows decides).
The namespace and the binding are made with `kubectl create`, whose bodies are protobuf."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sweep_contracts import constants
from sweep_sandbox import chart_admission, rbac
from sweep_sandbox.admission import UserInfo
from sweep_sandbox.emulator import EmulatorServer
from tests.support.factories import cpu_sweep

pytestmark = pytest.mark.integration

KUBECTL = Path(sys.executable).parent / "kubectl"
NAMESPACE = "team-c"
READ = ("get", "list", "watch")
USERS = {
    "carol": UserInfo("carol", ("team-c:developers", "system:authenticated")),  # edit in team-c
    "dave": UserInfo("dave", ("system:authenticated",)),  # no binding
}


@dataclass
class Cluster:
    server: EmulatorServer
    kubeconfig: Path

    def kubectl(self, context: str, *args: str, stdin: Any = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(KUBECTL), "--kubeconfig", str(self.kubeconfig), "--context", context, *args],
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
        assert done.returncode != 0, f"allowed: {done.stdout}"
        return done.stderr.strip()


def forbidden(user: str, verb: str, resource: str, group: str, name: str = "", namespace: str = NAMESPACE) -> str:
    plural = resource.split("/")[0]
    subject = f'{plural}.{group} "{name}"' if name else f"{plural}.{group}"
    return (
        f'Error from server (Forbidden): {subject} is forbidden: User "{user}" cannot {verb} resource "{resource}" '
        f'in API group "{group}" in the namespace "{namespace}"'
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The chart's ClusterRoles aggregated into the standard ones (what `helm install` adds to a cluster), and the
    platform team's `kubectl create namespace` and `kubectl create rolebinding --clusterrole=edit`."""
    state = tmp_path_factory.mktemp("rbac")
    aggregated = [
        d
        for d in chart_admission.render()
        if d["kind"] == "ClusterRole"
        and any(label.startswith(rbac.AGGREGATE_TO) for label in (d["metadata"].get("labels") or {}))
    ]
    with EmulatorServer(tls=True) as server:  # kubectl sends a token over TLS only
        for token, user in USERS.items():
            server.emulator.admission.users[token] = user
        chart_admission.create_rbac(server, aggregated)
        kubeconfig = server.write_kubeconfig(state / "kubeconfig", namespace=NAMESPACE, users={u: u for u in USERS})
        world = Cluster(server, kubeconfig)
        world.ok("sandbox", "create", "namespace", NAMESPACE)
        world.ok("sandbox", "create", "rolebinding", "developers-edit", "--clusterrole=edit",
                 "--group=team-c:developers", "-n", NAMESPACE)  # fmt: skip
        yield world


def test_a_user_bound_only_to_edit_applies_a_sweep_but_cannot_write_its_status_nor_touch_a_ledger(
    cluster: Cluster,
) -> None:
    sweep = cpu_sweep("digits", NAMESPACE)
    created = cluster.ok("carol", "apply", "-f", "-", stdin=sweep)
    assert created["metadata"]["name"] == "digits"
    cluster.ok("carol", "label", "tsw", "digits", "team=c")
    assert cluster.ok("carol", "get", "tsw", "digits")["metadata"]["labels"] == {"team": "c"}
    status = json.dumps({"status": {"phase": "Succeeded"}})
    error = cluster.refused("carol", "patch", "tsw", "digits", "--subresource=status", "--type=merge", "-p", status)
    assert error == forbidden("carol", "patch", "trainingsweeps/status", constants.GROUP, "digits")
    assert "status" not in cluster.ok("sandbox", "get", "tsw", "digits", "-n", NAMESPACE)

    # the GPU-hour ledger: read (the chart's viewer role aggregates into edit), never written by a tenant
    ledger = {
        "apiVersion": constants.API_VERSION,
        "kind": constants.LEDGER_KIND,
        "metadata": {"name": constants.LEDGER_NAME, "namespace": NAMESPACE},
        "spec": {"gpuHours": 10.0, "windowSeconds": 3600},
    }
    error = cluster.refused("carol", "create", "-f", "-", stdin=ledger)
    assert error == forbidden("carol", "create", constants.LEDGER_PLURAL, constants.GROUP).replace(
        "Error from server (Forbidden): ", 'Error from server (Forbidden): error when creating "STDIN": '
    )
    cluster.ok("sandbox", "create", "-f", "-", stdin=ledger)
    assert cluster.ok("carol", "get", "gpuledger", constants.LEDGER_NAME)["spec"]["gpuHours"] == 10.0
    for verb, args in (("patch", ("annotate", "gpuledger", constants.LEDGER_NAME, "note=1")),
                       ("delete", ("delete", "gpuledger", constants.LEDGER_NAME))):  # fmt: skip
        error = cluster.refused("carol", *args)
        assert error == forbidden("carol", verb, constants.LEDGER_PLURAL, constants.GROUP, constants.LEDGER_NAME)

    # edit is the namespace's only: nothing elsewhere, nothing cluster-scoped
    error = cluster.refused("carol", "get", "tsw", "-n", "default")
    assert error == forbidden("carol", "list", constants.PLURAL, constants.GROUP, namespace="default")
    assert 'cannot list resource "namespaces" in API group "" at the cluster scope' in cluster.refused(
        "carol", "get", "namespaces"
    )


def test_edit_is_aggregated_from_the_charts_roles_without_status_or_ledger_writes(cluster: Cluster) -> None:
    rules = cluster.ok("sandbox", "get", "clusterrole", "edit")["rules"]
    sweeps = [r for r in rules if constants.GROUP in r.get("apiGroups", [])]
    granted = {(res, verb) for r in sweeps for res in r["resources"] for verb in r["verbs"]}
    assert {(constants.PLURAL, v) for v in ("create", "delete", "get", "list", "patch", "update", "watch")} <= granted
    assert not {(res, v) for res, v in granted if res == f"{constants.PLURAL}/status" and v not in READ}
    assert not {(res, v) for res, v in granted if res == constants.LEDGER_PLURAL and v not in READ}


def test_a_user_with_no_binding_is_refused_everything_but_discovery(cluster: Cluster) -> None:
    error = cluster.refused("dave", "get", "tsw")
    assert error == forbidden("dave", "list", constants.PLURAL, constants.GROUP)
    error = cluster.refused("dave", "apply", "-f", "-", stdin=cpu_sweep("daves", NAMESPACE))
    assert f'User "dave" cannot get resource "{constants.PLURAL}"' in error  # apply reads the object first
    error = cluster.refused("dave", "create", "configmap", "notes", "--from-literal=a=b")
    assert error == (
        'error: failed to create configmap: configmaps is forbidden: User "dave" cannot create resource '
        f'"configmaps" in API group "" in the namespace "{NAMESPACE}"'
    )
    assert cluster.kubectl("dave", "api-resources", "--api-group", constants.GROUP).returncode == 0
    assert cluster.kubectl("dave", "version").returncode == 0
