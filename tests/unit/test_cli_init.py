"""`sweepctl init NAME`: the scaffold a user starts from with their own training code. Its files, a manifest that
validates, a loop that imports nothing of this project and keeps the report/checkpoint contract when run, a
Dockerfile held to the project's image checks, and the names and targets it refuses."""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import yaml

from sweep_operator.cli import main
from sweep_operator.cli.init import package_name
from tests.unit.test_dockerfiles import Instruction, arguments_of, assert_runs_as_non_root_numeric_user, instructions
from tests.unit.test_security_dockerfiles import DIGEST, EXACT

PROJECT_PACKAGES = ("training_entrypoints", "sweep_contracts", "sweep_operator", "sweep_sandbox")
SCAFFOLD_FILES = [
    "demo_loop/__init__.py",
    "demo_loop/loop.py",
    "sweep.yaml",
    "Dockerfile",
    ".dockerignore",
    "README.md",
]


@pytest.fixture
def scaffold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Path:
    monkeypatch.chdir(tmp_path)
    assert main(["init", "demo-loop"]) == 0
    return tmp_path / "demo-loop"


def test_init_writes_the_package_the_sweep_the_dockerfile_and_a_readme(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["init", "demo-loop"]) == 0
    out = capsys.readouterr().out
    written = sorted(p.relative_to(tmp_path / "demo-loop").as_posix() for p in (tmp_path / "demo-loop").rglob("*"))
    assert written == sorted([*SCAFFOLD_FILES, "demo_loop"])
    for name in SCAFFOLD_FILES:
        assert f"demo-loop/{name}" in out
    for command in (
        "sweepctl validate -f demo-loop/sweep.yaml",
        "sweepctl run-local -f demo-loop/sweep.yaml",
        "docker build -t demo-loop:0.1.0 demo-loop",
    ):
        assert command in out
    readme = (tmp_path / "demo-loop" / "README.md").read_text()
    assert "sweepctl run-local -f demo-loop/sweep.yaml" in readme and "--code demo-loop" in readme


def test_init_writes_into_an_empty_dir_given_with_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "projects" / "mine"
    target.mkdir(parents=True)
    assert main(["init", "demo-loop", "--dir", str(target)]) == 0
    assert (target / "demo_loop" / "loop.py").is_file() and (target / "sweep.yaml").is_file()
    assert not (tmp_path / "demo-loop").exists()


