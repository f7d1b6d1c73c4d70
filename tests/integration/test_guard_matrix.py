"""The checkpoint guard's fault matrix (R22), through the whole operator on loopback: kopf, the KubeRay stand-in,
the API emulator, moto S3 and the real verifier.

Rows are the ways a run's objects get deleted; columns are what S3 holds (or how it fails) at that moment. Every
cell asserts that verification actually ran and what it saw, that the object is released only once the run
verifies, and that the operator never deleted anything under the run root. Cells run concurrently: each has its
own sweep and its own S3 endpoint name, which the test routes to moto, to a server answering 503, or to a closed
port, and "repairs" by routing it back to moto. The deadline row runs on its own operator whose clock the test
moves past the deadline once every cell of the row is broken: no wall-clock window a busy machine can miss.
"""

from __future__ import annotations

import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from sweep_contracts import constants
from sweep_operator.s3 import S3ClientConfig, make_s3_client
from sweep_sandbox.kuberay import Outcome
from tests.support.operator_env import TIMEOUT, OperatorEnv, start_operator_env
from tests.support.s3_fault_server import FaultyS3Server
from tests.support.sweep_factory import SyntheticSweep, write_sweep
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

# The 40 cells wait concurrently in this process, beside the emulator, the stand-in and the operator: polling at
# the helpers' default (20 ms) made the cells' own reads most of the load and starved the guard's re-checks on a
# busy machine. A quarter second is far below every backoff and deadline asserted here.
POLL = 0.25

ROWS = ("delete-sweep", "delete-rayjob", "kuberay-deletes-cluster", "retry-then-delete")
DEADLINE_ROW = "deadline-stop"
# The deadline row's budget: no real clock reaches it (nor KubeRay's activeDeadlineSeconds, nor the startup window);
# the operator's clock is moved past it and its graceful window (ShiftedClock).
DEADLINE_S, STARTUP_S, GRACE_S = 3600, 1800, 2
COLUMNS = (
    "complete",
    "file-missing",
    "file-truncated",
    "manifest-missing",
    "trial-dir-missing",
    "s3-5xx",
    "s3-unreachable",
    "forged-progress",
)
# What the verifier must report in each broken column (a problem kind of sweep_operator.verification).
EXPECTED_KIND = {
    "file-missing": "missing-file",
    "file-truncated": "size-mismatch",
    "manifest-missing": "missing-manifest",
    "trial-dir-missing": "missing-trial",
    "s3-5xx": "s3-error",
    "s3-unreachable": "s3-error",
    "forged-progress": "missing-file",
}
# The record kopf's on.delete handlers kept (kopf/_cogs/configs/progress.py, AnnotationsProgressStorage) and the
# previous operator trusted: a tenant writes "done" on the held object (issue 25, defect 1).
FORGED_PROGRESS = '{"started":"2026-12-01T00:00:00.000000+00:00","purpose":"delete","retries":1,"success":true}'
HANDLER_OF = {"TrainingSweep": "sweep_deleted", "RayJob": "rayjob_deleted", "RayCluster": "raycluster_deleted"}
MUTATING = frozenset({"delete_object", "delete_objects", "put_object", "copy_object", "upload_file", "upload_fileobj"})


@dataclass
class Seen:
    """One verification the operator ran: what it was asked and what it found."""

    root: str
    verified: bool
    checked: int
    kinds: frozenset[str]
    started: float


@dataclass
class Router:
    """The operator's S3 client factory: each cell's endpoint name maps to moto, a 503 server or a closed port.
    Every client records the S3 operations the operator called on it."""

    healthy_url: str
    failing_url: str
    closed_url: str
    broken: dict[str, str] = field(default_factory=dict)  # endpoint -> "s3-5xx" | "s3-unreachable"
    calls: list[tuple[str, str]] = field(default_factory=list)
    _clients: dict[tuple[str, str], Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, endpoint: str, region: str) -> Any:
        mode = self.broken.get(endpoint, "healthy")
        url = {"healthy": self.healthy_url, "s3-5xx": self.failing_url, "s3-unreachable": self.closed_url}[mode]
        with self._lock:
            key = (url, region)
            if key not in self._clients:
                self._clients[key] = make_s3_client(
                    S3ClientConfig(endpoint_url=url, region=region or "us-east-1", max_attempts=1)
                )
            return _Recording(self._clients[key], endpoint, self.calls)


