"""A whole verification pass against an in-memory S3 (R22): the verdict, fail-closed errors, timeout, bounds."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from botocore.exceptions import EndpointConnectionError

from sweep_contracts import s3_layout
from sweep_contracts.api import CheckpointsStatus
from sweep_operator import verification as v
from sweep_operator.verification import verify_sweep_checkpoints
from tests.support.fake_s3 import FakeS3, client_error
from tests.support.sweep_factory import SyntheticSweep, write_sweep
from tests.support.waiting import wait_for

BUCKET = "bucket-a"


@pytest.fixture
def s3() -> FakeS3:
    fake = FakeS3(versioning={BUCKET: "Enabled"})
    fake.create_bucket(Bucket=BUCKET)
    return fake


@pytest.fixture
def sweep(s3: FakeS3) -> SyntheticSweep:
    return write_sweep(s3, BUCKET, trials=3, checkpoints=2, files=4, file_size=64)


def verify(s3: FakeS3, sweep: SyntheticSweep, **kwargs: object) -> v.VerificationResult:
    s3.calls.clear()
    return verify_sweep_checkpoints(s3, sweep.root_uri, **kwargs)


def test_complete_sweep_is_verified_from_listings_and_small_reads_only(s3: FakeS3, sweep: SyntheticSweep) -> None:
    """R22: every committed checkpoint counted; reads are the listings, snapshots, manifests and the run's records."""
    result = verify(s3, sweep)
    assert result.verified, result.problems
    assert result.problems == () and result.warnings == ()
    assert result.checked == sweep.committed_count == 6
    assert result.bytes == sweep.committed_bytes
    assert result.files == 3 * 2 * 4
    assert result.best_checkpoint_uri == sweep.best_checkpoint_uri
    ops = s3.operations()
    assert "head_object" not in ops
    # snapshots, manifests, result.json, status.json, Tune's experiment state: never a file
    assert ops.count("get_object") == 3 + 6 + 3
    # one listing pass over train/ (fewer than 1000 keys), one over tune/experiment_state-*
    assert ops.count("list_objects_v2") == 2


def test_deep_mode_reads_every_file_once(s3: FakeS3, sweep: SyntheticSweep) -> None:
    result = verify(s3, sweep, deep=True)
    assert result.verified and result.deep
    assert s3.operations().count("get_object") == 3 + 6 + 3 + 24


def test_result_maps_onto_the_sweep_status_and_json(s3: FakeS3, sweep: SyntheticSweep) -> None:
    sweep.delete_file()
    moment = datetime(2026, 12, 2, 10, 30, 5, tzinfo=UTC)
    result = verify(s3, sweep, now=lambda: moment)
    status = CheckpointsStatus.model_validate(result.to_status())
    assert status.verified is False and status.checked == 6
    assert status.verified_at == "2026-12-02T10:30:05Z"
    assert status.problems and status.problems[0].kind == v.MISSING_FILE
    doc = json.loads(json.dumps(result.to_dict()))
    assert doc["verified"] is False and doc["problems"][0]["key"] == sweep.file_key()
    assert result.reason.startswith(f"missing-file: {sweep.file_key()}")


def test_status_keeps_the_first_twenty_problems(s3: FakeS3) -> None:
    sweep = write_sweep(s3, BUCKET, trials=1, checkpoints=1, files=25)
    for path in sorted(sweep.files[(sweep.trials[0], sweep.checkpoints[sweep.trials[0]][0])]):
        sweep.delete_file(path=path)
    result = verify(s3, sweep)
    assert len(result.problems) == 26  # 25 files + the best checkpoint
    assert len(result.to_status()["problems"]) == 20


def test_s3_error_on_a_listing_is_not_verified_with_the_reason(s3: FakeS3, sweep: SyntheticSweep) -> None:
    """R22 fail closed: an error is a verdict (verified=False), never an exception."""
    train_prefix = sweep.root.join(s3_layout.TRAIN_DIR).prefix
    s3.fail("list_objects_v2", train_prefix, client_error("AccessDenied", 403, "Access Denied"))
    result = verify(s3, sweep)
    assert not result.verified
    assert (v.S3_ERROR, train_prefix) in [(p.kind, p.key) for p in result.problems]
    assert "AccessDenied (HTTP 403): Access Denied" in result.reason


