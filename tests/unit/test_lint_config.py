"""`make lint` is wired: CI runs it before the tests, it runs every checker, and the import contracts name the layers.

The contracts themselves are checked by `lint-imports` (.importlinter); these tests keep the wiring from rotting.
"""

from __future__ import annotations

import configparser
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECONCILE = ROOT / "operator" / "sweep_operator" / "reconcile"
# reconcile modules that do I/O or hold state (clients, S3, the ledger): above the decisions, outside the pure contract.
RECONCILE_EDGES = {
    "controller",
    "reads",
    "ports",
    "status_writer",
    "stopping",
    "guard_pipeline",
    "pod_snapshots",
    "executor",
}  # the I/O edges
# The controller's memory between passes (and the deletions' in progress): written by the edges, read by them for
# the facts; it decides nothing.
RECONCILE_MEMORY = {"cache", "deletion_state"}
# Beside reconcile, the pure modules the decisions are built from: the phase table, the admission rules, the status helpers,
# GPU time, what the RayJob carries, its rendering, the spec's parsing and the diagnosis of pending pods.
DECISIONS_BESIDE = {"phases", "policy", "status", "gpu_time", "run_metadata", "rendering", "validation", "diagnosis"}


def importlinter() -> configparser.ConfigParser:
    parser = configparser.ConfigParser()
    parser.read(ROOT / ".importlinter")
    return parser


def contract(name: str) -> configparser.SectionProxy:
    return importlinter()[f"importlinter:contract:{name}"]


def listed(value: str) -> list[str]:
    return [module.strip() for line in value.splitlines() for module in re.split(r"[:|]", line) if module.strip()]


def test_ci_runs_make_lint_before_make_test() -> None:
    commands = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = [line for line in commands if line and not line.startswith("#")]
    lint = next(i for i, line in enumerate(commands) if re.fullmatch(r"(exec )?make lint", line))
    test = next(i for i, line in enumerate(commands) if re.fullmatch(r"(exec )?make test", line))
    assert lint < test


def test_make_lint_installs_first_and_runs_every_checker() -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^lint: (?P<deps>.*)\n(?P<body>(?:\t.*\n)+)", makefile, re.MULTILINE)
    assert recipe is not None, "Makefile has no lint target"
    assert "setup" in recipe["deps"].split()
    body = recipe["body"]
    for checker in ("ruff check", "ruff format --check", "mypy", "lint-imports", "tools/check_suppressions.py"):
        assert checker in body, f"make lint does not run {checker}"
    assert "-p sweep_operator" in body and "-p sweep_contracts" in body


def test_the_lint_tools_are_pinned_in_the_dev_extra() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    dev = re.search(r"^dev = \[(?P<deps>.*?)^\]", pyproject, re.MULTILINE | re.DOTALL)
    assert dev is not None
    for tool in ("ruff", "mypy", "import-linter"):
        assert re.search(rf'"{tool}==[0-9][^"]*"', dev["deps"]), f"{tool} is not pinned exactly in the dev extra"


def test_the_layers_run_handlers_controller_decisions_facts() -> None:
    layers = [listed(line) for line in contract("reconcile-layers")["layers"].strip().splitlines()]
    assert layers[0] == ["sweep_operator.handlers"]
    assert layers[1] == ["sweep_operator.reconcile.controller"]
    assert layers[3] == ["sweep_operator.reconcile.run_pass"]  # the one decision of a run pass, over the rules
    assert "sweep_operator.reconcile.run_phase" in layers[4] and "sweep_operator.reconcile.admission" in layers[4]
    assert "sweep_operator.reconcile.verdicts" in layers[-2]  # what the decisions share
    assert "sweep_operator.reconcile.facts" in layers[-1]


def test_every_reconcile_module_has_its_place_in_the_contracts() -> None:
    modules = {p.stem for p in RECONCILE.glob("*.py") if p.stem != "__init__"}
    in_layers = {m.rsplit(".", 1)[-1] for m in listed(contract("reconcile-layers")["layers"])}
    pure = {m.rsplit(".", 1)[-1] for m in listed(contract("pure-decisions")["source_modules"])}
    assert modules - in_layers == set(), "name the new reconcile module in the layers of .importlinter"
    assert modules - RECONCILE_EDGES - pure == set(), "a decision module goes in the pure-decisions contract"


def test_decisions_and_contracts_may_not_import_the_clients() -> None:
    clients = {"kopf", "kubernetes", "boto3"}
    assert clients <= set(listed(contract("pure-decisions")["forbidden_modules"]))
    assert clients <= set(listed(contract("contracts-stand-alone")["forbidden_modules"]))
    assert "sweep_contracts" in listed(contract("contracts-stand-alone")["source_modules"])
    assert "sweep_sandbox" in listed(contract("operator-without-sandbox")["forbidden_modules"])
    assert importlinter()["importlinter"].getboolean("include_external_packages")