class _Recording:
    def __init__(self, client: Any, endpoint: str, calls: list[tuple[str, str]]) -> None:
        self._client, self._endpoint, self._calls = client, endpoint, calls

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if callable(attr):
            self._calls.append((self._endpoint, name))
        return attr


@dataclass
class ShiftedClock:
    """The deadline row's operator clock: the wall clock plus an offset the test moves forward, so the sweeps'
    deadlines pass when the test says so (the controller takes its clock injected)."""

    offset: float = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


Matrix = tuple[OperatorEnv, Router, list[Seen]]


@contextmanager
def _matrix_env(s3_server: Any, clock: ShiftedClock | None = None) -> Iterator[Matrix]:
    # A bound socket that never listens refuses every connection, and holding it keeps the port from being
    # handed to another server (another xdist worker's) while the cells run.
    with (
        FaultyS3Server(503, "ServiceUnavailable", "S3 is answering 5xx (injected)") as faulty,
        socket.socket() as closed,
    ):
        closed.bind(("127.0.0.1", 0))
        env, stop = start_operator_env(s3_server)
        env.poll = POLL
        router = Router(s3_server.endpoint_url, faulty.endpoint_url, f"http://127.0.0.1:{closed.getsockname()[1]}")
        seen: list[Seen] = []
        controller = env.operator.controller
        real_verify = controller.verify

        def spy(client: Any, root: str, **kwargs: Any) -> Any:
            started = time.monotonic()
            result = real_verify(client, root, **kwargs)
            seen.append(
                Seen(root, result.verified, result.checked, frozenset(p.kind for p in result.problems), started)
            )
            return result

        controller.verify = spy
        controller.s3_client_for = router
        if clock is not None:
            controller.clock = clock  # before any sweep exists: every decision of this operator reads it
        try:
            yield env, router, seen
        finally:
            stop()


@pytest.fixture(scope="module")
def matrix(s3_server: Any) -> Iterator[Matrix]:
    with _matrix_env(s3_server) as built:
        yield built


@pytest.fixture
def deadline_matrix(s3_server: Any) -> Iterator[tuple[Matrix, ShiftedClock]]:
    clock = ShiftedClock()
    with _matrix_env(s3_server, clock) as built:
        yield built, clock


@dataclass
class Cell:
    row: str
    column: str
    env: OperatorEnv
    router: Router
    seen: list[Seen]
    index: int
    name: str = ""
    endpoint: str = ""
    synthetic: SyntheticSweep | None = None
    root: str = ""
    # The deadline row: waits until every cell of the row is broken and Running, then the clock passes the deadline.
    pass_deadline: Callable[[], object] = lambda: None

    def verifications(self, since: float = 0.0) -> list[Seen]:
        """Verifications of this cell's run that started at or after `since` (so saw what was there then)."""
        return [s for s in list(self.seen) if s.root == self.root and s.started >= since]

    def listing(self) -> dict[str, int]:
        assert self.synthetic is not None
        bucket, prefix = self.synthetic.bucket, self.root.split("/", 3)[3]
        pages = self.env.s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
        return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", [])}


def _apply(cell: Cell) -> None:
    env = cell.env
    cell.endpoint = f"http://127.0.0.1:{20000 + cell.index}"  # a name the router maps; never dialled as such
    changes: dict[str, Any] = {"spec__storage__endpointUrl": cell.endpoint}
    outcomes: tuple[Outcome, ...] = (Outcome.hang(),)
    # The rows where KubeRay acts on a job's end: the attempt runs until the test ends it (`_end_attempt`), after
    # the run is broken, so no timer races the break on a busy machine.
    if cell.row == "kuberay-deletes-cluster":
        outcomes = (Outcome.succeed(3600.0),)
    elif cell.row == DEADLINE_ROW:
        changes["spec__deadlines"] = {
            "activeSeconds": DEADLINE_S,
            "startupSeconds": STARTUP_S,
            "gracefulStopSeconds": GRACE_S,
        }
    elif cell.row == "retry-then-delete":
        changes["spec__failurePolicy__jobRetries"] = 1
        outcomes = (Outcome.fail(3600.0), Outcome.hang())
    doc = env.new_sweep(f"m{cell.index:02d}", **changes)
    cell.name = doc["metadata"]["name"]
    env.runner.script(cell.name, *outcomes)
    env.apply(doc)
    bucket, prefix = env.run_root(cell.name)
    cell.root = f"s3://{bucket}/{prefix}"
    cell.synthetic = write_sweep(env.s3_client, bucket, prefix, trials=2, checkpoints=2, files=2)
    if cell.row == DEADLINE_ROW:
        env.report_trials_running(bucket, prefix)  # the startup clock stops: the deadline, not the startup, ends it