def test_s3_error_reading_a_manifest_is_not_verified(s3: FakeS3, sweep: SyntheticSweep) -> None:
    key = sweep.manifest_keys(sweep.trials[0], sweep.checkpoints[sweep.trials[0]][0])[0]
    s3.fail("get_object", key, client_error("SlowDown", 503, "Please reduce your request rate."))
    result = verify(s3, sweep)
    assert not result.verified
    assert result.problems[0].key == key and result.problems[0].kind == v.S3_ERROR


def test_connection_error_is_not_verified(s3: FakeS3, sweep: SyntheticSweep) -> None:
    s3.fail("list_objects_v2", "", EndpointConnectionError(endpoint_url="http://127.0.0.1:9"))
    result = verify(s3, sweep)
    assert not result.verified
    assert "EndpointConnectionError" in result.reason


def test_unexpected_client_exception_is_not_verified(s3: FakeS3, sweep: SyntheticSweep) -> None:
    """Even a bug-like exception from the client must read as 'not verified', not escape or pass."""
    s3.fail("get_object", sweep.result_key, RuntimeError("boom"))
    result = verify(s3, sweep)
    assert not result.verified
    assert result.problems[0].kind == v.S3_ERROR and "RuntimeError: boom" in result.problems[0].detail


def test_missing_result_json_is_fine(s3: FakeS3, sweep: SyntheticSweep) -> None:
    sweep.delete_result()
    result = verify(s3, sweep)
    assert result.verified and result.best_checkpoint_uri is None


def test_malformed_result_json_is_a_problem(s3: FakeS3, sweep: SyntheticSweep) -> None:
    s3.put_object(Bucket=BUCKET, Key=sweep.result_key, Body=b"{")
    result = verify(s3, sweep)
    assert [p.kind for p in result.problems] == [v.INVALID_RESULT]


def test_malformed_snapshot_is_a_problem_and_its_checkpoints_unverified(s3: FakeS3, sweep: SyntheticSweep) -> None:
    key = sweep.write_snapshot_bytes(b"not json")
    result = verify(s3, sweep)
    assert (v.INVALID_SNAPSHOT, key) in [(p.kind, p.key) for p in result.problems]
    rows = [c for c in result.checkpoints if c.trial == sweep.trials[0]]
    assert rows and all(c.status == v.INVALID_SNAPSHOT for c in rows)


def test_snapshot_from_another_ray_version_is_a_warning(s3: FakeS3, sweep: SyntheticSweep) -> None:
    doc = json.loads(s3.buckets[BUCKET][sweep.snapshot_key(sweep.trials[0])])
    doc["ray_version"] = "2.59.0"
    sweep.write_snapshot_bytes(json.dumps(doc).encode())
    result = verify(s3, sweep)
    assert result.verified
    assert [w.kind for w in result.warnings] == [v.SNAPSHOT_RAY_VERSION]


def test_trial_without_checkpoints_needs_no_snapshot(s3: FakeS3, sweep: SyntheticSweep) -> None:
    """A trial stopped before its first report has a dir (e.g. Ray's storage marker) but nothing to protect."""
    s3.put_object(Bucket=BUCKET, Key=sweep.trial_prefix("trial_9999") + ".validate_storage_marker", Body=b"")
    assert verify(s3, sweep).verified


def test_run_root_with_no_object_is_not_verified(s3: FakeS3) -> None:
    """A typo in the URI must not read as 'nothing to lose' (R22)."""
    result = verify_sweep_checkpoints(s3, f"s3://{BUCKET}/sweeps/ns/typo-r1")
    assert [p.kind for p in result.problems] == [v.EMPTY_RUN_ROOT]
    relaxed = verify_sweep_checkpoints(s3, f"s3://{BUCKET}/sweeps/ns/typo-r1", empty_root_ok=True)
    assert relaxed.verified and [w.kind for w in relaxed.warnings] == [v.EMPTY_RUN_ROOT]


