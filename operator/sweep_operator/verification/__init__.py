"""Fail-closed verification of one sweep run's checkpoints in S3 (R22), before anything may delete them.

Ray's `checkpoint_manager_snapshot.json` names each trial's committed checkpoints, our manifests name
their files; the run's `train/` is listed once (one paginated pass; each trial's reads start as soon as the listing
has passed it) and compared in memory. Which trials must have checkpoints comes from the records that survive a
deleted `train/<trial>/`: `_sweep/status.json`, `_sweep/result.json` and Tune's `tune/experiment_state-*.json`.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime
from typing import Any

from sweep_contracts import s3_layout
from sweep_contracts.checkpoint_manifest import FormatError, Manifest, parse_manifest
from sweep_contracts.s3_layout import S3Uri
from sweep_contracts.tune_state import EXPERIMENT_STATE_PREFIX, TUNE_CHECKPOINT_PATH_KEY

from ..memory_budget import STANDALONE_BUDGET, VerificationBudget
from ..status import rfc3339
from .assessment import (
    CheckpointAssessment,
    FileToHash,
    TrialFacts,
    TrialObjects,
    assess_checkpoint,
    assess_trial,
    check_best_checkpoint,
    expected_trials,
    manifest_names,
    missing_trial_findings,
    recorded_checkpoint_findings,
)
from .findings import (
    BEST_CHECKPOINT_UNVERIFIED,
    CHECKSUM_MISMATCH,
    EMPTY_RUN_ROOT,
    FINGERPRINT_MISMATCH,
    INVALID_COMMIT_RECORD,
    INVALID_MANIFEST,
    INVALID_RECORD,
    INVALID_RESULT,
    INVALID_SNAPSHOT,
    LEVEL_COMMITTED,
    LEVEL_FULL_STATE,
    LIFECYCLE_EXPIRATION,
    LIFECYCLE_NONCURRENT_EXPIRATION,
    LIFECYCLE_TRANSITION,
    MISSING_CHECKPOINT,
    MISSING_FILE,
    MISSING_MANIFEST,
    MISSING_SNAPSHOT,
    MISSING_TRIAL,
    NO_CHECKPOINTS,
    OVER_BUDGET,
    RECORDED_CHECKPOINT_UNVERIFIED,
    RETENTION_UNKNOWN,
    S3_ERROR,
    SIZE_MISMATCH,
    SNAPSHOT_RAY_VERSION,
    STATUS_MAX_PROBLEMS,
    TIMEOUT,
    TOO_MANY_OBJECTS,
    UNCOMMITTED,
    UNCOMMITTED_CHECKPOINT,
    VERIFIED,
    VERIFIER_ERROR,
    VERSIONING_DISABLED,
    CheckpointReport,
    Finding,
    VerificationResult,
)
from .listing import (
    HASH_CHUNK_BYTES,
    OverBudget,
    S3AccessError,
    S3Reader,
    TooManyObjects,
    collect_trial,
    describe_s3_error,
    has_any_object,
    hash_object,
    iter_listing,
    list_prefix,
    list_trials,
    read_experiment_states,
    read_object,
    read_record,
    read_retention,
)
from .records import (
    Snapshot,
    best_checkpoint_uri,
    experiment_state_checkpoints,
    parse_snapshot,
    recorded_checkpoints,
)
from .retention import retention_findings

# The verifier's public names, wherever they live (findings, records, assessment, listing, retention).
__all__ = [
    "BEST_CHECKPOINT_UNVERIFIED",
    "CHECKSUM_MISMATCH",
    "EMPTY_RUN_ROOT",
    "EXPERIMENT_STATE_PREFIX",
    "FINGERPRINT_MISMATCH",
    "HASH_CHUNK_BYTES",
    "INVALID_COMMIT_RECORD",
    "INVALID_MANIFEST",
    "INVALID_RECORD",
    "INVALID_RESULT",
    "INVALID_SNAPSHOT",
    "LEVEL_COMMITTED",
    "LEVEL_FULL_STATE",
    "LIFECYCLE_EXPIRATION",
    "LIFECYCLE_NONCURRENT_EXPIRATION",
    "LIFECYCLE_TRANSITION",
    "MISSING_CHECKPOINT",
    "MISSING_FILE",
    "MISSING_MANIFEST",
    "MISSING_SNAPSHOT",
    "MISSING_TRIAL",
    "NO_CHECKPOINTS",
    "OVER_BUDGET",
    "RECORDED_CHECKPOINT_UNVERIFIED",
    "RETENTION_UNKNOWN",
    "S3_ERROR",
    "SIZE_MISMATCH",
    "SNAPSHOT_RAY_VERSION",
    "STATUS_MAX_PROBLEMS",
    "TIMEOUT",
    "TOO_MANY_OBJECTS",
    "TUNE_CHECKPOINT_PATH_KEY",
    "UNCOMMITTED",
    "UNCOMMITTED_CHECKPOINT",
    "VERIFIED",
    "VERIFIER_ERROR",
    "VERSIONING_DISABLED",
    "CheckpointAssessment",
    "CheckpointReport",
    "FileToHash",
    "Finding",
    "FormatError",
    "Manifest",
    "S3AccessError",
    "S3Reader",
    "Snapshot",
    "TrialFacts",
    "TrialObjects",
    "VerificationResult",
    "assess_checkpoint",
    "assess_trial",
    "best_checkpoint_uri",
    "check_best_checkpoint",
    "collect_trial",
    "describe_s3_error",
    "experiment_state_checkpoints",
    "hash_object",
    "iter_listing",
    "list_prefix",
    "list_trials",
    "manifest_names",
    "missing_trial_findings",
    "parse_manifest",
    "parse_snapshot",
    "read_experiment_states",
    "read_object",
    "recorded_checkpoints",
    "retention_findings",
    "verify_sweep_checkpoints",
]


class _DeadlineExceeded(Exception):
    pass


def _wait_all(futures: Sequence[Future[Any]], deadline: float | None, clock: Callable[[], float]) -> None:
    """Wait for `futures` until the deadline; their S3 errors are collected afterwards, not raised here."""
    remaining = None if deadline is None else max(0.0, deadline - clock())
    _, not_done = wait(futures, timeout=remaining)
    if not_done:
        raise _DeadlineExceeded


@dataclass
class _Run:
    """Mutable accumulator for one verification (kept private; the result is frozen)."""

    problems: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)
    assessments: list[CheckpointAssessment] = field(default_factory=list)
    objects_listed: int = 0
    best_uri: str | None = None

    def outcome(self, future: Future[Any]) -> Any:
        """The future's value, or None after recording its S3 error as a problem."""
        exc = future.exception()
        if exc is None:
            return future.result()
        if isinstance(exc, TooManyObjects):
            self.problems.append(Finding(TOO_MANY_OBJECTS, exc.key, exc.detail))
        elif isinstance(exc, OverBudget):
            self.problems.append(Finding(OVER_BUDGET, exc.key, exc.detail))
        elif isinstance(exc, S3AccessError):
            self.problems.append(Finding(S3_ERROR, exc.key, exc.detail))
        else:
            self.problems.append(Finding(VERIFIER_ERROR, "", describe_s3_error(exc)))
        return None