def _break(cell: Cell) -> str:
    """Put the run into the cell's column; returns the key the verifier must name (or "")."""
    synthetic = cell.synthetic
    assert synthetic is not None
    if cell.column in ("file-missing", "forged-progress"):
        return synthetic.delete_file()
    if cell.column == "file-truncated":
        return synthetic.truncate_file()
    if cell.column == "manifest-missing":
        return synthetic.delete_manifest()
    if cell.column == "trial-dir-missing":
        prefix = synthetic.trial_prefix(synthetic.trials[-1])
        for key in [k for k in cell.listing() if k.startswith(prefix)]:
            cell.env.s3_client.delete_object(Bucket=synthetic.bucket, Key=key)
        return prefix
    if cell.column in ("s3-5xx", "s3-unreachable"):
        cell.router.broken[cell.endpoint] = cell.column
    return ""


def _repair(cell: Cell) -> None:
    cell.router.broken.pop(cell.endpoint, None)
    if cell.column not in ("complete", "s3-5xx", "s3-unreachable"):
        bucket, prefix = cell.synthetic.bucket, cell.root.split("/", 3)[3]
        cell.synthetic = write_sweep(cell.env.s3_client, bucket, prefix, trials=2, checkpoints=2, files=2)


def _end_attempt(cell: Cell, rayjob: str, outcome: Outcome) -> None:
    """End the RayJob's running scripted attempt now with `outcome`, and touch the RayJob so the stand-in (which
    re-polls a long run only on an event) looks again."""
    env = cell.env
    for run in list(env.runner.runs):
        if run.rayjob_key == ("default", rayjob) and not run.stopped:
            run.outcome = outcome
    env.patch_ray(
        constants.RAYJOB_PLURAL, rayjob, {"metadata": {"annotations": {"test.sweeps.dev/nudge": str(time.monotonic())}}}
    )


