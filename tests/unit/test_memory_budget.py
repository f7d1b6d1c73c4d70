"""What a tenant's code writes into its run root cannot crash or bloat the operator: status and result documents read
and parsed within bounds (a Warning Event for a poll, a hold for the guard), Tune's experiment states under a counted
and byte-bounded budget that stops with the verification, and the listing and every share sized from the pod's memory
limit (memory_budget.py)."""

from __future__ import annotations

import json
import threading
import time
import tracemalloc
from dataclasses import dataclass
from typing import Any

import pytest

from sweep_contracts import s3_layout
from sweep_operator import verification as v
from sweep_operator.memory_budget import (
    MAX_EXPERIMENT_STATE_FILES,
    RUN_RECORD_BOUNDS,
    MemoryBudget,
    MiB,
    VerificationBudget,
)
from sweep_operator.reconcile.controller import SweepController
from sweep_operator.reconcile.guard import GuardTarget
from sweep_operator.reconcile.reads import run_documents
from sweep_operator.settings import Settings, SettingsError
from sweep_operator.verification import verify_sweep_checkpoints
from tests.support.factories import cpu_sweep
from tests.support.fake_kube import FakeKube
from tests.support.fake_s3 import FakeS3
from tests.support.fakes import Clock, FakeVerifier
from tests.support.sweep_factory import SyntheticSweep, tune_experiment_state, write_sweep
from tests.support.waiting import wait_for

BUCKET = "bucket"


def nested_empty_lists(size: int, wrapped: bool = True) -> bytes:
    """A JSON object of `size` bytes holding a list of empty lists: valid, small on the wire, ~21 times its size
    parsed (16 MiB of it took 360 MiB)."""
    count = (size - 64) // 3
    body = b"[" + b"[]," * count + b"[]]"
    return b'{"trials": {"total": 1, "running": 1}, "junk": ' + body + b"}" if wrapped else body


# ------------------------------------------------------------------------------------------------- progress polls


@dataclass
class World:
    kube: FakeKube
    s3: FakeS3
    events: list[tuple[str, str, str, str]]
    controller: SweepController

    def reconcile(self, name: str) -> dict[str, Any]:
        sweep = self.kube.get_sweep("ml", name)
        assert sweep is not None
        self.kube.ensure_finalizer(sweep)
        for (kind, _, _), obj in list(self.kube.objects.items()):
            if kind == "RayJob":
                self.controller.observe_rayjob(obj)
        self.controller.reconcile_sweep(self.kube.get_sweep("ml", name))
        return (self.kube.get_sweep("ml", name) or {}).get("status") or {}

    def warnings(self, reason: str) -> list[str]:
        return [message for _, type_, r, message in self.events if type_ == "Warning" and r == reason]


@pytest.fixture
def world() -> World:
    kube, s3, events = FakeKube(), FakeS3(), list[tuple[str, str, str, str]]()
    s3.create_bucket(Bucket=BUCKET)
    controller = SweepController(
        Settings(
            status_poll_seconds=0,
            progress_mirror_seconds=0,
            s3_endpoint_url="https://s3.example",
            s3_region="eu-west-1",
        ),
        kube,  # type: ignore[arg-type]  # FakeKube is KubeApi's duck-typed double
        lambda endpoint, region: s3,
        lambda body, type_, reason, message: events.append((body["metadata"]["name"], type_, reason, message)),
        verifier=FakeVerifier(),
        clock=Clock(),
    )
    return World(kube, s3, events, controller)


def running_sweep(world: World, name: str) -> str:
    """A running sweep; returns the key of its `_sweep/status.json`."""
    doc = cpu_sweep(name=name, namespace="ml")
    doc["metadata"]["creationTimestamp"] = "2026-12-02T12:00:00Z"
    world.kube.add("TrainingSweep", doc)
    status = world.reconcile(name)
    world.kube.set_rayjob_status(status["rayJobName"], "ml", jobDeploymentStatus="Running", jobStatus="RUNNING")
    return f"sweeps/ml/{name}-{status['runId']}/_sweep/status.json"


