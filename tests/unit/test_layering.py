"""Layering (kopf's import-linter habit): only `handlers` (and what runs it) may import kopf; the cores stay pure."""

from __future__ import annotations

import subprocess
import sys

PURE_CORES = [
    "sweep_contracts.api",
    "sweep_operator.validation",
    "sweep_contracts.paramspace",
    "sweep_operator.policy",
    "sweep_operator.instance_types",
    "sweep_operator.ledger",
    "sweep_operator.rendering",
    "sweep_contracts.runspec",
    "sweep_contracts.runtime_env",
    "sweep_contracts.s3_layout",
    "sweep_operator.status",
    "sweep_operator.diagnosis",
    "sweep_operator.reconcile.guard",
    "sweep_operator.verification",
    "sweep_operator.reconcile.controller",
    "sweep_operator.kube",
    "sweep_operator.workqueue",
    "sweep_operator.settings",
    "sweep_operator.crd",
    "sweep_operator.cli",
    "training_entrypoints.sweep",
    "training_entrypoints.checkpointing",
    "training_entrypoints.local",
]


def test_pure_cores_never_import_kopf() -> None:
    code = (
        "import importlib, sys\n"
        f"for name in {PURE_CORES!r}:\n"
        "    importlib.import_module(name)\n"
        "    assert 'kopf' not in sys.modules, f'{name} pulled in kopf'\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_handlers_is_the_kopf_shell() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import sys, sweep_operator.handlers; print('kopf' in sys.modules)"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.stdout.strip() == "True", done.stderr


CONTRACTS = [  # what the training image shares with the operator: importable with neither kopf nor the clients
    "sweep_contracts.runtime_env",
    "sweep_contracts.runspec",
    "sweep_contracts.s3_layout",
    "sweep_contracts.checkpoint_manifest",
    "sweep_operator.reconcile.guard",
]


def test_contracts_shared_with_the_training_image_import_no_kopf_kubernetes_or_boto3() -> None:
    code = (
        "import importlib, sys\n"
        f"for name in {CONTRACTS!r}:\n"
        "    importlib.import_module(name)\n"
        "    for client in ('kopf', 'kubernetes', 'boto3', 'botocore'):\n"
        "        assert client not in sys.modules, f'{name} pulled in {client}'\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