def _held_object(cell: Cell) -> tuple[str, Callable[[], dict[str, Any] | None]]:
    """Trigger the row's deletion; returns (what is held, a reader of it)."""
    env, name = cell.env, cell.name
    if cell.row == "delete-sweep":
        env.wait_phase(name, "Running", timeout=TIMEOUT * 2)
        env.delete_sweep(name)
        return "TrainingSweep", lambda: env.sweep(name)
    if cell.row == "delete-rayjob":
        rayjob = env.wait_phase(name, "Running", timeout=TIMEOUT * 2)["rayJobName"]
        env.delete_ray(constants.RAYJOB_PLURAL, rayjob)
        return "RayJob", lambda: env.get(constants.RAYJOB_PLURAL, rayjob)
    if cell.row == "kuberay-deletes-cluster":  # shutdownAfterJobFinishes + ttlSecondsAfterFinished: KubeRay deletes it
        status = env.wait_phase(name, "Running", timeout=TIMEOUT * 2)
        cluster = status["rayClusterName"]
        _end_attempt(cell, status["rayJobName"], Outcome.succeed(0.0))
        return "RayCluster", lambda: env.get(constants.RAYCLUSTER_PLURAL, cluster)
    if cell.row == DEADLINE_ROW:
        # The operator deletes the RayJob once the sweep's deadline and graceful window passed on its clock, which
        # the test moves there once the row's runs are all Running and broken. (KubeRay's activeDeadlineSeconds runs
        # on the wall clock and is an hour away; the RayCluster is held if the RayJob's end takes it first.)
        status = env.wait_status(
            name, lambda s: s.get("rayClusterName") and s.get("phase") == "Running", "Running", timeout=TIMEOUT * 2
        )
        rayjob, cluster = status["rayJobName"], status["rayClusterName"]
        cell.pass_deadline()
        readers = {
            "RayJob": lambda: env.get(constants.RAYJOB_PLURAL, rayjob),
            "RayCluster": lambda: env.get(constants.RAYCLUSTER_PLURAL, cluster),
        }

        def deleting(read: Callable[[], dict[str, Any] | None]) -> bool:
            obj = read()
            return obj is None or bool(obj["metadata"].get("deletionTimestamp"))  # gone: deleted and released

        first = wait_for(
            lambda: next((k for k, read in readers.items() if deleting(read)), None),
            TIMEOUT * 2,
            interval=POLL,
            what=f"{name}: a deadline deleting the RayJob or its cluster",
        )
        # ... and by the deadline: the operator's own reason, not a startup window or a KubeRay deadline.
        env.wait_status(
            name,
            lambda s: any(
                c["type"] == "DeadlineExceeded" and c["status"] == "True" and c["reason"] == "SweepDeadline"
                for c in s.get("conditions") or []
            ),
            "DeadlineExceeded=True (SweepDeadline)",
        )
        return first, readers[first]
    # retry-then-delete: the first attempt fails; KubeRay deletes its cluster to retry (the guard holds it until the
    # run verifies), the counters move, and then the user deletes the RayJob, whose jobStatus was reset.
    status = env.wait_phase(name, "Running", timeout=TIMEOUT * 2)
    first_cluster, rayjob = status["rayClusterName"], status["rayJobName"]
    _end_attempt(cell, rayjob, Outcome.fail(0.0))
    wait_for(
        lambda: int(((env.get(constants.RAYJOB_PLURAL, rayjob) or {}).get("status") or {}).get("failed") or 0) >= 1,
        TIMEOUT,
        interval=POLL,
        what=f"{name}: the first attempt failed",
    )
    if cell.column != "complete":
        wait_for(
            lambda: ((env.get(constants.RAYCLUSTER_PLURAL, first_cluster) or {}).get("metadata") or {}).get(
                "deletionTimestamp"
            ),
            TIMEOUT,
            interval=POLL,
            what=f"{name}: KubeRay deleting the failed attempt's cluster",
        )
    env.delete_ray(constants.RAYJOB_PLURAL, rayjob)
    return "RayJob", lambda: env.get(constants.RAYJOB_PLURAL, rayjob)


def _forge_progress(cell: Cell, kind: str, obj: dict[str, Any] | None) -> None:
    """Write kopf's "done" record for the guard's deletion handler on the held object, as a tenant could."""
    assert obj is not None
    key = f"{constants.GROUP}/build_registry._locals_.{HANDLER_OF[kind]}"
    patch = {"metadata": {"annotations": {key: FORGED_PROGRESS}}}
    name = obj["metadata"]["name"]
    if kind == "TrainingSweep":
        cell.env.custom.patch_namespaced_custom_object(
            constants.GROUP, constants.VERSION, "default", constants.PLURAL, name, patch
        )
    else:
        plural = constants.RAYJOB_PLURAL if kind == "RayJob" else constants.RAYCLUSTER_PLURAL
        cell.env.custom.patch_namespaced_custom_object(
            constants.RAY_GROUP, constants.RAY_VERSION_API, "default", plural, name, patch
        )


