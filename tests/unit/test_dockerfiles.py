"""The images' key facts, linted from the Dockerfiles (no image is built here): base images, the
non-root numeric user, which distributions each image installs, and the Ray pin of the training image (R1).
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from sweep_contracts.constants import SUPPORTED_RAY_VERSION

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
TRAIN_BASE_IMAGE = f"rayproject/ray:{SUPPORTED_RAY_VERSION}-py312-gpu"


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str


def instructions(dockerfile: Path) -> list[Instruction]:
    """Dockerfile instructions with comments dropped and continuation lines joined."""
    joined, logical = [], ""
    for line in dockerfile.read_text().splitlines():
        if line.strip().startswith("#") or not line.strip():
            continue
        if line.rstrip().endswith("\\"):
            logical += line.rstrip()[:-1] + " "
            continue
        joined.append(logical + line)
        logical = ""
    assert not logical, f"{dockerfile.name} ends inside a continued line"
    result = []
    for line in joined:
        keyword, _, arguments = line.strip().partition(" ")
        result.append(Instruction(keyword.upper(), arguments.strip()))
    return result


def final_stage(dockerfile: Path) -> list[Instruction]:
    steps = instructions(dockerfile)
    last_from = max(i for i, step in enumerate(steps) if step.keyword == "FROM")
    return steps[last_from:]


def arguments_of(steps: list[Instruction], keyword: str) -> list[str]:
    return [step.arguments for step in steps if step.keyword == keyword]


def assert_runs_as_non_root_numeric_user(steps: list[Instruction]) -> None:
    users = arguments_of(steps, "USER")
    assert users, "no USER: the image would run as root"
    user, _, group = users[-1].partition(":")
    assert user.isdigit() and int(user) > 0, f"USER {users[-1]!r}: must be a numeric non-root uid (runAsNonRoot)"
    assert not group or group.isdigit(), f"USER {users[-1]!r}: the group must be numeric too"


# --- operator image -------------------------------------------------------------------------------


def test_operator_image_is_slim_python_running_as_a_numeric_non_root_user() -> None:
    steps = instructions(DOCKER / "Dockerfile.operator")
    for base in arguments_of(steps, "FROM"):
        # an exact patch release of 3.12 slim (issue 15 pins bases), optionally by digest too
        assert re.fullmatch(r"python:3\.12\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", base.split()[0]), base
    final = final_stage(DOCKER / "Dockerfile.operator")
    assert_runs_as_non_root_numeric_user(final)
    # The same uid the chart's securityContext uses, so runAsUser and the image agree.
    chart_values = (REPO / "charts" / "trainingsweep-operator" / "values.yaml").read_text()
    uid = arguments_of(final, "USER")[-1].partition(":")[0]
    assert re.search(rf"^\s+runAsUser: {uid}$", chart_values, re.MULTILINE)


def pip_install_targets(run: str) -> list[str]:
    """What one `pip install ...` RUN installs: its positional arguments (options and their values dropped)."""
    words = run.split("pip install", 1)[1].split("&&")[0].split(";")[0].split()
    targets, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word.startswith("-"):
            skip = word in ("--constraint", "-c", "--index-url", "--extra-index-url")
        else:
            targets.append(word)
    return targets


def copied_sources(steps: list[Instruction]) -> set[str]:
    sources = set()
    for copy in arguments_of(steps, "COPY"):
        if "--from=" not in copy:
            sources |= {part.rstrip("/") for part in [p for p in copy.split() if not p.startswith("--")][:-1]}
    return sources


def test_operator_image_runs_the_operator_with_operator_dependencies_only() -> None:
    steps = instructions(DOCKER / "Dockerfile.operator")
    final = final_stage(DOCKER / "Dockerfile.operator")
    assert json.loads(arguments_of(final, "ENTRYPOINT")[-1]) == ["python", "-m", "sweep_operator"]
    installs = [run for run in arguments_of(steps, "RUN") if "pip install" in run]
    assert installs, "the package is never installed"
    for run in installs:
        assert "[" not in run, f"extras would pull Ray/torch/moto into the operator image: {run}"
    # The contracts and the operator, in one call (the operator pins trainingsweep-contracts==0.1.0).
    assert [sorted(pip_install_targets(run)) for run in installs] == [[".", "./contracts"]]
    # Neither the training entrypoints nor the sandbox reach the image: they are not even copied.
    assert copied_sources(steps) == {"pyproject.toml", "README.md", "operator", "contracts"}
    # The runtime stage copies the built environment; it never compiles or installs anything.
    for run in arguments_of(final, "RUN"):
        assert not re.search(r"pip install|apt-get install|gcc|build-essential", run), run
    assert any("--from=build" in copy for copy in arguments_of(final, "COPY"))


# --- training image -------------------------------------------------------------------------------


def training_dependencies() -> list[str]:
    return tomllib.loads((REPO / "training" / "pyproject.toml").read_text())["project"]["dependencies"]


def package_install_of(runs: list[str]) -> str:
    (run,) = [run for run in runs if "pip install" in run and "./training" in run]
    return run


def test_training_image_builds_on_the_official_ray_gpu_image_with_ray_pinned() -> None:  # R1
    steps = instructions(DOCKER / "Dockerfile.train")
    (base,) = arguments_of(steps, "FROM")
    assert base.split("@")[0] == TRAIN_BASE_IMAGE
    # pip installs the packages under a constraint that keeps the image's ray exactly at the pin.
    package_install = package_install_of(arguments_of(steps, "RUN"))
    assert "--constraint" in package_install
    assert f"ray=={SUPPORTED_RAY_VERSION}" in package_install
    assert f"ray.__version__ == '{SUPPORTED_RAY_VERSION}'" in package_install
    assert f"ray[train,tune]=={SUPPORTED_RAY_VERSION}" in training_dependencies()


def test_training_image_installs_the_contracts_and_the_entrypoints_only() -> None:
    """No kopf, no kubernetes client: the operator's distribution is neither copied nor installed."""
    steps = instructions(DOCKER / "Dockerfile.train")
    assert sorted(pip_install_targets(package_install_of(arguments_of(steps, "RUN")))) == ["./contracts", "./training"]
    assert copied_sources(steps) == {"contracts", "training", "training_entrypoints"}
    assert "'kopf', 'kubernetes'" in package_install_of(arguments_of(steps, "RUN")), "the image checks it has neither"