def test_run_that_never_checkpointed_is_verified_with_a_warning(s3: FakeS3) -> None:
    s3.put_object(Bucket=BUCKET, Key="sweeps/ns/early-r1/tune/experiment_state.json", Body=b"{}")
    result = verify_sweep_checkpoints(s3, f"s3://{BUCKET}/sweeps/ns/early-r1")
    assert result.verified and result.checked == 0
    assert [w.kind for w in result.warnings] == [v.NO_CHECKPOINTS]


def test_lifecycle_read_denied_is_a_warning_not_a_verdict(s3: FakeS3, sweep: SyntheticSweep) -> None:
    """Retention only ever warns (R11), so lacking permission to read it must not block a deletion."""
    s3.fail("get_bucket_lifecycle_configuration", "", client_error("AccessDenied", 403))
    result = verify(s3, sweep)
    assert result.verified
    assert [w.kind for w in result.warnings] == [v.RETENTION_UNKNOWN]


def test_short_lifecycle_rule_on_the_run_is_a_warning(s3: FakeS3, sweep: SyntheticSweep) -> None:
    s3.lifecycle[BUCKET] = [
        {"ID": "tmp", "Status": "Enabled", "Filter": {"Prefix": "sweeps/"}, "Expiration": {"Days": 3}}
    ]
    result = verify(s3, sweep, min_retention_days=14)
    assert result.verified
    assert [w.kind for w in result.warnings] == [v.LIFECYCLE_EXPIRATION]
    assert "14-day minimum" in result.warnings[0].detail


def test_timeout_returns_not_verified_without_waiting_for_stuck_requests(s3: FakeS3, sweep: SyntheticSweep) -> None:
    """spec.deletion.verificationTimeoutSeconds bounds the pass even when S3 stops answering."""
    s3.gate = threading.Event()
    safety_valve = threading.Timer(5, s3.gate.set)  # a verifier ignoring its timeout fails below instead of hanging
    safety_valve.start()
    started = time.monotonic()
    try:
        result = verify(s3, sweep, timeout_seconds=0.2)
    finally:
        s3.gate.set()
        safety_valve.cancel()
    assert time.monotonic() - started < 5
    assert not result.verified
    assert [p.kind for p in result.problems] == [v.TIMEOUT]
    assert "0.2 s" in result.reason


def test_concurrency_bounds_parallel_requests(s3: FakeS3) -> None:
    sweep = write_sweep(s3, BUCKET, trials=12, checkpoints=1, files=3)
    # The first three reads wait for each other: proof that three run at once; max_in_flight proves no more do.
    first_three = threading.Barrier(3, timeout=5)
    reads = iter(range(10**6))
    lock = threading.Lock()

    def first_three_reads_meet(operation: str) -> None:
        if operation == "get_object":
            with lock:
                n = next(reads)
            if n < 3:
                first_three.wait()

    s3.on_call = first_three_reads_meet
    s3.max_in_flight = 0
    result = verify(s3, sweep, concurrency=3, deep=True)
    assert result.verified
    assert s3.max_in_flight == 3


def test_bad_arguments_raise_before_any_request(s3: FakeS3) -> None:
    with pytest.raises(ValueError, match="is not an s3:// URI"):
        verify_sweep_checkpoints(s3, "/local/dir")
    with pytest.raises(ValueError, match="concurrency: got 0"):
        verify_sweep_checkpoints(s3, f"s3://{BUCKET}/x", concurrency=0)
    with pytest.raises(ValueError, match="timeout_seconds: got -1"):
        verify_sweep_checkpoints(s3, f"s3://{BUCKET}/x", timeout_seconds=-1)
    assert s3.calls == []