def _run_cell(cell: Cell) -> None:
    _apply(cell)
    env = cell.env
    before = cell.listing()
    key = _break(cell)
    broken_at = time.monotonic()
    after_break = cell.listing()
    assert not cell.verifications(), f"{cell.name}: the row's deletion came before the run was broken (a slow machine)"
    kind, held = _held_object(cell)
    if cell.column == "complete":
        wait_for(lambda: held() is None, TIMEOUT * 2, interval=POLL, what=f"{cell.name}: {kind} released")
        good = [s for s in cell.verifications() if s.verified and s.checked == 4]
        assert good, f"released without a verification that saw the 4 checkpoints: {cell.verifications()}"
    else:
        expected = EXPECTED_KIND[cell.column]
        wait_for(
            lambda: (held() or {}).get("metadata", {}).get("deletionTimestamp"),
            TIMEOUT * 2,
            interval=POLL,
            what=f"{cell.name}: {kind} being deleted",
        )
        if cell.column == "forged-progress":
            _forge_progress(cell, kind, held())
        # "Still held" is judged after two re-checks that saw the problem, not after a sleep.
        wait_for(
            lambda: len([s for s in cell.verifications(broken_at) if expected in s.kinds and not s.verified]) >= 2,
            TIMEOUT * 2,
            interval=POLL,
            what=f"{cell.name}: two verifications reporting {expected}",
        )
        assert held() is not None, f"{kind} released while the run reports {expected}"
        for s in cell.verifications(broken_at):
            assert not s.verified, f"a verification passed while the run was broken: {s}"
        env.wait_status(
            cell.name,
            lambda s: any(
                c["type"] == "CheckpointsVerified"
                and c["status"] == "False"
                and (not key or key.split("/")[-1] in c["message"] or expected in c["message"])
                for c in s.get("conditions") or []
            ),
            f"CheckpointsVerified=False naming {expected}",
        )
        _repair(cell)
        wait_for(lambda: held() is None, TIMEOUT, interval=POLL, what=f"{cell.name}: {kind} released after the repair")
        assert any(s.verified and s.checked == 4 for s in cell.verifications(broken_at)), "released by a verified check"
    # Nothing under the run root was deleted or written by the operator (the repair rewrote what the test broke).
    mutations = [c for c in cell.router.calls if c[0] == cell.endpoint and c[1] in MUTATING]
    assert not mutations, f"the operator changed S3: {mutations}"
    after = cell.listing()
    assert set(after_break) <= set(after), f"objects vanished: {sorted(set(after_break) - set(after))}"
    if cell.column == "complete":
        assert after == before


def _run_cells(matrix: Matrix, rows: tuple[str, ...], barrier: threading.Barrier | None = None) -> None:
    """Every row x column cell, concurrently; a table of the failing cells on failure."""
    env, router, seen = matrix
    cells = [
        Cell(row, column, env, router, seen, i) for i, (row, column) in enumerate((r, c) for r in rows for c in COLUMNS)
    ]
    if barrier is not None:
        for cell in cells:
            cell.pass_deadline = lambda: barrier.wait(timeout=TIMEOUT * 4)
    failures: dict[tuple[str, str], str] = {}

    def run(cell: Cell) -> None:
        try:
            _run_cell(cell)
        except BaseException as exc:  # collected: one cell's failure must not hide the others
            failures[(cell.row, cell.column)] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"
            if barrier is not None:
                barrier.abort()  # the row's other cells stop waiting for this one
        finally:
            env.runner.script(cell.name or f"m{cell.index:02d}", Outcome.succeed())

    with ThreadPoolExecutor(max_workers=len(cells)) as pool:
        list(pool.map(run, cells))
    assert not failures, "\n".join(f"[{r} x {c}] {text}" for (r, c), text in sorted(failures.items()))
    assert len(seen) >= len(cells), "every cell ran the verifier"
    assert not env.pruned(), f"writes whose fields a real API server would drop: {env.pruned()[:10]}"


def test_guard_fault_matrix(matrix: Matrix) -> None:
    """R22: every row x column cell (issue 12's matrix) but the deadline row's; a table of the failing cells."""
    _run_cells(matrix, ROWS)


def test_guard_fault_matrix_deadline_row(deadline_matrix: tuple[Matrix, ShiftedClock]) -> None:
    """R22, the deadline row: each column's run broken, then the sweeps' deadline and graceful window pass on the
    operator's clock; the RayJob deleted at the deadline is held until the run verifies."""
    matrix, clock = deadline_matrix

    def past_the_deadline() -> None:
        clock.offset = DEADLINE_S + GRACE_S + 60.0

    _run_cells(matrix, (DEADLINE_ROW,), threading.Barrier(len(COLUMNS), action=past_the_deadline))