def test_training_image_installs_a_cuda_torch_from_the_pytorch_index_before_the_package() -> None:  # R1
    steps = instructions(DOCKER / "Dockerfile.train")
    runs = arguments_of(steps, "RUN")
    (torch_install,) = [run for run in runs if "download.pytorch.org/whl/" in run]
    assert '"torch==${TORCH_VERSION}"' in torch_install
    assert "CUDA_VERSION" in torch_install and "torch.version.cuda" in torch_install
    package_install = package_install_of(runs)
    assert runs.index(torch_install) < runs.index(package_install)
    (torch_version,) = [a.partition("=")[2] for a in arguments_of(steps, "ARG") if a.startswith("TORCH_VERSION=")]
    (torch_range,) = [d for d in training_dependencies() if d.startswith("torch")]
    low, high = re.match(r"torch>=([\d.]+),<([\d.]+)$", torch_range).groups()  # type: ignore[union-attr]  # no match fails the test
    as_tuple = lambda v: tuple(int(p) for p in v.split("."))  # noqa: E731  # a throwaway key, clearer inline
    assert as_tuple(low) <= as_tuple(torch_version) < as_tuple(high)
    assert "torch==${TORCH_VERSION}" in package_install, "pip could replace the CUDA torch"
    assert_runs_as_non_root_numeric_user(final_stage(DOCKER / "Dockerfile.train"))


# --- build context --------------------------------------------------------------------------------


def test_dockerignore_admits_exactly_what_the_dockerfiles_copy() -> None:
    rules = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()]
    rules = [rule for rule in rules if rule and not rule.startswith("#")]
    assert rules[0] == "*", "the build context is an allowlist"
    allowed = {rule[1:].rstrip("/") for rule in rules if rule.startswith("!")}
    for name in ("Dockerfile.operator", "Dockerfile.train"):
        for copy in arguments_of(instructions(DOCKER / name), "COPY"):
            if "--from=" in copy:
                continue
            sources = [part for part in copy.split() if not part.startswith("--")][:-1]
            for source in sources:
                assert source.rstrip("/") in allowed, f"{name}: COPY {source} is excluded by .dockerignore"
    assert not allowed & {".venv", ".git", "tests", "bench", ".sandbox", "sandbox"}