def test_a_status_document_of_nested_empty_lists_is_not_parsed_and_the_sweep_is_told_once(world: World) -> None:
    """Within the byte cap but past the element bound: found by counting, not by parsing (parsed, these 500 KiB take
    ~11 MiB), a Warning Event on the sweep names the document and the bound, once while it stays over; progress is
    read again once the document is back within its bounds."""
    key = running_sweep(world, "hostile")
    hostile = nested_empty_lists(500 * 1024)
    assert len(hostile) <= RUN_RECORD_BOUNDS.max_bytes
    world.s3.put_object(Bucket=BUCKET, Key=key, Body=hostile)
    tracemalloc.start()
    try:
        world.reconcile("hostile")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 5 * MiB, f"{peak / MiB:.1f} MiB: the document was parsed"
    (message,) = world.warnings("RunDocumentTooLarge")
    assert f"s3://{BUCKET}/{key}" in message and f"more than {RUN_RECORD_BOUNDS.max_elements} JSON elements" in message
    world.reconcile("hostile")
    assert len(world.warnings("RunDocumentTooLarge")) == 1, "said once while it stays over"

    world.s3.put_object(Bucket=BUCKET, Key=key, Body=json.dumps({"trials": {"total": 3, "running": 2}}).encode())
    assert "2 running" in world.reconcile("hostile")["trialsSummary"]
    world.s3.put_object(Bucket=BUCKET, Key=key, Body=b'{"x": ' + b"[" * 40 + b"]" * 40 + b"}")
    world.reconcile("hostile")
    assert "nested more than 32 levels deep" in world.warnings("RunDocumentTooLarge")[-1]


def test_a_status_document_over_the_byte_cap_is_not_read_and_the_sweep_is_told(world: World) -> None:
    key = running_sweep(world, "big")
    world.s3.put_object(Bucket=BUCKET, Key=key, Body=b'{"pad": "' + b"x" * (600 * 1024) + b'"}')
    world.reconcile("big")
    (message,) = world.warnings("RunDocumentTooLarge")
    assert f"more than the {RUN_RECORD_BOUNDS.max_bytes} the operator reads of it" in message
    assert "docs/guard.md" in message


def test_the_guard_cannot_read_an_oversized_status_or_result_and_so_holds() -> None:
    """run_documents (the guard's and `sweepctl release`'s read) calls one over its bounds unreadable."""
    s3 = FakeS3()
    s3.create_bucket(Bucket=BUCKET)
    root = f"s3://{BUCKET}/sweeps/ml/s-abc"
    s3.put_object(Bucket=BUCKET, Key="sweeps/ml/s-abc/_sweep/status.json", Body=nested_empty_lists(400 * 1024))
    progress, final, readable = run_documents(s3, GuardTarget(root, "", ""))
    assert (progress, final, readable) == (None, None, False)
    s3.put_object(Bucket=BUCKET, Key="sweeps/ml/s-abc/_sweep/status.json", Body=b'{"trials": {"total": 1}}')
    assert run_documents(s3, GuardTarget(root, "", "")) == ({"trials": {"total": 1}}, None, True)


# ------------------------------------------------------------------------------------------------- the verifier


@pytest.fixture
def s3() -> FakeS3:
    fake = FakeS3(versioning={BUCKET: "Enabled"})
    fake.create_bucket(Bucket=BUCKET)
    return fake


@pytest.fixture
def sweep(s3: FakeS3) -> SyntheticSweep:
    return write_sweep(s3, BUCKET, trials=2, checkpoints=1, files=2, file_size=16)


@pytest.mark.parametrize("document", [s3_layout.STATUS_KEY, s3_layout.RESULT_KEY])
def test_a_status_or_result_over_its_bounds_is_a_finding_naming_it_and_the_bound(
    s3: FakeS3, sweep: SyntheticSweep, document: str
) -> None:
    """Valid JSON the old reader parsed whole (and verified): the guard now holds, naming the document and the bound."""
    key = sweep.root.join(document).key
    s3.put_object(Bucket=BUCKET, Key=key, Body=nested_empty_lists(400 * 1024))
    result = verify_sweep_checkpoints(s3, sweep.root_uri)
    assert not result.verified
    (problem,) = [p for p in result.problems if p.kind == v.OVER_BUDGET]
    assert problem.key == key and f"more than {RUN_RECORD_BOUNDS.max_elements} JSON elements" in problem.detail


