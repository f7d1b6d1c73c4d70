"""The newcomer path: without KubeRay's CRDs the schema tests skip and say how to get them; with
SWEEPS_REQUIRE_KUBERAY_CRDS=1 (what .ci/run sets) the same tests fail, so CI cannot pass without them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.schemas import KUBERAY_CRD_FILES, REQUIRE_VARIABLE, require_kuberay_crds

REPO = Path(__file__).resolve().parents[2]
SUBSET = "tests/unit/test_rendering.py::test_schema_check_catches_a_misspelt_field"


def run_subset(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("KUBERAY_CRDS", REQUIRE_VARIABLE, "PYTEST_ADDOPTS")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", SUBSET, "-q", "-rsf", "-p", "no:cacheprovider"],
        cwd=REPO,
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_schema_tests_skip_with_directions_without_the_crds_and_fail_when_required(tmp_path: Path) -> None:
    nowhere = str(tmp_path / "no-kuberay-crds")
    skipped = run_subset(tmp_path, KUBERAY_CRDS=nowhere)
    assert skipped.returncode == 0, skipped.stdout + skipped.stderr
    assert re.search(r"\b1 skipped\b", skipped.stdout), skipped.stdout
    assert f"KubeRay CRD schemas not found in $KUBERAY_CRDS={nowhere}" in skipped.stdout
    assert "github.com/ray-project/kuberay" in skipped.stdout and "ray.io_rayjobs.yaml" in skipped.stdout

    required = run_subset(tmp_path, KUBERAY_CRDS=nowhere, **{REQUIRE_VARIABLE: "1"})
    assert required.returncode == 1, required.stdout + required.stderr
    assert re.search(r"\b1 (failed|error)\b", required.stdout), required.stdout
    assert f"{REQUIRE_VARIABLE}=1: required here" in required.stdout


def test_a_directory_named_by_kuberay_crds_is_used(tmp_path: Path) -> None:
    source = require_kuberay_crds()  # skips saying how to get them; fails under SWEEPS_REQUIRE_KUBERAY_CRDS=1
    for name in KUBERAY_CRD_FILES:
        (tmp_path / name).write_bytes((source / name).read_bytes())
    passed = run_subset(tmp_path, KUBERAY_CRDS=str(tmp_path), **{REQUIRE_VARIABLE: "1"})
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert re.search(r"\b1 passed\b", passed.stdout), passed.stdout


def test_ci_requires_the_crds() -> None:
    script = (REPO / ".ci" / "run").read_text()
    assert f"export {REQUIRE_VARIABLE}=1" in script
    assert script.index(f"export {REQUIRE_VARIABLE}=1") < script.index("exec make test")
