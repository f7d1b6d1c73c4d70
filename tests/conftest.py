"""Fixtures for every tier. Servers are started here on 127.0.0.1 and stopped; no other address is used."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
KUBERAY_SCHEMAS = REPO.parent / "shared" / "schemas" / "kuberay"


def pytest_configure(config: pytest.Config) -> None:
    """Each xdist worker chooses the ports it gives servers (chart_admission.free_port) from a block of its own, so
    two workers never pick one port; the block passes to the sandboxes and operators a worker starts as processes."""
    worker = getattr(config, "workerinput", None)
    if worker is None:
        return
    from sweep_sandbox.chart_admission import DEFAULT_PORTS, PORTS_ENV

    low, high = (int(part) for part in DEFAULT_PORTS.split("-"))
    index, count = int(worker["workerid"].removeprefix("gw")), int(worker["workercount"])
    size = (high - low + 1) // count
    os.environ[PORTS_ENV] = f"{low + index * size}-{low + (index + 1) * size - 1}"


@pytest.fixture(scope="session", autouse=True)
def _sandbox_aws_credentials() -> Iterator[None]:
    """Fake credentials and no EC2 metadata lookups: botocore must never leave loopback."""
    from sweep_sandbox.s3server import SANDBOX_CREDENTIALS

    saved = {k: os.environ.get(k) for k in SANDBOX_CREDENTIALS}
    os.environ.update(SANDBOX_CREDENTIALS)
    for var in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        os.environ.pop(var, None)
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def s3_server() -> Iterator[Any]:
    """A moto S3 server on 127.0.0.1 (integration and e2e tiers only)."""
    from sweep_sandbox.s3server import S3Server

    with S3Server() as server:
        yield server


@pytest.fixture
def s3_client(s3_server: Any) -> Any:
    return s3_server.client()


@pytest.fixture
def s3_bucket(s3_client: Any) -> str:
    """A fresh, empty bucket for one test."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=name)
    return name


# ------------------------------------------------------------------------------------------- collected counts
LAYERS = ("unit", "integration", "e2e")
# Options that run a chosen part of a layer: with any of them the floors below do not apply.
_SELECTING = ("keyword", "markexpr", "lf", "deselect", "stepwise", "ignore", "ignore_glob")
_SHORT = pytest.StashKey[list[str]]()  # the layers that collected fewer tests than their floor


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "min_tests",
        "'<layer> <count>' lines: a run of a whole tests/<layer> that collects fewer tests fails",
        type="linelist",
        default=[],
    )


def _whole_layers(config: pytest.Config) -> list[str]:
    """The layers this run asked for whole (tests/, or tests/<layer>, with nothing deselecting a part of them)."""
    if any(config.getoption(name, None) for name in _SELECTING):
        return []
    tests, asked = Path(__file__).resolve().parent, []
    for arg in config.args:
        if "::" in arg:
            continue
        path = (config.invocation_params.dir / arg).resolve()
        if path == tests:
            asked += LAYERS
        elif path.parent == tests and path.name in LAYERS:
            asked.append(path.name)
    return asked


def _short_layers(config: pytest.Config, nodeids: list[str]) -> list[str]:
    floors = {layer: 1 for layer in LAYERS}  # every layer asked for collects something
    for line in config.getini("min_tests"):
        layer, count = line.split()
        floors[layer] = int(count)
    rootdir, tests = config.rootpath, Path(__file__).resolve().parent
    prefixes = {layer: (tests / layer).relative_to(rootdir).as_posix() + "/" for layer in LAYERS}
    found = {layer: sum(1 for n in nodeids if n.startswith(prefixes[layer])) for layer in LAYERS}
    return [
        f"tests/{layer}: {found[layer]} collected, fewer than {floors[layer]} (min_tests in pyproject.toml; a merge of "
        "tests lowers it and names what it merged)"
        for layer in _whole_layers(config)
        if found[layer] < floors[layer]
    ]


def pytest_collection_finish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):  # an xdist worker: its controller counts (below)
        return
    if not session.config.pluginmanager.hasplugin("dsession"):
        session.config.stash[_SHORT] = _short_layers(session.config, [item.nodeid for item in session.items])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    config = node.config
    config.stash[_SHORT] = _short_layers(config, list(ids))


# ------------------------------------------------------------------------------------------- order
# The longest files (docs/testing.md has their last measured times) start first, so that on the xdist workers the
# many short files fill in around them instead of one long file running alone at the end. Only the order changes;
# xdist keeps it with --no-loadscope-reorder (by default it sorts files by their number of tests).
RUN_FIRST = (
    "e2e/test_sandbox_resume.py",
    "e2e/test_pbt.py",
    "e2e/test_sandbox.py",
    "e2e/test_sandbox_framework_loops.py",
    "e2e/test_your_training_loop.py",
    "e2e/test_entrypoints_sweep.py",
    "e2e/test_tracking_mlflow.py",
    "e2e/test_sandbox_your_loop.py",
    "e2e/test_entrypoints_ranks.py",
    "e2e/test_entrypoints_run_local.py",
    "e2e/test_entrypoints_trial_stop.py",
    # The shortest e2e files last, so the three workers end together instead of on a minute-long file.
    "e2e/test_entrypoints_graceful_stop.py",
    "e2e/test_entrypoints_driver_input.py",
    "e2e/test_sandbox_gpu_ledger.py",
    "integration/test_operator_faults.py",
    "integration/test_guard_matrix.py",
    "integration/test_idle_gpus.py",
    "integration/test_metrics.py",
    "integration/test_operator_gpu_ledger.py",
    "integration/test_operator_budget.py",
    "integration/test_operator_resume.py",
    "integration/test_operator.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = Path(__file__).resolve().parent

    def rank(item: pytest.Item) -> tuple[int, int]:
        relative = item.path.resolve().relative_to(tests).as_posix()
        layer = relative.split("/")[0]
        first = RUN_FIRST.index(relative) if relative in RUN_FIRST else len(RUN_FIRST)
        # Then e2e, integration, unit: a unit file takes seconds, the right size to fill the last gaps.
        return first, -LAYERS.index(layer) if layer in LAYERS else 0

    items[:] = sorted(items, key=rank)  # stable: the tests of one file keep their order


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Collecting no test is a failure here, never a silent success (pytest's exit code 5 becomes 1); so is a whole
    layer collecting fewer tests than its floor (a test file that silently stopped being collected)."""
    short = session.config.stash.get(_SHORT, [])
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED or short:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for line in short:
        if reporter is not None:
            reporter.write_line(f"FAILED collection: {line}", red=True, bold=True)