def put_states(s3: FakeS3, sweep: SyntheticSweep, count: int, pad: int = 0) -> list[str]:
    """`count` of Tune's experiment states, each naming every trial's checkpoint (valid), padded to `pad` bytes."""
    keys = []
    for i in range(count):
        state = tune_experiment_state(
            {t: s3_layout.strip_scheme(sweep.checkpoint_uri(t, sweep.checkpoints[t][-1])) for t in sweep.trials}
        )
        state["stats"] = {"pad": "x" * pad}
        key = sweep.root.join(s3_layout.TUNE_EXPERIMENT_NAME, f"experiment_state-2026-12-02_10-{i:02d}-00.json").key
        s3.put_object(Bucket=BUCKET, Key=key, Body=json.dumps(state).encode())
        keys.append(key)
    return keys


def test_more_experiment_states_than_the_budget_counts_hold_without_reading_them(
    s3: FakeS3, sweep: SyntheticSweep
) -> None:
    put_states(s3, sweep, MAX_EXPERIMENT_STATE_FILES + 1)
    s3.calls.clear()
    result = verify_sweep_checkpoints(s3, sweep.root_uri)
    assert not result.verified
    (problem,) = result.problems
    assert problem.kind == v.OVER_BUDGET and problem.key.endswith("tune/experiment_state-*.json")
    assert f"reads at most {MAX_EXPERIMENT_STATE_FILES}" in problem.detail
    assert not [c for c in s3.calls if c[0] == "get_object" and "experiment_state-" in str(c)], "none was read"


def test_experiment_states_past_the_byte_budget_hold_naming_it(s3: FakeS3, sweep: SyntheticSweep) -> None:
    put_states(s3, sweep, 3, pad=300 * 1024)
    budget = VerificationBudget(listing_bytes=8 * MiB, experiment_state_files=64, experiment_state_bytes=800 * 1024)
    result = verify_sweep_checkpoints(s3, sweep.root_uri, budget=budget)
    assert not result.verified
    (problem,) = result.problems
    assert problem.kind == v.OVER_BUDGET and f"more than {800 * 1024} bytes" in problem.detail
    # Within the budget the same states verify: the bound is what holds, not the states.
    roomy = VerificationBudget(listing_bytes=8 * MiB, experiment_state_files=64, experiment_state_bytes=2 * MiB)
    assert verify_sweep_checkpoints(s3, sweep.root_uri, budget=roomy).verified


