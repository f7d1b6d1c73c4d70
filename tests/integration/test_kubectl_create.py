"""`kubectl create <kind>` against the emulator: kubectl builds these objects itself and sends them as protobuf
(application/vnd.kubernetes.protobuf, the `k8s\\0` envelope around runtime.Unknown), with no JSON retry; the emulator
decodes them (sweep_sandbox/protobuf.py, the field numbers of k8s.io/api core/v1 and rbac/v1 generated.proto) and
each object reads back as kubectl asked for it (`--dry-run=client -o json` is what it asked). The Role and RoleBinding
so made then authorize a user (sweep_sandbox/rbac.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sweep_contracts import constants
from sweep_sandbox.admission import UserInfo
from sweep_sandbox.emulator import EmulatorServer
from sweep_sandbox.protobuf import CONTENT_TYPE
from tests.support.factories import cpu_sweep

pytestmark = pytest.mark.integration

KUBECTL = Path(sys.executable).parent / "kubectl"
NS = "ml-team"
SERVER_OWNED = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields")


def _as_asked(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without what the server adds (its metadata; a Namespace's finalizers and phase)."""
    meta = {k: v for k, v in obj["metadata"].items() if k not in SERVER_OWNED}
    rest = {k: v for k, v in obj.items() if k != "metadata" and not (obj["kind"] == "Namespace" and k != "kind")}
    return {**rest, "metadata": meta}


def test_kubectl_create_sends_protobuf_and_every_object_reads_back_as_asked(tmp_path: Path) -> None:
    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(range(256)))
    commands = [
        ("namespace", NS, ()),
        ("serviceaccount", "runner", ()),
        ("secret", "s3", ("generic", "--from-literal=AWS_ACCESS_KEY_ID=AKIA0", "--from-literal=note=clé")),
        ("configmap", "settings", ("--from-literal=lr=0.01", f"--from-file=model={binary}")),
        ("role", "sweeper", ("--verb=get,list,watch", "--resource=trainingsweeps.sweeps.dev,pods/log")),
        ("role", "one-map", ("--verb=get", "--resource=configmaps", "--resource-name=settings")),
        ("rolebinding", "sweepers", ("--role=sweeper", "--user=erin", "--group=ml", f"--serviceaccount={NS}:runner")),
        ("clusterrole", "sweeps-aggregate", ("--aggregation-rule=sweeps.dev/aggregate=true",)),
        ("clusterrole", "log-reader", ("--verb=get", "--non-resource-url=/logs/*")),
        ("clusterrolebinding", "log-readers", ("--clusterrole=log-reader", "--user=erin")),
    ]
    with EmulatorServer(tls=True) as server:
        server.emulator.admission.users["erin"] = UserInfo("erin", ("system:authenticated",))
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig", namespace=NS, users={"erin": "erin"})
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path)}

        def kubectl(*args: str, context: str = "sandbox") -> subprocess.CompletedProcess[str]:
            command = [str(KUBECTL), "--context", context, *args]
            return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)

        for kind, name, options in commands:
            words = [kind, *options[:1], name, *options[1:]] if kind == "secret" else [kind, name, *options]
            if kind in ("serviceaccount", "secret", "configmap", "role", "rolebinding"):
                words += ["-n", NS]
            asked = kubectl("create", *words, "--dry-run=client", "-o", "json")
            assert asked.returncode == 0, asked.stderr
            created = kubectl("create", *words, "-o", "json")
            assert created.returncode == 0, f"kubectl create {' '.join(words)}: {created.stderr}"
            stored = kubectl("get", kind, name, "-o", "json")
            assert stored.returncode == 0, stored.stderr
            assert _as_asked(json.loads(stored.stdout)) == _as_asked(json.loads(asked.stdout)), kind
        posted = [r for r in server.emulator._requests if r.method == "POST"]
        assert [r.headers.get("Content-Type") for r in posted] == [CONTENT_TYPE] * len(commands)

        secret = json.loads(kubectl("get", "secret", "s3", "-o", "json").stdout)
        assert secret["data"]["note"] == "Y2zDqQ=="  # UTF-8 "clé", base64
        settings = json.loads(kubectl("get", "configmap", "settings", "-o", "json").stdout)
        assert settings["data"] == {"lr": "0.01"} and settings["binaryData"]["model"].startswith("AAECAwQF")

        # what they grant: erin reads sweeps in ml-team (the Role through the RoleBinding), nothing else
        sweep = cpu_sweep("digits", NS)
        (tmp_path / "sweep.json").write_text(json.dumps(sweep))
        assert kubectl("apply", "-f", str(tmp_path / "sweep.json")).returncode == 0
        listed = kubectl("get", "tsw", "-o", "name", context="erin")
        assert listed.returncode == 0 and listed.stdout.split() == [f"{constants.SINGULAR}.{constants.GROUP}/digits"]
        refused = kubectl("get", "configmaps", context="erin")
        assert refused.stderr.strip() == (
            'Error from server (Forbidden): configmaps is forbidden: User "erin" cannot list resource "configmaps" '
            f'in API group "" in the namespace "{NS}"'
        )
