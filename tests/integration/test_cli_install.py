"""The CLI alone: `pip install 'trainingsweep-operator[cli]'` (with the contracts) in a fresh virtual environment
gives `sweepctl` and `kubectl-sweep` without torch or Ray; the test prints the environment's size and the CLI's
start time.

The wheels come from the index this machine's pip is configured with, as `make setup`'s do, fetched several at a
time; the install then runs offline from them alone (`--no-index`), so a dependency the metadata misses fails it.
The two distributions of this repository are built from a copy of the tree: the working tree is left as it was.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
# pip processes fetching wheels at once: each waits seconds on the index per look-up, and each costs a start-up
DOWNLOADS = 10


def _run(*args: str | Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, args))}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _requirements(root: str) -> dict[str, str]:
    """Every distribution `root` (no extra) pulls in, at the version installed here: what `make setup` resolved from
    the pins, and what a CLI-only install resolves to."""
    from importlib.metadata import distribution

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found: dict[str, str] = {}
    todo: list[tuple[str, frozenset[str]]] = [(root, frozenset())]
    while todo:
        name, extras = todo.pop()
        dist = distribution(name)
        key = canonicalize_name(dist.metadata["Name"])
        if key in found:
            continue
        found[key] = dist.version
        for text in dist.requires or []:
            requirement = Requirement(text)
            wanted = extras or frozenset({""})
            if requirement.marker is None or any(requirement.marker.evaluate({"extra": e}) for e in wanted):
                todo.append((requirement.name, frozenset(requirement.extras)))
    return found


def _download(pins: dict[str, str], dest: Path) -> None:
    """The wheels of `pins` from the configured index, several at a time (each look-up waits on the index, not on
    this machine), so the install itself runs offline (--no-index) and resolves from these alone."""
    from concurrent.futures import ThreadPoolExecutor

    def some(group: list[str]) -> None:
        _run(sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", dest, *group)

    wanted = [f"{name}=={version}" for name, version in sorted(pins.items())]
    groups = [wanted[i::DOWNLOADS] for i in range(DOWNLOADS)]
    with ThreadPoolExecutor(max_workers=DOWNLOADS) as pool:
        list(pool.map(some, [g for g in groups if g]))


def _size_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink()) / 1e6


def test_the_cli_extra_installs_sweepctl_without_torch_or_ray(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    for part in ("operator", "contracts"):
        shutil.copytree(REPO / part, tree / part, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for part in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / part, tree / part)
    wheels = tmp_path / "wheels"
    # This environment's setuptools builds them (the version pyproject.toml asks for), no isolated build env.
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", wheels,
         tree / "contracts", tree)  # fmt: skip
    (contracts,) = wheels.glob("trainingsweep_contracts-*.whl")
    (operator,) = wheels.glob("trainingsweep_operator-*.whl")

    pins = _requirements("trainingsweep-operator")
    ours = {"trainingsweep-operator", "trainingsweep-contracts"}
    assert ours <= set(pins) and not {"torch", "ray"} & set(pins), sorted(pins)
    started = time.monotonic()
    _download({k: v for k, v in pins.items() if k not in ours}, wheels)
    downloaded = time.monotonic() - started

    venv = tmp_path / "venv"
    started = time.monotonic()
    _run(sys.executable, "-m", "venv", venv)
    python, bin_dir = venv / "bin" / "python", venv / "bin"
    # --no-compile: the bytecode of ~40 distributions is written by the first imports instead (the CLI's start is
    # measured after a first run)
    _run(python, "-m", "pip", "install", "-q", "--no-compile", "--no-index", "--find-links", wheels, contracts,
         f"{operator}[cli]")  # fmt: skip
    installed = time.monotonic() - started

    listed = _run(python, "-m", "pip", "list", "--format=freeze").stdout.lower()
    names = {line.split("==", 1)[0] for line in listed.splitlines()}
    assert not names & {"torch", "ray", "matplotlib", "trainingsweep-train", "trainingsweep-sandbox"}, sorted(names)
    found = _run(python, "-c", "import importlib.util as u; print([u.find_spec(m) for m in ('torch', 'ray')])")
    assert found.stdout.strip() == "[None, None]"
    # pip only warns about an extra a distribution does not declare: the metadata must name both.
    extras = _run(python, "-c", "import importlib.metadata as m; print(m.metadata('trainingsweep-operator')"
                  ".get_all('Provides-Extra'))").stdout  # fmt: skip
    assert "'cli'" in extras and "'report'" in extras, extras

    version = _run(bin_dir / "sweepctl", "--version")
    assert version.stdout.strip() == "sweepctl 0.1.0"
    assert _run(bin_dir / "kubectl-sweep", "--version").stdout.strip() == "kubectl-sweep 0.1.0"
    checked = _run(bin_dir / "sweepctl", "validate", "-f", REPO / "examples" / "digits-cpu.yaml")
    assert "valid" in checked.stdout, checked.stdout
    bad = subprocess.run(
        [bin_dir / "sweepctl", "validate", "-f", REPO / "tests" / "support" / "fixtures" / "report_run_root"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2, bad.stdout + bad.stderr  # a usage error, not a missing module

    starts = []
    for _ in range(3):
        begun = time.monotonic()
        _run(bin_dir / "sweepctl", "--version")
        starts.append(time.monotonic() - begun)
    imported = _run(python, "-X", "importtime", "-c", "import sweep_operator.cli").stderr.splitlines()[-1]
    print(
        f"\nCLI-only install: {_size_mb(venv):.0f} MB in {len(names)} distributions; wheels downloaded in "
        f"{downloaded:.1f} s, installed offline in {installed:.1f} s; "
        f"`sweepctl --version` {min(starts) * 1000:.0f} ms (best of 3); import sweep_operator.cli: "
        f"{int(imported.split('|')[1]) / 1000:.0f} ms cumulative"
    )