def test_a_suppression_without_a_reason_is_found(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("check_suppressions", ROOT / "tools" / "check_suppressions.py")
    assert spec is not None and spec.loader is not None
    checker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(checker)
    source = tmp_path / "m.py"
    source.write_text(
        "import os  # noqa\n"
        "import re  # noqa: F401\n"
        "import io  # noqa: F401  (re-exported)\n"
        "x: int = 'a'  # type: ignore\n"
        "y: int = 'b'  # type: ignore[assignment]\n"
        "z: int = 'c'  # type: ignore[assignment]  # a sentinel the caller replaces\n"
        "s = '# noqa inside a string is no directive'\n"
    )
    found = checker.findings(source)
    assert [line.split(":")[1] for line in found] == ["1", "2", "4", "5"], found


def test_the_import_contracts_hold() -> None:
    # The same check as `make lint`, so the layers also fail `make test` (kopf's habit: lint-imports in CI).
    done = subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), "--config", ".importlinter", "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": "operator:contracts:sandbox:."},
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_the_decision_modules_are_one_independent_layer_and_an_independence_contract() -> None:
    """Issue 29: no decision module imports another (lint-imports proves it); this keeps both statements of the list
    the same, and every module between run_pass and the shared layer in it."""
    layers = contract("reconcile-layers")["layers"].strip().splitlines()
    decisions_line = next(line for line in layers if "sweep_operator.reconcile.run_phase" in line)
    assert ":" not in decisions_line, "the decision modules' layer is independent: join them with |"
    independent = contract("independent-decisions")
    assert independent["type"].strip() == "independence"
    assert set(listed(independent["modules"])) == set(listed(decisions_line))


def test_every_operator_module_has_its_layer() -> None:
    """Issue 29: the whole package is layered (shell -> reconcile -> the modules beside it -> contracts); a new module
    of sweep_operator must be placed in the operator-layers contract."""
    package = ROOT / "operator" / "sweep_operator"
    modules = {p.stem for p in package.glob("*.py") if p.stem != "__init__"} | {"cli", "reconcile"}
    layered = {
        m.split(".")[1] for m in listed(contract("operator-layers")["layers"]) if m.startswith("sweep_operator.")
    }
    assert sorted(modules - layered) == [], "name the new module in the operator-layers contract of .importlinter"
    layers = [listed(line) for line in contract("operator-layers")["layers"].strip().splitlines()]
    assert layers[2] == ["sweep_operator.reconcile"] and layers[-1] == ["sweep_contracts"]


def test_every_sandbox_module_is_the_emulator_a_stand_in_or_shared() -> None:
    """The sandbox's three parties talk only through the API: each module is on the emulator's side, a stand-in's, or
    named here as shared (what both sides write alike) or as the wiring above them, so a new one must pick a side."""
    package = ROOT / "sandbox" / "sweep_sandbox"
    modules = {f"sweep_sandbox.{p.stem}" for p in package.glob("*.py") if p.stem != "__init__"}
    modules |= {f"sweep_sandbox.{p.name}" for p in package.iterdir() if (p / "__init__.py").exists()}
    emulator = set(listed(contract("sandbox-emulator-alone")["source_modules"]))
    standins = set(listed(contract("sandbox-standins-through-the-api")["source_modules"]))
    shared = {"sweep_sandbox.kube_values", "sweep_sandbox.container_logs"}
    wiring = {
        "sweep_sandbox.stack",
        "sweep_sandbox.operator_thread",
        "sweep_sandbox.chart_admission",
        "sweep_sandbox.s3server",
        "sweep_sandbox.mlflow_server",
    }
    assert emulator & standins == set()
    assert sorted(modules - emulator - standins - shared - wiring) == [], "place the new module in .importlinter"
    assert emulator | wiring <= set(listed(contract("sandbox-standins-through-the-api")["forbidden_modules"]))
    assert standins | wiring <= set(listed(contract("sandbox-emulator-alone")["forbidden_modules"]))
    independent = contract("sandbox-standins-independent")
    assert independent["type"].strip() == "independence"
    assert set(listed(independent["modules"])) == {"sweep_sandbox.kuberay", "sweep_sandbox.kueue"}


def test_every_reconcile_module_is_an_edge_or_a_decision_that_reads_nothing() -> None:
    """The decisions take facts read at the edge: the decisions-without-io contract lists exactly the reconcile modules
    that are neither an edge nor the controller's memory, and the pure modules beside reconcile they are built from,
    so a new module must pick a side; it forbids the clients, what wraps them, the verifier's listing and sockets."""
    no_io = contract("decisions-without-io")
    assert no_io["type"].strip() == "forbidden"
    reconcile = {p.stem for p in RECONCILE.glob("*.py") if p.stem != "__init__"}
    decisions = {f"sweep_operator.reconcile.{m}" for m in reconcile - RECONCILE_EDGES - RECONCILE_MEMORY}
    decisions |= {f"sweep_operator.{m}" for m in DECISIONS_BESIDE}
    assert sorted(set(listed(no_io["source_modules"])) ^ decisions) == [], (
        "a reconcile module that reads goes in RECONCILE_EDGES; one that decides goes in decisions-without-io"
    )
    forbidden = set(listed(no_io["forbidden_modules"]))
    clients = {"kubernetes", "boto3", "botocore", "urllib3", "requests", "aiohttp", "http", "socket"}
    wrappers = {"sweep_operator.kube", "sweep_operator.s3_clients", "sweep_operator.ray_jobs"}
    assert clients | wrappers | {"sweep_operator.verification.listing"} <= forbidden
