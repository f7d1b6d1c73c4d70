"""The framework examples under examples/loops (a Transformers Trainer loop, a Lightning loop): each directory is what
`--code DIR` takes, its sweep.yaml is valid and names a train loop in it, the loop imports nothing of this project and
defers the frameworks' slow imports into the function, and its model and data are made here, never downloaded (this
layer's sockets fail the test)."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from sweep_operator.cli import main as sweepctl

REPO = Path(__file__).resolve().parents[2]
LOOPS = REPO / "examples" / "loops"
EXAMPLES = sorted(p.parent for p in LOOPS.glob("*/sweep.yaml"))
# What a loop written for a TrainingSweep never needs to import.
OURS = ("sweep_operator", "sweep_contracts", "sweep_sandbox", "training_entrypoints")
# Seconds to import: the sweep's driver imports the loop's module to find the function and must not pay for these.
SLOW = ("transformers", "lightning", "pytorch_lightning", "accelerate")


def _train_loop_file(example: Path) -> tuple[Path, str]:
    spec = yaml.safe_load((example / "sweep.yaml").read_text())["spec"]
    module, function = spec["trainLoop"].split(":")
    return example.joinpath(*module.split(".")).with_suffix(".py"), function


def _imports(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """(module, col_offset) of every import: offset 0 is a module-level import."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.col_offset) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module, node.col_offset


def test_both_framework_examples_are_there() -> None:
    assert [p.name for p in EXAMPLES] == ["hf_trainer", "lightning"]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_framework_example_sweep_is_valid_and_names_a_loop_in_its_directory(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert sweepctl(["validate", "-f", str(example / "sweep.yaml")]) == 0, capsys.readouterr().err
    path, function = _train_loop_file(example)
    tree = ast.parse(path.read_text())
    assert function in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, path


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_framework_example_imports_nothing_of_ours_and_its_framework_only_inside_the_loop(example: Path) -> None:
    loop_file, _ = _train_loop_file(example)
    for path in sorted(example.rglob("*.py")):
        for module, offset in _imports(ast.parse(path.read_text())):
            assert module.split(".")[0] not in OURS, f"{path}: imports {module}"
            if path == loop_file and module.split(".")[0] in SLOW:
                assert offset > 0, f"{path}: imports {module} at module level"


@pytest.fixture
def example_on_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for example in EXAMPLES:
        monkeypatch.syspath_prepend(str(example))
    yield
    for name in [m for m in sys.modules if m.split(".")[0] in ("hf_trainer_loop", "lightning_loop")]:
        del sys.modules[name]


@pytest.mark.usefixtures("example_on_path")
def test_transformers_example_builds_a_tiny_bert_from_a_config_on_the_same_data_each_run() -> None:
    import torch
    from hf_trainer_loop import loop

    model = loop.build_model(hidden=16)  # a hub download would open a socket: this layer fails on one
    assert sum(p.numel() for p in model.parameters()) < 100_000
    a, b = loop.synthetic_dataset(8, seed=3), loop.synthetic_dataset(8, seed=3)
    assert len(a) == 8 and all(torch.equal(a[i]["input_ids"], b[i]["input_ids"]) for i in range(8))
    assert not torch.equal(a[0]["input_ids"], loop.synthetic_dataset(8, seed=4)[0]["input_ids"])
    labels = {int(a[i]["labels"]) for i in range(len(a))} | {int(x["labels"]) for x in loop.synthetic_dataset(64, 5)}
    assert labels == {0, 1}
    logits = model(input_ids=a[0]["input_ids"][None], attention_mask=a[0]["attention_mask"][None]).logits
    assert logits.shape == (1, 2)


@pytest.mark.usefixtures("example_on_path")
def test_lightning_example_module_trains_on_the_same_synthetic_data_each_run() -> None:
    import torch
    from lightning_loop.model import TinyClassifier, synthetic_dataset

    a, b = synthetic_dataset(16, seed=1), synthetic_dataset(16, seed=1)
    assert all(torch.equal(x, y) for x, y in zip(a.tensors, b.tensors, strict=True))
    assert set(a.tensors[1].tolist()) == {0, 1}
    model = TinyClassifier(hidden=8, lr=0.1)
    assert model.hparams.hidden == 8 and model(a.tensors[0]).shape == (16, 2)