def test_trial_reads_start_while_the_listing_is_still_paging(s3: FakeS3, sweep: SyntheticSweep) -> None:
    """Speed: a trial's snapshot and manifests are read as soon as the listing has passed it, not after."""
    s3.page_size = 5  # 3 trials x ~13 keys: several pages
    read_started = threading.Event()
    listed_before_a_read: list[bool] = []

    def on_call(operation: str) -> None:
        if operation == "get_object":
            read_started.set()
        elif operation == "list_objects_v2" and len(listed_before_a_read) >= 4:
            # later pages wait (boundedly) for a read: only a pipelined verifier has issued one by now
            listed_before_a_read.append(read_started.wait(timeout=2))
        else:
            listed_before_a_read.append(read_started.is_set())

    s3.on_call = on_call
    result = verify(s3, sweep)
    assert result.verified, result.problems
    assert len(listed_before_a_read) > 5 and listed_before_a_read[-1], listed_before_a_read


class _InterleavedListing:
    """A store that pages its listing in no particular key order (as S3 Express directory buckets may)."""

    def __init__(self, inner: FakeS3, page: int = 4):
        self.inner, self.page = inner, page

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def list_objects_v2(
        self, Bucket: str, Prefix: str = "", ContinuationToken: str = "", **kwargs: object
    ) -> dict[str, object]:
        everything = self.inner.list_objects_v2(Bucket=Bucket, Prefix=Prefix, MaxKeys=100_000)["Contents"]
        ordered = sorted(
            everything, key=lambda o: (o["Key"].rsplit("/", 1)[-1], o["Key"])
        )  # by file name: trials interleave
        start = int(ContinuationToken or 0)
        page = ordered[start : start + self.page]
        more = start + self.page < len(ordered)
        return {
            "Contents": page,
            "IsTruncated": more,
            **({"NextContinuationToken": str(start + self.page)} if more else {}),
        }


def test_an_unordered_listing_still_gives_every_trial_all_its_objects(s3: FakeS3, sweep: SyntheticSweep) -> None:
    """R22 fail closed: a trial whose keys come back in pieces is judged on all of them, not the first piece."""
    assert verify_sweep_checkpoints(_InterleavedListing(s3), sweep.root_uri).verified
    key = sweep.delete_file()
    result = verify_sweep_checkpoints(_InterleavedListing(s3), sweep.root_uri)
    assert (v.MISSING_FILE, key) in [(p.kind, p.key) for p in result.problems]
    assert result.checked == sweep.committed_count


def test_list_trials_groups_by_trial_and_repeats_a_trial_seen_again() -> None:
    pages = [
        [("t/train/a/x", 1), ("t/train/a/y", 2), ("t/train/b/x", 3)],
        [("t/train/stray.txt", 9), ("t/train/a/z", 4)],
    ]

    class Client:
        def list_objects_v2(self, ContinuationToken: str = "", **_: object) -> dict[str, object]:
            index = int(ContinuationToken or 0)
            more = index + 1 < len(pages)
            return {
                "Contents": [{"Key": k, "Size": s} for k, s in pages[index]],
                "IsTruncated": more,
                **({"NextContinuationToken": str(index + 1)} if more else {}),
            }

    seen: list[tuple[str, dict[str, int]]] = []
    trials = v.list_trials(
        Client(), "bkt", "t/train/", lambda trial, objects, etags: seen.append((trial, dict(objects)))
    )
    assert trials == {"a": {"x": 1, "y": 2, "z": 4}, "b": {"x": 3}}
    assert seen == [("a", {"x": 1, "y": 2}), ("b", {"x": 3}), ("a", {"x": 1, "y": 2, "z": 4})]