def verify_sweep_checkpoints(
    client: S3Reader,
    root: S3Uri | str,
    *,
    deep: bool = False,
    concurrency: int = 8,
    timeout_seconds: float | None = None,
    min_retention_days: int = 30,
    empty_root_ok: bool = False,
    budget: VerificationBudget | None = None,
    clock: Callable[[], float] = time.monotonic,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> VerificationResult:
    """Verify every committed checkpoint under a run root; S3 errors and timeouts give verified=False, never raise.

    `root` is `s3://bucket/prefix/<ns>/<sweep>-<runId>`; a malformed one raises ValueError (an input error,
    before any request). `concurrency` bounds parallel requests; `timeout_seconds` bounds the whole pass
    (the operator passes spec.deletion.verificationTimeoutSeconds). A root with no object at all is a
    problem (a wrong URI must not pass) unless `empty_root_ok`, for a caller that knows nothing was written.
    `budget`: what the pass may hold of the run's listing, records and Tune states (the operator's share per
    verification; by default a process of its own, memory_budget.STANDALONE_BUDGET); past it the run is not verified.
    """
    uri = root if isinstance(root, S3Uri) else S3Uri.parse(root)
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency: got {concurrency!r}; must be an integer >= 1")
    if timeout_seconds is not None and not (
        isinstance(timeout_seconds, (int, float)) and timeout_seconds > 0 and math.isfinite(timeout_seconds)
    ):
        raise ValueError(f"timeout_seconds: got {timeout_seconds!r}; must be a number of seconds > 0 or None")
    if isinstance(min_retention_days, bool) or not isinstance(min_retention_days, int) or min_retention_days < 0:
        raise ValueError(f"min_retention_days: got {min_retention_days!r}; must be an integer >= 0")

    started = clock()
    deadline = None if timeout_seconds is None else started + timeout_seconds
    run = _Run()
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="verify-s3")
    ended = threading.Event()  # the listing asks for no page once set: a timed-out pass stops listing
    try:
        _verify(
            client, uri, deep, pool, deadline, clock, run, min_retention_days, empty_root_ok, now().date(), ended,
            budget or STANDALONE_BUDGET.verification,
        )  # fmt: skip
    except _DeadlineExceeded:
        run.problems.append(Finding(TIMEOUT, uri.prefix, f"verification did not finish within {timeout_seconds:g} s"))
    except Exception as exc:  # fail closed: a bug here must read as "not verified", not as success
        run.problems.append(Finding(VERIFIER_ERROR, uri.prefix, describe_s3_error(exc)))
    finally:
        # Never wait for stragglers after a timeout: their requests end by the client's own timeouts, and the
        # listing at its next page.
        ended.set()
        pool.shutdown(wait=False, cancel_futures=True)
    return _result(uri, deep, run, clock() - started, now())