def test_a_trial_record_nested_in_an_experiment_state_is_bounded_too(s3: FakeS3, sweep: SyntheticSweep) -> None:
    """Tune nests each trial's records as JSON strings: a row of nested lists is counted before it is parsed."""
    (key,) = put_states(s3, sweep, 1)
    state = json.loads(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    state["trial_data"][0][1] = nested_empty_lists(300 * 1024, wrapped=False).decode()
    s3.put_object(Bucket=BUCKET, Key=key, Body=json.dumps(state).encode())
    budget = VerificationBudget(listing_bytes=8 * MiB, experiment_state_files=64, experiment_state_bytes=1 * MiB)
    result = verify_sweep_checkpoints(s3, sweep.root_uri, budget=budget)
    (problem,) = result.problems
    assert problem.kind == v.OVER_BUDGET and problem.key == key and "a trial's record" in problem.detail


class SlowStates:
    """S3 whose experiment states each take `delay` to read; counts the reads."""

    def __init__(self, inner: FakeS3, delay: float) -> None:
        self.inner, self.delay, self.state_reads = inner, delay, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def get_object(self, **kwargs: Any) -> Any:
        if "experiment_state-" in kwargs["Key"]:
            self.state_reads += 1
            time.sleep(self.delay)
        return self.inner.get_object(**kwargs)


def test_experiment_state_reads_stop_when_the_verification_times_out(s3: FakeS3, sweep: SyntheticSweep) -> None:
    """The reads run on the verification's pool and stop with it: a pass that timed out reads no further state
    (a held deletion retries, and each retry's reads would otherwise go on beside the next)."""
    put_states(s3, sweep, 30)
    slow = SlowStates(s3, delay=0.1)
    before = set(threading.enumerate())
    result = verify_sweep_checkpoints(slow, sweep.root_uri, timeout_seconds=0.5)
    assert [p.kind for p in result.problems] == [v.TIMEOUT]
    wait_for(
        lambda: not [t for t in threading.enumerate() if t.name.startswith("verify-s3") and t not in before],
        10,
        what="the verifier's threads ended with its reads",
    )
    assert slow.state_reads < 15, f"{slow.state_reads} of 30 read: the reads went on after the pass ended"


class LongKeys:
    """A run root whose train/ a tenant filled with 900-character keys, page after page; counts the pages."""

    def __init__(self, inner: FakeS3) -> None:
        self.inner, self.pages = inner, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def list_objects_v2(self, Bucket: str, Prefix: str = "", ContinuationToken: str = "", **kwargs: Any) -> Any:
        if not Prefix.endswith(f"/{s3_layout.TRAIN_DIR}/"):
            return self.inner.list_objects_v2(Bucket=Bucket, Prefix=Prefix, **kwargs)
        self.pages += 1
        page = int(ContinuationToken or 0)
        keys = [{"Key": f"{Prefix}t0/junk/{'k' * 880}{page:08d}-{i:04d}", "Size": 1} for i in range(1000)]
        return {"Contents": keys, "IsTruncated": True, "NextContinuationToken": str(page + 1)}


def test_a_listing_past_its_share_of_memory_is_not_verified_naming_the_bound(s3: FakeS3, sweep: SyntheticSweep) -> None:
    """1,000,000 keys of ~920 characters took 976 MiB under the count bound alone: the listing now stops at the bytes
    one verification may hold (each key costs twice its length and ~220 bytes, as the verifier keeps it)."""
    listing = LongKeys(s3)
    budget = VerificationBudget(listing_bytes=4 * MiB, experiment_state_files=64, experiment_state_bytes=4 * MiB)
    result = verify_sweep_checkpoints(listing, sweep.root_uri, budget=budget)
    assert [p.kind for p in result.problems] == [v.TOO_MANY_OBJECTS], result.problems
    assert "more than 4096 KiB" in result.problems[0].detail
    assert listing.pages == 3, "stopped at the first page past the bound (about 2,000 bytes a key)"


# ------------------------------------------------------------------------------------------------- the budget


def test_the_budget_is_sized_from_the_limit_and_its_shares_fit_in_it() -> None:
    """Half of the limit (at least 192 MiB) stays the operator's; every verification and every document reader that
    may run at once has a fixed share of the rest, so together they stay within it."""
    for limit in (0, 256 * MiB, 512 * MiB, 1024 * MiB, 8192 * MiB):
        budget = MemoryBudget.from_limit(limit, verifications=10, readers=18)
        assert budget.limit_known == (limit > 0)
        assert budget.limit_bytes == (limit or 512 * MiB)
        assert 10 * budget.verification_bytes + 18 * budget.run_records.parsed_bytes <= budget.tenant_bytes
        shares = budget.verification
        assert shares.listing_bytes + shares.experiment_state_bytes <= budget.verification_bytes
        assert budget.limit_bytes - budget.tenant_bytes >= min(192 * MiB, budget.limit_bytes // 2)
    default = MemoryBudget.from_limit(512 * MiB, verifications=10, readers=18)
    assert default.run_records == RUN_RECORD_BOUNDS, "the chart's default limit reads what the operator needs"
    assert default.verification.listed_keys_at_most > 25_000
    bigger = MemoryBudget.from_limit(2048 * MiB, verifications=10, readers=18)
    assert bigger.verification.listing_bytes > 3 * default.verification.listing_bytes


def test_the_controller_shares_its_budget_among_what_may_run_at_once_and_passes_it_to_the_verifier() -> None:
    seen: list[Any] = []

    def verifier(client: Any, root: str, **options: Any) -> Any:
        seen.append(options["budget"])
        return FakeVerifier()(client, root)

    settings = Settings(memory_limit_bytes=1024 * MiB)
    controller = SweepController(
        settings,
        FakeKube(),  # type: ignore[arg-type]  # FakeKube is KubeApi's duck-typed double
        lambda endpoint, region: FakeS3(),
        lambda *event: None,
        verifier=verifier,
    )
    controller.reads.verify(GuardTarget(f"s3://{BUCKET}/sweeps/ml/s-abc", "", ""), pooled=False)
    assert seen == [MemoryBudget.from_limit(1024 * MiB, verifications=1, readers=1).verification]
    assert controller.reads.budget.limit_known and controller.reads.budget.limit_bytes == 1024 * MiB


@pytest.mark.parametrize("raw", ["-1", "1000", "512Mi"])
def test_a_memory_limit_the_operator_cannot_use_stops_it_naming_the_variable(raw: str) -> None:
    with pytest.raises(SettingsError, match="SWEEP_MEMORY_LIMIT_BYTES"):
        Settings.from_env({"SWEEP_MEMORY_LIMIT_BYTES": raw})