def test_an_outsized_record_holds_naming_it_without_being_read_whole(s3: FakeS3, sweep: SyntheticSweep) -> None:
    """The run's records are the tenant's to write: one over MAX_DOCUMENT_BYTES (a manifest here) is an S3 error
    naming it, the guard holds, and at most the limit's worth of it is read."""
    from sweep_operator.verification.listing import MAX_DOCUMENT_BYTES

    key = sweep.manifest_keys(sweep.trials[0], sweep.checkpoints[sweep.trials[0]][0])[0]
    s3.put_object(Bucket=BUCKET, Key=key, Body=b"[" + b"0," * (MAX_DOCUMENT_BYTES // 2) + b"0]")
    result = verify(s3, sweep)
    assert not result.verified
    assert result.problems[0].key == key and result.problems[0].kind == v.S3_ERROR
    assert "more than the" in result.problems[0].detail, result.problems[0]


def test_a_record_is_read_up_to_the_limit_only() -> None:
    from sweep_operator.verification.listing import DocumentTooLarge, read_document

    class Body:
        def __init__(self, size: int) -> None:
            self.size, self.asked, self.closed = size, [], False

        def read(self, amt: int | None = None) -> bytes:
            self.asked.append(amt)
            return b"x" * min(self.size, amt if amt is not None else self.size)

        def close(self) -> None:
            self.closed = True

    announced = Body(100)
    with pytest.raises(DocumentTooLarge, match="k is 100 bytes"):
        read_document({"Body": announced, "ContentLength": 100}, "k", limit=10)
    assert announced.asked == [] and announced.closed, "refused from its announced length, unread"
    unannounced = Body(10**9)
    with pytest.raises(DocumentTooLarge):
        read_document({"Body": unannounced}, "k", limit=10)
    assert unannounced.asked == [11] and unannounced.closed
    assert read_document({"Body": Body(10), "ContentLength": 10}, "k", limit=10) == b"x" * 10


class _EndlessListing:
    """A run root whose train/ a tenant's code filled with more keys than anyone lists: pages without end, all of
    one trial (so no trial's reads are started as the listing passes it), each a little slow, counted."""

    def __init__(self, inner: FakeS3, delay: float = 0.02):
        self.inner, self.delay, self.pages = inner, delay, 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def list_objects_v2(self, Bucket: str, Prefix: str = "", ContinuationToken: str = "", **kwargs: object) -> Any:
        if not Prefix.endswith(f"/{s3_layout.TRAIN_DIR}/"):
            return self.inner.list_objects_v2(Bucket=Bucket, Prefix=Prefix, **kwargs)
        time.sleep(self.delay)
        self.pages += 1
        page = int(ContinuationToken or 0)
        keys = [{"Key": f"{Prefix}t0/junk/{page:08d}-{i:04d}", "Size": 1} for i in range(1000)]
        return {"Contents": keys, "IsTruncated": True, "NextContinuationToken": str(page + 1)}


def test_a_listing_past_the_bound_is_not_verified_naming_the_bound(
    s3: FakeS3, sweep: SyntheticSweep, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anyone whose code writes the run root decides how many keys it has; the listing is held in memory, so past
    MAX_LISTED_OBJECTS the run is not verified (too-many-objects, naming the bound) instead of listed on."""
    from functools import partial

    from sweep_operator.verification import listing

    assert listing.MAX_LISTED_OBJECTS == 1_000_000
    monkeypatch.setattr(v, "list_trials", partial(listing.list_trials, limit=3_000))
    endless = _EndlessListing(s3, delay=0)
    result = verify_sweep_checkpoints(endless, sweep.root_uri)
    assert not result.verified
    assert [p.kind for p in result.problems] == [v.TOO_MANY_OBJECTS], result.problems
    assert "more than 3000 objects" in result.problems[0].detail
    assert endless.pages == 4, "stopped at the first page past the bound"


def test_a_timed_out_verification_stops_listing(s3: FakeS3, sweep: SyntheticSweep) -> None:
    """A verification that timed out asks for no further page: its listing thread ends (a held deletion retries,
    and each retry's listing would otherwise page on beside the next, holding what it listed)."""
    endless = _EndlessListing(s3)
    before = set(threading.enumerate())
    result = verify_sweep_checkpoints(endless, sweep.root_uri, timeout_seconds=0.3)
    assert [p.kind for p in result.problems] == [v.TIMEOUT]
    wait_for(
        lambda: not [t for t in threading.enumerate() if t.name.startswith("verify-s3") and t not in before],
        10,
        what="the verifier's threads ended with its listing",
    )
    pages = endless.pages
    assert 0 < pages < 300, pages  # 20 ms a page: a listing that went on would still be paging