@dataclass(frozen=True)
class _Reads:
    """The reads of one pass, started together on the pool: the listing (which starts each trial's reads as it
    passes the trial), the run's records and the bucket's retention settings."""

    listing: Future[dict[str, dict[str, int]]]
    trials: dict[str, Future[TrialFacts]]
    result: Future[bytes | None]
    status: Future[bytes | None]
    states: Future[dict[str, dict[str, str] | FormatError]]
    retention: Future[tuple[dict[str, Any], list[dict[str, Any]]]]


def _start_reads(
    client: S3Reader, root: S3Uri, pool: ThreadPoolExecutor, ended: threading.Event, budget: VerificationBudget
) -> _Reads:
    trial_futures: dict[str, Future[TrialFacts]] = {}

    def on_trial(trial: str, objects: Mapping[str, int], etags: Mapping[str, str]) -> None:
        # Called from the listing thread; a later call for the same trial (an unordered store) replaces it.
        trial_futures[trial] = pool.submit(collect_trial, client, root, trial, objects, etags)

    train_prefix = root.join(s3_layout.TRAIN_DIR).prefix
    return _Reads(
        listing=pool.submit(
            list_trials, client, root.bucket, train_prefix, on_trial, stop=ended, max_bytes=budget.listing_bytes
        ),
        trials=trial_futures,
        result=pool.submit(read_record, client, root.bucket, root.join(s3_layout.RESULT_KEY).key, budget.run_records),
        status=pool.submit(read_record, client, root.bucket, root.join(s3_layout.STATUS_KEY).key, budget.run_records),
        # On the pass's pool: when the pass ends (its deadline), `ended` stops the reads between files and pieces.
        states=pool.submit(read_experiment_states, client, root, budget, stop=ended),
        retention=pool.submit(read_retention, client, root.bucket),
    )