def test_the_scaffolded_sweep_passes_validate_and_is_sized_for_two_cpus(
    scaffold: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", "-f", str(scaffold / "sweep.yaml")]) == 0
    spec = yaml.safe_load((scaffold / "sweep.yaml").read_text())["spec"]
    assert spec["trainLoop"] == "demo_loop.loop:train_loop"
    assert spec["trial"]["workers"] == 1 and spec["trial"]["resourcesPerWorker"]["gpu"] == 0
    assert spec["tune"]["numSamples"] == 2 and spec["tune"]["maxConcurrentTrials"] in (1, 2)
    assert spec["paramSpace"]["epochs"] <= 3
    assert "warnAfterReports" not in (spec.get("checkpoints") or {})


def project_imports(source: str) -> list[str]:
    """Every import of `source` that reaches this project's packages (a relative import counts: it is not Ray's)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [("." * node.level) + (node.module or "")]
        else:
            continue
        found += [n for n in names if n.startswith(".") or n.partition(".")[0] in PROJECT_PACKAGES]
    return found


def test_the_import_check_finds_project_imports_of_every_form() -> None:
    source = (
        "import torch\nimport ray.train\nfrom sklearn.datasets import load_digits\n"
        "from training_entrypoints.checkpointing import report_epoch\nimport sweep_contracts.constants\n"
        "from . import helpers\ndef f():\n    import sweep_operator\n"
    )
    assert project_imports(source) == [
        "training_entrypoints.checkpointing",
        "sweep_contracts.constants",
        ".",
        "sweep_operator",
    ]


def test_the_scaffolded_loop_imports_nothing_of_this_project(scaffold: Path) -> None:
    for path in sorted((scaffold / "demo_loop").glob("*.py")):
        assert project_imports(path.read_text()) == [], path.name


# --- the loop, run with Ray Train's calls stood in for ----------------------------------------------------------


def load_loop(scaffold: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("scaffolded_demo_loop", scaffold / "demo_loop" / "loop.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class RayTrainStandIn:
    """ray.train's calls a loop makes, for one worker: its rank, the checkpoint to resume from, the reports (each
    checkpoint's files copied while `report` runs, as Ray's synchronous upload does)."""

    def __init__(self, tmp_path: Path, rank: int = 0, world_size: int = 1, resume_from: Path | None = None) -> None:
        self.tmp_path, self.rank, self.world_size, self.resume_from = tmp_path, rank, world_size, resume_from
        self.reports: list[dict[str, Any]] = []
        self.epochs_set: list[int] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import ray.train
        import ray.train.torch
        from torch.utils.data import DataLoader, DistributedSampler

        stand_in = self

        class RecordingSampler(DistributedSampler):  # type: ignore[type-arg]  # torch's generic, unparametrised here
            def set_epoch(self, epoch: int) -> None:
                stand_in.epochs_set.append(epoch)
                super().set_epoch(epoch)

        def prepare_data_loader(loader: DataLoader, add_dist_sampler: bool = True) -> DataLoader:  # type: ignore[type-arg]  # as above
            if not add_dist_sampler:
                return loader
            sampler = RecordingSampler(loader.dataset, num_replicas=self.world_size, rank=self.rank, shuffle=True)
            return DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=sampler)

        context = SimpleNamespace(get_world_rank=lambda: self.rank, get_world_size=lambda: self.world_size)
        monkeypatch.setattr(ray.train, "get_context", lambda: context)
        monkeypatch.setattr(ray.train, "report", self.report)
        monkeypatch.setattr(
            ray.train,
            "get_checkpoint",
            lambda: ray.train.Checkpoint.from_directory(str(self.resume_from)) if self.resume_from else None,
        )
        monkeypatch.setattr(ray.train.torch, "prepare_model", lambda model: model)
        monkeypatch.setattr(ray.train.torch, "prepare_data_loader", prepare_data_loader)

    def report(self, metrics: dict[str, Any], checkpoint: Any = None, **kwargs: Any) -> None:
        kept = None
        if checkpoint is not None:
            kept = self.tmp_path / f"uploaded-{len(self.reports)}"
            shutil.copytree(checkpoint.path, kept)
        self.reports.append({"metrics": dict(metrics), "checkpoint": kept, "kwargs": kwargs})


CONFIG = {"lr": 0.05, "hidden": 16, "epochs": 3, "batch_size": 64, "_sweep": {"trialId": "t0", "runId": "r1"}}


def test_the_scaffolded_loop_reports_every_epoch_with_rank_zero_passing_the_checkpoint_R8(
    scaffold: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ray_train = RayTrainStandIn(tmp_path)
    ray_train.install(monkeypatch)
    load_loop(scaffold).train_loop(dict(CONFIG))
    assert [r["metrics"]["epoch"] for r in ray_train.reports] == [0, 1, 2]
    assert all(r["checkpoint"] is not None and r["kwargs"] == {} for r in ray_train.reports)
    assert all((r["checkpoint"] / "checkpoint.pt").is_file() for r in ray_train.reports)
    assert ray_train.reports[-1]["metrics"]["val_loss"] < ray_train.reports[0]["metrics"]["val_loss"]


def test_the_scaffolded_loop_on_another_rank_reports_as_often_without_a_checkpoint_and_reshuffles_R3_R8(
    scaffold: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ray_train = RayTrainStandIn(tmp_path, rank=1, world_size=2)
    ray_train.install(monkeypatch)
    load_loop(scaffold).train_loop(dict(CONFIG))
    assert [(r["metrics"]["epoch"], r["checkpoint"]) for r in ray_train.reports] == [(0, None), (1, None), (2, None)]
    assert ray_train.epochs_set == [0, 1, 2]


def test_the_scaffolded_loop_resumes_from_the_checkpoint_it_wrote_R7(
    scaffold: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    first = RayTrainStandIn(tmp_path / "first")
    first.install(monkeypatch)
    loop = load_loop(scaffold)
    loop.train_loop(dict(CONFIG, epochs=2))
    saved = first.reports[-1]["checkpoint"]
    loaded: list[dict[str, Any]] = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: loaded.append(real_load(*a, **k)) or loaded[-1])

    resumed = RayTrainStandIn(tmp_path / "resumed", resume_from=saved)
    resumed.install(monkeypatch)
    loop.train_loop(dict(CONFIG, epochs=3))
    assert [r["metrics"]["epoch"] for r in resumed.reports] == [2]  # epochs 0 and 1 are not trained again
    assert [state["epoch"] for state in loaded] == [1]
    assert set(loaded[0]) == {"epoch", "model", "optimizer"}


# --- the Dockerfile, held to the checks of docker/ -------------------------------------------------------------


def resolved_bases(steps: list[Instruction]) -> list[str]:
    """Each FROM with the build arguments declared before it replaced by their defaults (what `docker build` uses
    unless told otherwise); an argument with no default stays unresolved."""
    defaults: dict[str, str] = {}
    bases = []
    for step in steps:
        if step.keyword == "ARG" and "=" in step.arguments:
            key, _, value = step.arguments.partition("=")
            defaults[key.strip()] = value.strip()
        elif step.keyword == "FROM":
            base = step.arguments.split()[0]
            bases.append(re.sub(r"\$\{?(\w+)\}?", lambda m: defaults.get(m.group(1), m.group(0)), base))
    return bases


def assert_pinned_from(steps: list[Instruction]) -> None:
    bases = resolved_bases(steps)
    assert bases, "no FROM"
    for base in bases:
        assert "$" not in base, f"{base}: a build argument with no default"
        assert EXACT.match(base) or DIGEST.match(base), f"{base} is a moving tag; pin an x.y.z release or a digest"


def test_the_pin_check_refuses_a_moving_or_missing_default(tmp_path: Path) -> None:
    for arg in ("ARG TRAIN_IMAGE=trainingsweep-train:latest", "ARG TRAIN_IMAGE", "ARG OTHER=python:3.12.1"):
        dockerfile = tmp_path / "Dockerfile"
        dockerfile.write_text(f"{arg}\nFROM ${{TRAIN_IMAGE}}\nUSER 1000:100\n")
        with pytest.raises(AssertionError):
            assert_pinned_from(instructions(dockerfile))


def test_the_scaffolded_dockerfile_builds_on_a_pinned_training_image_as_a_numeric_non_root_user(
    scaffold: Path,
) -> None:
    steps = instructions(scaffold / "Dockerfile")
    assert_pinned_from(steps)
    assert resolved_bases(steps) == ["trainingsweep-train:0.1.0"]  # the tag docker/Dockerfile.train documents
    assert_runs_as_non_root_numeric_user(steps)


def test_the_scaffolded_dockerfile_copies_the_package_onto_the_pythonpath(scaffold: Path) -> None:
    steps = instructions(scaffold / "Dockerfile")
    (copy,) = arguments_of(steps, "COPY")
    source, destination = [part for part in copy.split() if not part.startswith("--")]
    assert (source, "--chown=1000:100" in copy) == ("demo_loop/", True)
    (env,) = arguments_of(steps, "ENV")
    assert env.startswith(f"PYTHONPATH={destination.rstrip('/').rpartition('/')[0]}")
    rules = [line for line in (scaffold / ".dockerignore").read_text().splitlines() if not line.startswith("#")]
    assert rules[:2] == ["*", f"!{source}"]  # the build context is the package alone


# --- what init refuses -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["Demo", "demo_loop", "-demo", "demo-", "a.b", "d" * 64, ""])
def test_a_name_that_is_not_a_dns_1123_label_is_refused_with_exit_2(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["init", "--", name]) == 2  # `--`: a name starting with '-' reaches the check, not argparse
    assert "NAME" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_target_that_exists_and_is_not_empty_is_refused_naming_the_argument(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo-loop").mkdir()
    (tmp_path / "demo-loop" / "notes.txt").write_text("mine")
    assert main(["init", "demo-loop"]) == 2
    assert "NAME demo-loop: exists and is not empty" in capsys.readouterr().err
    (tmp_path / "taken").write_text("a file")
    assert main(["init", "demo-loop", "--dir", "taken"]) == 2
    assert "--dir taken: exists and is not a directory" in capsys.readouterr().err
    assert main(["init", "other", "--dir", "demo-loop"]) == 2
    assert "--dir demo-loop: exists and is not empty" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["demo-loop", "notes.txt", "taken"]


@pytest.mark.parametrize(
    ("name", "package"),
    [
        ("demo-loop", "demo_loop"),
        ("json", "json_loop"),
        ("torch", "torch_loop"),
        ("3d", "loop_3d"),
        ("class", "loop_class"),
    ],
)
def test_the_package_name_is_importable_and_shadows_no_module(name: str, package: str) -> None:
    assert package_name(name) == package