def _verify(
    client: S3Reader,
    root: S3Uri,
    deep: bool,
    pool: ThreadPoolExecutor,
    deadline: float | None,
    clock: Callable[[], float],
    run: _Run,
    min_retention_days: int,
    empty_root_ok: bool,
    today: date,
    ended: threading.Event,
    budget: VerificationBudget,
) -> None:
    reads = _start_reads(client, root, pool, ended, budget)
    _wait_all([reads.listing], deadline, clock)
    trials = run.outcome(reads.listing)
    if trials is None:  # the run cannot even be listed: nothing else is worth asking
        return
    empty_future = pool.submit(has_any_object, client, root.bucket, root.prefix) if not trials else None
    others: list[Future[Any]] = [reads.result, reads.status, reads.states, reads.retention]
    others += [empty_future] if empty_future else []
    _wait_all([*reads.trials.values(), *others], deadline, clock)

    facts_by_trial: dict[str, TrialFacts | None] = {}
    for trial, future in reads.trials.items():
        facts = facts_by_trial[trial] = run.outcome(future)
        if facts is None:
            continue
        run.objects_listed += len(facts.objects.files) + sum(len(c) for c in facts.objects.dirs.values())
        assessments, problems, warnings = assess_trial(root, facts)
        run.assessments += assessments
        run.problems += problems
        run.warnings += warnings
    result_data = run.outcome(reads.result)
    expected, unreadable = expected_trials(root, result_data, run.outcome(reads.status), run.outcome(reads.states))
    run.problems += unreadable
    run.problems += missing_trial_findings(root, expected, facts_by_trial, run.problems)
    if empty_future is not None and run.outcome(empty_future) is False:
        empty = Finding(
            EMPTY_RUN_ROOT, root.prefix, f"no object under {root}: a wrong URI, or a run that never wrote anything"
        )
        (run.warnings if empty_root_ok else run.problems).append(empty)
    elif not any(a.report.committed for a in run.assessments) and not run.problems:
        train_prefix = root.join(s3_layout.TRAIN_DIR).prefix
        run.warnings.append(Finding(NO_CHECKPOINTS, train_prefix, "no trial has committed a checkpoint yet"))

    if deep:
        _hash_checkpoints(client, root, pool, deadline, clock, run)
    if result_data is not None:
        verified = [(a.report.trial, a.report.name) for a in run.assessments if a.report.verified]
        run.best_uri, findings = recorded_checkpoint_findings(root, result_data, verified, run.problems)
        run.problems += findings
    run.warnings += _retention_warnings(reads.retention, root, min_retention_days, today)


def _retention_warnings(
    future: Future[tuple[dict[str, Any], list[dict[str, Any]]]], root: S3Uri, min_retention_days: int, today: date
) -> list[Finding]:
    unread = future.exception()
    if unread is not None:
        detail = unread.detail if isinstance(unread, S3AccessError) else describe_s3_error(unread)
        # Retention only ever yields warnings, so not being allowed to read it must not block a deletion.
        return [
            Finding(RETENTION_UNKNOWN, "", f"could not read the versioning/lifecycle of bucket {root.bucket}: {detail}")
        ]
    versioning, rules = future.result()
    return retention_findings(versioning, rules, root, min_retention_days, today)


def _hash_checkpoints(
    client: S3Reader,
    root: S3Uri,
    pool: ThreadPoolExecutor,
    deadline: float | None,
    clock: Callable[[], float],
    run: _Run,
) -> None:
    """Deep mode: stream every size-checked file concurrently and compare sha256; failing checkpoints lose `verified`."""
    jobs = [
        (item, pool.submit(hash_object, client, root.bucket, item.key)) for a in run.assessments for item in a.to_hash
    ]
    _wait_all([f for _, f in jobs], deadline, clock)
    failed: dict[tuple[str, str], str] = {}
    for item, future in jobs:
        before = len(run.problems)
        outcome = run.outcome(future)
        if outcome is not None:
            digest, size = outcome
            if size != item.size:
                run.problems.append(
                    Finding(SIZE_MISMATCH, item.key, f"read {size} bytes, the manifest says {item.size}")
                )
            elif digest != item.sha256:
                run.problems.append(
                    Finding(CHECKSUM_MISMATCH, item.key, f"sha256 {digest}, the manifest says {item.sha256}")
                )
        if len(run.problems) > before:
            failed.setdefault((item.trial, item.checkpoint), run.problems[-1].kind)
    if failed:
        run.assessments = [
            CheckpointAssessment(
                replace(a.report, status=failed[(a.report.trial, a.report.name)], level=""), a.problems
            )
            if (a.report.trial, a.report.name) in failed
            else a
            for a in run.assessments
        ]


def _result(root: S3Uri, deep: bool, run: _Run, duration: float, moment: datetime) -> VerificationResult:
    reports = tuple(sorted((a.report for a in run.assessments), key=lambda r: (r.trial, r.name)))
    verified_reports = [r for r in reports if r.verified]
    return VerificationResult(
        root=str(root),
        verified=not run.problems,
        deep=deep,
        checked=sum(1 for r in reports if r.committed),
        bytes=sum(r.bytes for r in verified_reports),
        files=sum(r.files for r in verified_reports),
        problems=tuple(run.problems),
        warnings=tuple(run.warnings),
        checkpoints=reports,
        best_checkpoint_uri=run.best_uri,
        objects_listed=run.objects_listed,
        duration_seconds=duration,
        verified_at=rfc3339(moment),
    )
