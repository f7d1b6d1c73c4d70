"""Fail-closed verification of one sweep run's checkpoints in S3 (R22), before anything may delete them.

Ray's `checkpoint_manager_snapshot.json` names each trial's committed checkpoints, our manifests name
their files; the run's `train/` is listed once (one paginated pass; each trial's reads start as soon as the listing
has passed it) and compared in memory. Which trials must have checkpoints comes from the records that survive a
deleted `train/<trial>/`: `_sweep/status.json`, `_sweep/result.json` and Tune's `tune/experiment_state-*.json`.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime
from typing import Any, Final, Protocol

from sweep_contracts import s3_layout
from sweep_contracts.checkpoint_manifest import (
    FormatError,
    Manifest,
    load_json_object,
    missing_rank_manifests,
    parse_manifest,
)
from sweep_contracts.constants import SUPPORTED_RAY_VERSION
from sweep_contracts.s3_layout import S3Uri

from .status import parse_time, rfc3339

# --------------------------------------------------------------------------------- finding kinds

# Problems: any one makes the run not verified.
EMPTY_RUN_ROOT: Final = "empty-run-root"
MISSING_SNAPSHOT: Final = "missing-snapshot"
INVALID_SNAPSHOT: Final = "invalid-snapshot"
MISSING_CHECKPOINT: Final = "missing-checkpoint"
MISSING_MANIFEST: Final = "missing-manifest"
INVALID_MANIFEST: Final = "invalid-manifest"
MISSING_FILE: Final = "missing-file"
SIZE_MISMATCH: Final = "size-mismatch"
CHECKSUM_MISMATCH: Final = "checksum-mismatch"
INVALID_RESULT: Final = "invalid-result"
BEST_CHECKPOINT_UNVERIFIED: Final = "best-checkpoint-unverified"
S3_ERROR: Final = "s3-error"
TIMEOUT: Final = "timeout"
VERIFIER_ERROR: Final = "verifier-error"
# A trial the run's surviving records (status.json, result.json, Tune's experiment state) say checkpointed, with no
# object left under train/<trial>/.
MISSING_TRIAL: Final = "missing-trial"
# _sweep/status.json or one of Tune's experiment_state-*.json cannot be read: which trials checkpointed is unknown.
INVALID_RECORD: Final = "invalid-record"
# A checkpoint result.json names for a trial is not among the verified ones.
RECORDED_CHECKPOINT_UNVERIFIED: Final = "recorded-checkpoint-unverified"

# Warnings: reported, never a reason to hold a deletion.
UNCOMMITTED_CHECKPOINT: Final = "uncommitted-checkpoint"
NO_CHECKPOINTS: Final = "no-checkpoints"
SNAPSHOT_RAY_VERSION: Final = "snapshot-ray-version"
VERSIONING_DISABLED: Final = "versioning-disabled"
LIFECYCLE_EXPIRATION: Final = "lifecycle-expiration"
LIFECYCLE_TRANSITION: Final = "lifecycle-transition"
LIFECYCLE_NONCURRENT_EXPIRATION: Final = "lifecycle-noncurrent-expiration"
RETENTION_UNKNOWN: Final = "retention-unknown"

# Row statuses besides a problem kind.
VERIFIED: Final = "verified"
UNCOMMITTED: Final = "uncommitted"

STATUS_MAX_PROBLEMS: Final = 20  # CheckpointsStatus.problems keeps the first 20
HASH_CHUNK_BYTES: Final = 1 << 20  # deep mode holds at most concurrency x 1 MiB of object data
_LIST_PAGE_SIZE: Final = 1000
# What Ray 2.58 names in its records: ray/tune/execution/tune_controller.py (TuneController.CKPT_FILE_TMPL,
# save_to_dir: {"trial_data": [[trial JSON, run-metadata JSON], ...]}), ray/tune/trainable/metadata.py
# (_TrainingRunMetadata.last_result) and ray/tune/integration/ray_train.py (TuneReportCallback adds the path).
EXPERIMENT_STATE_PREFIX: Final = "experiment_state-"
TUNE_CHECKPOINT_PATH_KEY: Final = "checkpoint_path"


@dataclass(frozen=True)
class Finding:
    """One problem or warning: `kind` (constants above), the S3 key or key prefix concerned ("" for the bucket), and why."""

    kind: str
    key: str
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "key": self.key, "detail": self.detail}


@dataclass(frozen=True)
class CheckpointReport:
    """One checkpoint directory: committed by Ray's snapshot or not, and what we found in it."""

    trial: str
    name: str
    key: str  # the directory's key prefix, `.../train/<trial>/<name>/`
    committed: bool
    files: int  # files its manifests list
    bytes: int  # bytes its manifests list
    status: str  # "verified", "uncommitted", or the first problem kind found

    @property
    def verified(self) -> bool:
        return self.status == VERIFIED

    def to_dict(self) -> dict[str, Any]:
        return {
            "trial": self.trial,
            "checkpoint": self.name,
            "key": self.key,
            "committed": self.committed,
            "files": self.files,
            "bytes": self.bytes,
            "status": self.status,
        }


@dataclass(frozen=True)
class VerificationResult:
    """The verdict on one run root; `verified` is True only when no problem was found."""

    root: str
    verified: bool
    deep: bool
    checked: int  # committed checkpoints examined
    bytes: int  # bytes held by the verified checkpoints
    files: int  # files of the verified checkpoints
    problems: tuple[Finding, ...]
    warnings: tuple[Finding, ...]
    checkpoints: tuple[CheckpointReport, ...]
    best_checkpoint_uri: str | None
    objects_listed: int
    duration_seconds: float
    verified_at: str  # RFC 3339, UTC

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; `verified` is a top-level boolean."""
        return {
            "verified": self.verified,
            "root": self.root,
            "deep": self.deep,
            "checked": self.checked,
            "bytes": self.bytes,
            "files": self.files,
            "problems": [p.to_dict() for p in self.problems],
            "warnings": [w.to_dict() for w in self.warnings],
            "checkpoints": [c.to_dict() for c in self.checkpoints],
            "bestCheckpointUri": self.best_checkpoint_uri,
            "objectsListed": self.objects_listed,
            "durationSeconds": round(self.duration_seconds, 3),
            "verifiedAt": self.verified_at,
        }

    def to_status(self, max_problems: int = STATUS_MAX_PROBLEMS) -> dict[str, Any]:
        """`status.checkpoints` of a TrainingSweep (api.CheckpointsStatus, camelCase keys)."""
        return {
            "verified": self.verified,
            "checked": self.checked,
            "bytes": self.bytes,
            "problems": [p.to_dict() for p in self.problems[:max_problems]],
            "verifiedAt": self.verified_at,
        }

    @property
    def reason(self) -> str:
        """One line saying why the run is not verified ("" when it is)."""
        if self.verified:
            return ""
        first = self.problems[0]
        more = f" (and {len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
        return f"{first.kind}: {first.key}: {first.detail}{more}"


class S3Reader(Protocol):
    """The subset of a boto3 S3 client the verifier uses (inject a real client or a fake)."""

    def list_objects_v2(self, **kwargs: Any) -> dict[str, Any]: ...

    def get_object(self, **kwargs: Any) -> dict[str, Any]: ...

    def get_bucket_versioning(self, **kwargs: Any) -> dict[str, Any]: ...

    def get_bucket_lifecycle_configuration(self, **kwargs: Any) -> dict[str, Any]: ...


# ------------------------------------------------------------------------------ document formats


@dataclass(frozen=True)
class Snapshot:
    """What the verifier reads from Ray 2.58's `_CheckpointManagerState` JSON."""

    committed: tuple[str, ...]  # checkpoint_results[].checkpoint_dir_name, plus the latest, in order
    latest: str | None  # latest_checkpoint_result.checkpoint_dir_name
    ray_version: str | None


def _checkpoint_dir_name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value or "/" in value or value in (".", ".."):
        raise FormatError(f"{where}: got {value!r}; expected a directory name (no '/')")
    return value


def parse_snapshot(data: bytes) -> Snapshot:
    """Parse Ray's commit record; raises FormatError naming the field that is wrong."""
    doc = load_json_object(data, s3_layout.SNAPSHOT_FILE)
    results = doc.get("checkpoint_results")
    if not isinstance(results, list):
        raise FormatError(f"checkpoint_results: got {results!r}; expected a list")
    committed: list[str] = []
    for i, item in enumerate(results):
        if not isinstance(item, dict):
            raise FormatError(f"checkpoint_results[{i}]: got {item!r}; expected an object")
        committed.append(
            _checkpoint_dir_name(item.get("checkpoint_dir_name"), f"checkpoint_results[{i}].checkpoint_dir_name")
        )
    latest_doc = doc.get("latest_checkpoint_result")
    latest: str | None = None
    if latest_doc is not None:
        if not isinstance(latest_doc, dict):
            raise FormatError(f"latest_checkpoint_result: got {latest_doc!r}; expected an object or null")
        latest = _checkpoint_dir_name(
            latest_doc.get("checkpoint_dir_name"), "latest_checkpoint_result.checkpoint_dir_name"
        )
        if latest not in committed:  # Ray never deletes the latest; verify it even if a snapshot omits it
            committed.append(latest)
    ray_version = doc.get("ray_version")
    return Snapshot(tuple(dict.fromkeys(committed)), latest, ray_version if isinstance(ray_version, str) else None)


def best_checkpoint_uri(data: bytes) -> str | None:
    """`bestTrial.checkpointUri` of `_sweep/result.json` (None when the sweep has no best checkpoint)."""
    doc = load_json_object(data, s3_layout.RESULT_KEY)
    best = doc.get("bestTrial")
    if best is None:
        return None
    if not isinstance(best, dict):
        raise FormatError(f"bestTrial: got {best!r}; expected an object or null")
    uri = best.get("checkpointUri")
    if uri is not None and (not isinstance(uri, str) or not uri):
        raise FormatError(f"bestTrial.checkpointUri: got {uri!r}; expected an s3:// URI or null")
    return uri


def recorded_checkpoints(data: bytes, what: str) -> dict[str, str]:
    """{trial id: checkpoint URI} for every trial `_sweep/status.json` or `result.json` records with a checkpoint
    (`trialResults[]`, and `bestTrial`); raises FormatError naming the field that is wrong."""
    doc = load_json_object(data, what)
    found: dict[str, str] = {}
    rows = doc.get("trialResults", [])
    if not isinstance(rows, list):
        raise FormatError(f"{what}: trialResults: got {rows!r}; expected a list")
    best = doc.get("bestTrial")
    for i, row in enumerate([*rows, *([best] if isinstance(best, dict) else [])]):
        if not isinstance(row, dict) or not isinstance(row.get("id"), str) or not row["id"]:
            raise FormatError(f"{what}: trialResults[{i}]: got {row!r}; expected an object with an id")
        uri = row.get("checkpointUri")
        if uri is not None and (not isinstance(uri, str) or not uri):
            raise FormatError(f"{what}: trialResults[{i}].checkpointUri: got {uri!r}; expected a URI or null")
        if uri:
            found.setdefault(row["id"], uri)
    return found


def experiment_state_checkpoints(data: bytes, what: str) -> dict[str, str]:
    """{trial id: checkpoint path} for every trial of one Tune experiment state whose last result names a checkpoint
    (Tune over Train: the path TuneReportCallback forwards, R18); raises FormatError when the file is not Tune's."""
    doc = load_json_object(data, what)
    trial_data = doc.get("trial_data")
    if not isinstance(trial_data, list):
        raise FormatError(f"{what}: trial_data: got {type(trial_data).__name__}; expected Tune's list of trials")
    found: dict[str, str] = {}
    for i, item in enumerate(trial_data):
        try:
            trial_json, metadata_json = item
            trial = json.loads(trial_json)
            metadata = json.loads(metadata_json)
            trial_id = trial["trial_id"]
            last = metadata.get("last_result") or {}
        except (TypeError, ValueError, KeyError, AttributeError):
            raise FormatError(
                f"{what}: trial_data[{i}]: not a [trial, run metadata] pair of JSON documents with a trial_id"
            ) from None
        if not isinstance(trial_id, str) or not isinstance(last, dict):
            raise FormatError(f"{what}: trial_data[{i}]: trial_id {trial_id!r} / last_result of an unexpected type")
        path = last.get(TUNE_CHECKPOINT_PATH_KEY)
        if isinstance(path, str) and path:
            found[trial_id] = path
    return found


# ------------------------------------------------------------------------------ pure comparison


@dataclass(frozen=True)
class TrialObjects:
    """A trial prefix's listing, grouped: files directly in it and one `{relative key: size}` per sub-directory."""

    trial: str
    files: Mapping[str, int]
    dirs: Mapping[str, Mapping[str, int]]

    @classmethod
    def from_listing(cls, trial: str, objects: Mapping[str, int]) -> TrialObjects:
        """`objects` maps keys relative to the trial dir to sizes; `dir/` markers (pyarrow) keep a dir known."""
        files: dict[str, int] = {}
        dirs: dict[str, dict[str, int]] = {}
        for rel, size in objects.items():
            head, sep, rest = rel.partition("/")
            if not sep:
                files[head] = size
                continue
            contents = dirs.setdefault(head, {})
            if rest and not rest.endswith("/"):
                contents[rest] = size
        return cls(trial, files, dirs)

    @property
    def has_snapshot(self) -> bool:
        return s3_layout.SNAPSHOT_FILE in self.files

    def checkpoint_like_dirs(self) -> list[str]:
        """Sub-directories that look like checkpoints: Ray's `checkpoint_` prefix, or holding a manifest."""
        return sorted(
            name
            for name, contents in self.dirs.items()
            if name.startswith(s3_layout.CHECKPOINT_DIR_PREFIX) or any(s3_layout.is_manifest_name(k) for k in contents)
        )


@dataclass(frozen=True)
class FileToHash:
    """A file whose size matched; deep mode streams it and compares sha256."""

    trial: str
    checkpoint: str
    key: str
    size: int
    sha256: str


@dataclass(frozen=True)
class CheckpointAssessment:
    """A checkpoint after the in-memory comparison (deep hashing may still add problems)."""

    report: CheckpointReport
    problems: tuple[Finding, ...]
    to_hash: tuple[FileToHash, ...] = ()


def manifest_names(contents: Mapping[str, int]) -> list[str]:
    """The manifests directly in a checkpoint directory, `_manifest.json` first, then by rank."""
    names = [k for k in contents if s3_layout.is_manifest_name(k)]
    return sorted(names, key=lambda n: -1 if n == s3_layout.MANIFEST_FILE else (s3_layout.manifest_rank(n) or 0))


def assess_checkpoint(
    trial: str,
    name: str,
    dir_key: str,
    contents: Mapping[str, int] | None,
    manifests: Mapping[str, Manifest | FormatError],
) -> CheckpointAssessment:
    """Compare one committed checkpoint's listing with its manifests (`contents` None: no object at all)."""

    def result(
        problems: list[Finding], files: int = 0, size: int = 0, to_hash: Sequence[FileToHash] = ()
    ) -> CheckpointAssessment:
        status = problems[0].kind if problems else VERIFIED
        report = CheckpointReport(trial, name, dir_key, True, files, size, status)
        return CheckpointAssessment(report, tuple(problems), tuple(to_hash) if not problems else ())

    if contents is None or not contents:
        what = "holds only directory markers" if contents is not None else "has no objects"
        return result(
            [
                Finding(
                    MISSING_CHECKPOINT, dir_key, f"committed by Ray's snapshot but {what} (deleted or never uploaded)"
                )
            ]
        )
    if not manifests:
        return result(
            [
                Finding(
                    MISSING_MANIFEST,
                    dir_key + s3_layout.MANIFEST_FILE,
                    f"no {s3_layout.MANIFEST_FILE} or {s3_layout.rank_manifest_name(0)} among {len(contents)} object(s); "
                    "the checkpoint cannot be proven complete",
                )
            ]
        )
    problems: list[Finding] = []
    for manifest_name, manifest in manifests.items():
        if isinstance(manifest, FormatError):
            problems.append(Finding(INVALID_MANIFEST, dir_key + manifest_name, str(manifest)))
    world_size, missing_ranks, disagreement = missing_rank_manifests(manifests)
    if disagreement:
        problems.append(Finding(INVALID_MANIFEST, dir_key, disagreement))
    if missing_ranks:
        present = sorted(r for r in (s3_layout.manifest_rank(n) for n in manifests) if r is not None)
        problems.append(
            Finding(
                MISSING_MANIFEST,
                dir_key + s3_layout.rank_manifest_name(missing_ranks[0]),
                f"per-rank manifests for rank(s) {', '.join(map(str, missing_ranks))} are missing "
                f"(found ranks {present}; the manifests record a world size of {world_size})",
            )
        )
    files = 0
    size = 0
    to_hash: list[FileToHash] = []
    for manifest in manifests.values():
        if isinstance(manifest, FormatError):
            continue
        for entry in manifest.files:
            key = dir_key + entry.path
            files += 1
            size += entry.size
            actual = contents.get(entry.path)
            if actual is None:
                problems.append(
                    Finding(MISSING_FILE, key, f"listed in the manifest ({entry.size} bytes) but not in S3")
                )
            elif actual != entry.size:
                problems.append(Finding(SIZE_MISMATCH, key, f"{actual} bytes in S3, the manifest says {entry.size}"))
            else:
                to_hash.append(FileToHash(trial, name, key, entry.size, entry.sha256))
    return result(problems, files, size, to_hash)


def check_best_checkpoint(
    uri: str | None,
    root: S3Uri,
    verified: Iterable[tuple[str, str]],
    *,
    kind: str = BEST_CHECKPOINT_UNVERIFIED,
    what: str = "best checkpoint",
) -> Finding | None:
    """`_sweep/result.json`'s best checkpoint (or another checkpoint it records) must be one of the verified
    (trial, checkpoint) pairs."""
    if uri is None:
        return None
    key = root.join(s3_layout.RESULT_KEY).key
    train_path = f"{root.join(s3_layout.TRAIN_DIR).path}/"
    location = s3_layout.strip_scheme(uri).rstrip("/")  # Ray reports `bucket/key`; result.json carries s3://
    if not location.startswith(train_path):
        return Finding(kind, key, f"{what} {uri} is not under this run's {train_path}")
    parts = location[len(train_path) :].split("/")
    if len(parts) != 2 or tuple(parts) not in set(verified):
        return Finding(kind, key, f"{what} {uri} is not among the verified checkpoints")
    return None


def _days_until(when: Any, today: date) -> int | None:
    if isinstance(when, datetime):
        return (when.date() - today).days
    if isinstance(when, date):
        return (when - today).days
    if isinstance(when, str):
        try:
            parsed = parse_time(when)
        except ValueError:
            return None
        return (parsed.date() - today).days if parsed is not None else None
    return None


def _rule_scope(rule: Mapping[str, Any]) -> tuple[str, str]:
    """(prefix, extra conditions) a lifecycle rule applies to."""
    filt = rule.get("Filter")
    if filt is None:
        return str(rule.get("Prefix", "")), ""
    conditions = filt.get("And", filt)
    prefix = str(conditions.get("Prefix", ""))
    extras = []
    tags = conditions.get("Tags") or ([conditions["Tag"]] if "Tag" in conditions else [])
    if tags:
        extras.append("tagged " + ", ".join(f"{t.get('Key')}={t.get('Value')}" for t in tags))
    if "ObjectSizeGreaterThan" in conditions:
        extras.append(f"larger than {conditions['ObjectSizeGreaterThan']} bytes")
    if "ObjectSizeLessThan" in conditions:
        extras.append(f"smaller than {conditions['ObjectSizeLessThan']} bytes")
    return prefix, " and ".join(extras)


def retention_findings(
    versioning: Mapping[str, Any],
    rules: Sequence[Mapping[str, Any]],
    root: S3Uri,
    min_retention_days: int,
    today: date,
) -> list[Finding]:
    """Warnings for a bucket that would not keep the run's objects for `min_retention_days` (R11)."""
    findings: list[Finding] = []
    if versioning.get("Status") != "Enabled":
        state = "suspended" if versioning.get("Status") == "Suspended" else "not enabled"
        findings.append(
            Finding(
                VERSIONING_DISABLED,
                "",
                f"versioning of bucket {root.bucket} is {state}: a deleted or overwritten checkpoint cannot be recovered",
            )
        )
    run_prefix = root.prefix
    for rule in rules:
        if rule.get("Status") != "Enabled":
            continue
        prefix, extras = _rule_scope(rule)
        if not (run_prefix.startswith(prefix) or prefix.startswith(run_prefix)):
            continue
        scope = f"lifecycle rule {rule.get('ID', '?')!r} (prefix {prefix!r}{', ' + extras if extras else ''})"
        expiration = rule.get("Expiration") or {}
        days = expiration.get("Days")
        if days is None and "Date" in expiration:
            days = _days_until(expiration["Date"], today)
        if isinstance(days, int) and days < min_retention_days:
            findings.append(
                Finding(
                    LIFECYCLE_EXPIRATION,
                    root.prefix,
                    f"{scope} deletes objects after {days} day(s), under the {min_retention_days}-day minimum",
                )
            )
        for transition in rule.get("Transitions") or []:
            days = transition.get("Days")
            if days is None and "Date" in transition:
                days = _days_until(transition["Date"], today)
            if isinstance(days, int) and days < min_retention_days:
                findings.append(
                    Finding(
                        LIFECYCLE_TRANSITION,
                        root.prefix,
                        f"{scope} moves objects to {transition.get('StorageClass', '?')} after {days} day(s), "
                        f"under the {min_retention_days}-day minimum",
                    )
                )
        noncurrent = (rule.get("NoncurrentVersionExpiration") or {}).get("NoncurrentDays")
        if isinstance(noncurrent, int) and noncurrent < min_retention_days:
            findings.append(
                Finding(
                    LIFECYCLE_NONCURRENT_EXPIRATION,
                    root.prefix,
                    f"{scope} deletes overwritten/deleted versions after {noncurrent} day(s), under the {min_retention_days}-day minimum",
                )
            )
    return findings


# ------------------------------------------------------------------------------ S3 access (I/O)


class S3AccessError(Exception):
    """An S3 request failed (after botocore's retries); `key` is what we were reading."""

    def __init__(self, key: str, detail: str):
        super().__init__(f"{key}: {detail}")
        self.key = key
        self.detail = detail


def describe_s3_error(exc: BaseException) -> str:
    """`NoSuchBucket (HTTP 404): The specified bucket does not exist` / the botocore message; never empty."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and "Error" in response:
        error = response.get("Error") or {}
        meta = response.get("ResponseMetadata") or {}
        code = error.get("Code") or "Error"
        status = meta.get("HTTPStatusCode")
        message = error.get("Message") or ""
        retries = meta.get("RetryAttempts")
        text = f"{code}" + (f" (HTTP {status})" if status else "") + (f": {message}" if message else "")
        return text + (f" after {retries + 1} attempt(s)" if retries else "")
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    return str(((response or {}).get("Error") or {}).get("Code", "")) if isinstance(response, dict) else ""


def _s3_call(key: str, call: Callable[..., dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
    try:
        return call(**kwargs)
    except Exception as exc:  # botocore ClientError/BotoCoreError, or whatever a client raises: all mean "not read"
        raise S3AccessError(key, describe_s3_error(exc)) from exc


def iter_listing(client: S3Reader, bucket: str, prefix: str) -> Iterator[tuple[str, int]]:
    """Every object under `prefix` as (key relative to prefix, size), paginated (ListObjectsV2, 1000 a page)."""
    token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": _LIST_PAGE_SIZE}
        if token:
            kwargs["ContinuationToken"] = token
        page = _s3_call(prefix, client.list_objects_v2, **kwargs)
        for obj in page.get("Contents", []):
            yield obj["Key"][len(prefix) :], int(obj.get("Size", 0))
        if not page.get("IsTruncated"):
            return
        token = page.get("NextContinuationToken")
        if not token:
            raise S3AccessError(prefix, "listing truncated without a continuation token")


def list_prefix(client: S3Reader, bucket: str, prefix: str) -> dict[str, int]:
    """Every object under `prefix` as {key relative to prefix: size}."""
    return dict(iter_listing(client, bucket, prefix))


def list_trials(
    client: S3Reader, bucket: str, train_prefix: str, on_trial: Callable[[str, Mapping[str, int]], None]
) -> dict[str, dict[str, int]]:
    """One paginated listing of the run's `train/`, grouped by trial; `on_trial(trial, objects)` is called as
    soon as the listing has moved past a trial, so its reads overlap the rest of the listing.

    S3 lists keys in lexicographic order, which keeps a trial's keys contiguous; a store that does not
    (S3 Express directory buckets) gets `on_trial` again for a trial whose keys came back later, with all
    of them. Files directly under `train/` belong to no trial and are ignored.
    """
    trials: dict[str, dict[str, int]] = {}
    announced: set[str] = set()
    late: set[str] = set()
    current: str | None = None
    for rel, size in iter_listing(client, bucket, train_prefix):
        trial, sep, rest = rel.partition("/")
        if not sep or not trial:
            continue
        if trial != current:
            if current is not None:
                on_trial(current, trials[current])
                announced.add(current)
            if trial in announced:
                late.add(trial)
                trials[trial] = dict(trials[trial])  # the announced mapping may be in use: never mutate it
            current = trial
        trials.setdefault(trial, {})[rest] = size
    if current is not None and current not in late:
        on_trial(current, trials[current])
    for trial in sorted(late):
        on_trial(trial, trials[trial])
    return trials


def _has_any_object(client: S3Reader, bucket: str, prefix: str) -> bool:
    page = _s3_call(prefix, client.list_objects_v2, Bucket=bucket, Prefix=prefix, MaxKeys=1)
    return bool(page.get("Contents"))


def read_object(client: S3Reader, bucket: str, key: str, missing_ok: bool = False) -> bytes | None:
    """The whole object (small JSON documents only); None if it does not exist and `missing_ok`."""
    try:
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        try:
            return body.read()
        finally:
            body.close()
    except Exception as exc:
        if missing_ok and _error_code(exc) in ("NoSuchKey", "404"):
            return None
        raise S3AccessError(key, describe_s3_error(exc)) from exc


def hash_object(client: S3Reader, bucket: str, key: str) -> tuple[str, int]:
    """(sha256 hex, bytes read), streaming the object in HASH_CHUNK_BYTES pieces."""
    digest = hashlib.sha256()
    size = 0
    try:
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        try:
            for chunk in body.iter_chunks(HASH_CHUNK_BYTES):
                digest.update(chunk)
                size += len(chunk)
        finally:
            body.close()
    except Exception as exc:
        raise S3AccessError(key, describe_s3_error(exc)) from exc
    return digest.hexdigest(), size


@dataclass(frozen=True)
class TrialFacts:
    """What S3 holds for one trial: its listing, its snapshot and the manifests of its committed checkpoints."""

    objects: TrialObjects
    snapshot: Snapshot | FormatError | None = None
    manifests: Mapping[str, Mapping[str, Manifest | FormatError]] = field(default_factory=dict)


def collect_trial(client: S3Reader, root: S3Uri, trial: str, listing: Mapping[str, int]) -> TrialFacts:
    """Given one trial's listing, read its snapshot, then the manifests of the checkpoints it commits."""
    trial_prefix = root.join(s3_layout.relative_trial_key(trial)).prefix
    objects = TrialObjects.from_listing(trial, listing)
    if not objects.has_snapshot:
        return TrialFacts(objects)
    data = read_object(client, root.bucket, trial_prefix + s3_layout.SNAPSHOT_FILE)
    try:
        snapshot = parse_snapshot(data or b"")
    except FormatError as exc:
        return TrialFacts(objects, exc)
    manifests: dict[str, dict[str, Manifest | FormatError]] = {}
    for name in snapshot.committed:
        contents = objects.dirs.get(name) or {}
        found: dict[str, Manifest | FormatError] = {}
        for manifest_name in manifest_names(contents):
            raw = read_object(client, root.bucket, f"{trial_prefix}{name}/{manifest_name}") or b""
            try:
                found[manifest_name] = parse_manifest(raw, manifest_name)
            except FormatError as exc:
                found[manifest_name] = exc
        manifests[name] = found
    return TrialFacts(objects, snapshot, manifests)


def assess_trial(root: S3Uri, facts: TrialFacts) -> tuple[list[CheckpointAssessment], list[Finding], list[Finding]]:
    """(checkpoints, problems, warnings) of one trial, from facts already read."""
    trial = facts.objects.trial
    trial_prefix = root.join(s3_layout.relative_trial_key(trial)).prefix
    snapshot_key = trial_prefix + s3_layout.SNAPSHOT_FILE
    checkpoint_dirs = facts.objects.checkpoint_like_dirs()
    problems: list[Finding] = []
    warnings: list[Finding] = []
    assessments: list[CheckpointAssessment] = []

    def unverified_rows(status: str) -> list[CheckpointAssessment]:
        return [
            CheckpointAssessment(CheckpointReport(trial, name, f"{trial_prefix}{name}/", False, 0, 0, status), ())
            for name in checkpoint_dirs
        ]

    if facts.snapshot is None:
        if checkpoint_dirs:
            problems.append(
                Finding(
                    MISSING_SNAPSHOT,
                    snapshot_key,
                    f"{len(checkpoint_dirs)} checkpoint dir(s) ({', '.join(checkpoint_dirs[:3])}{', ...' if len(checkpoint_dirs) > 3 else ''}) "
                    "but no Ray snapshot says which are committed",
                )
            )
            assessments += unverified_rows(MISSING_SNAPSHOT)
        return assessments, problems, warnings
    if isinstance(facts.snapshot, FormatError):
        problems.append(Finding(INVALID_SNAPSHOT, snapshot_key, str(facts.snapshot)))
        assessments += unverified_rows(INVALID_SNAPSHOT)
        return assessments, problems, warnings
    snapshot = facts.snapshot
    if snapshot.ray_version != SUPPORTED_RAY_VERSION:
        warnings.append(
            Finding(
                SNAPSHOT_RAY_VERSION,
                snapshot_key,
                f"written by Ray {snapshot.ray_version}; this verifier reads Ray {SUPPORTED_RAY_VERSION}'s format",
            )
        )
    for name in snapshot.committed:
        contents = facts.objects.dirs.get(name)
        assessment = assess_checkpoint(trial, name, f"{trial_prefix}{name}/", contents, facts.manifests.get(name, {}))
        assessments.append(assessment)
        problems += assessment.problems
    for name in checkpoint_dirs:
        if name not in snapshot.committed:
            key = f"{trial_prefix}{name}/"
            warnings.append(
                Finding(UNCOMMITTED_CHECKPOINT, key, "not named by Ray's snapshot: an unfinished or superseded save")
            )
            assessments.append(CheckpointAssessment(CheckpointReport(trial, name, key, False, 0, 0, UNCOMMITTED), ()))
    return assessments, problems, warnings


# ------------------------------------------------------------------------------ orchestration


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
        if isinstance(exc, S3AccessError):
            self.problems.append(Finding(S3_ERROR, exc.key, exc.detail))
        else:
            self.problems.append(Finding(VERIFIER_ERROR, "", describe_s3_error(exc)))
        return None


def _read_retention(client: S3Reader, bucket: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    versioning = _s3_call("", client.get_bucket_versioning, Bucket=bucket)
    try:
        lifecycle = client.get_bucket_lifecycle_configuration(Bucket=bucket)
    except Exception as exc:
        if _error_code(exc) == "NoSuchLifecycleConfiguration":
            return versioning, []
        raise S3AccessError("", describe_s3_error(exc)) from exc
    return versioning, list(lifecycle.get("Rules", []))


def verify_sweep_checkpoints(
    client: S3Reader,
    root: S3Uri | str,
    *,
    deep: bool = False,
    concurrency: int = 8,
    timeout_seconds: float | None = None,
    min_retention_days: int = 30,
    empty_root_ok: bool = False,
    clock: Callable[[], float] = time.monotonic,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> VerificationResult:
    """Verify every committed checkpoint under a run root; S3 errors and timeouts give verified=False, never raise.

    `root` is `s3://bucket/prefix/<ns>/<sweep>-<runId>`; a malformed one raises ValueError (an input error,
    before any request). `concurrency` bounds parallel requests; `timeout_seconds` bounds the whole pass
    (the operator passes spec.deletion.verificationTimeoutSeconds). A root with no object at all is a
    problem (a wrong URI must not pass) unless `empty_root_ok`, for a caller that knows nothing was written.
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
    try:
        _verify(client, uri, deep, pool, deadline, clock, run, min_retention_days, empty_root_ok, now().date())
    except _DeadlineExceeded:
        run.problems.append(Finding(TIMEOUT, uri.prefix, f"verification did not finish within {timeout_seconds:g} s"))
    except Exception as exc:  # fail closed: a bug here must read as "not verified", not as success
        run.problems.append(Finding(VERIFIER_ERROR, uri.prefix, describe_s3_error(exc)))
    finally:
        # Never wait for stragglers after a timeout: their requests end by the client's own timeouts.
        pool.shutdown(wait=False, cancel_futures=True)
    return _result(uri, deep, run, clock() - started, now())


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
) -> None:
    train_prefix = root.join(s3_layout.TRAIN_DIR).prefix
    trial_futures: dict[str, Future[TrialFacts]] = {}

    def on_trial(trial: str, objects: Mapping[str, int]) -> None:
        # Called from the listing thread; a later call for the same trial (an unordered store) replaces it.
        trial_futures[trial] = pool.submit(collect_trial, client, root, trial, objects)

    listing_future = pool.submit(list_trials, client, root.bucket, train_prefix, on_trial)
    result_future = pool.submit(read_object, client, root.bucket, root.join(s3_layout.RESULT_KEY).key, True)
    status_future = pool.submit(read_object, client, root.bucket, root.join(s3_layout.STATUS_KEY).key, True)
    states_future = pool.submit(read_experiment_states, client, root)
    retention_future = pool.submit(_read_retention, client, root.bucket)
    _wait_all([listing_future], deadline, clock)
    trials = run.outcome(listing_future)
    if trials is None:  # the run cannot even be listed: nothing else is worth asking
        return
    empty_future = pool.submit(_has_any_object, client, root.bucket, root.prefix) if not trials else None
    _wait_all(
        [
            *trial_futures.values(),
            result_future,
            status_future,
            states_future,
            retention_future,
            *([empty_future] if empty_future else []),
        ],
        deadline,
        clock,
    )

    facts_by_trial: dict[str, TrialFacts | None] = {}
    for trial, future in trial_futures.items():
        facts = facts_by_trial[trial] = run.outcome(future)
        if facts is None:
            continue
        run.objects_listed += len(facts.objects.files) + sum(len(c) for c in facts.objects.dirs.values())
        assessments, problems, warnings = assess_trial(root, facts)
        run.assessments += assessments
        run.problems += problems
        run.warnings += warnings
    result_data = run.outcome(result_future)
    expected = _expected_trials(root, run, result_data, run.outcome(status_future), run.outcome(states_future))
    run.problems += missing_trial_findings(root, expected, facts_by_trial, run.problems)
    if empty_future is not None and run.outcome(empty_future) is False:
        empty = Finding(
            EMPTY_RUN_ROOT, root.prefix, f"no object under {root}: a wrong URI, or a run that never wrote anything"
        )
        (run.warnings if empty_root_ok else run.problems).append(empty)
    elif not any(a.report.committed for a in run.assessments) and not run.problems:
        run.warnings.append(Finding(NO_CHECKPOINTS, train_prefix, "no trial has committed a checkpoint yet"))

    if deep:
        _hash_checkpoints(client, root, pool, deadline, clock, run)

    if result_data is not None:
        try:
            run.best_uri = best_checkpoint_uri(result_data)
            recorded = recorded_checkpoints(result_data, s3_layout.RESULT_KEY)
        except FormatError as exc:
            run.problems.append(Finding(INVALID_RESULT, root.join(s3_layout.RESULT_KEY).key, str(exc)))
        else:
            verified = [(a.report.trial, a.report.name) for a in run.assessments if a.report.verified]
            finding = check_best_checkpoint(run.best_uri, root, verified)
            if finding:
                run.problems.append(finding)
            best = s3_layout.strip_scheme(run.best_uri or "").rstrip("/")
            for trial, uri in sorted(recorded.items()):
                trial_prefix = root.join(s3_layout.relative_trial_key(trial)).prefix
                if s3_layout.strip_scheme(uri).rstrip("/") == best or any(
                    p.key.startswith(trial_prefix) for p in run.problems
                ):
                    continue  # already judged as the best checkpoint, or the trial is not verified for a named reason
                finding = check_best_checkpoint(
                    uri, root, verified, kind=RECORDED_CHECKPOINT_UNVERIFIED, what=f"trial {trial}'s checkpoint"
                )
                if finding:
                    run.problems.append(finding)

    unread = retention_future.exception()
    if unread is not None:
        detail = unread.detail if isinstance(unread, S3AccessError) else describe_s3_error(unread)
        # Retention only ever yields warnings, so not being allowed to read it must not block a deletion.
        run.warnings.append(
            Finding(RETENTION_UNKNOWN, "", f"could not read the versioning/lifecycle of bucket {root.bucket}: {detail}")
        )
    else:
        versioning, rules = retention_future.result()
        run.warnings += retention_findings(versioning, rules, root, min_retention_days, today)


def read_experiment_states(client: S3Reader, root: S3Uri) -> dict[str, bytes]:
    """Every `tune/experiment_state-*.json` of the run (one per Tune session) by key: one listing of that prefix."""
    prefix = root.join(s3_layout.TUNE_EXPERIMENT_NAME).prefix + EXPERIMENT_STATE_PREFIX
    keys = [prefix + rel for rel, _ in iter_listing(client, root.bucket, prefix) if rel and "/" not in rel]
    return {key: read_object(client, root.bucket, key) or b"" for key in keys}


def _expected_trials(
    root: S3Uri, run: _Run, result_data: bytes | None, status_data: bytes | None, states: Mapping[str, bytes] | None
) -> dict[str, str]:
    """{trial: which record says it checkpointed}, from every record that survives; an unreadable status or
    experiment state is a problem (which trials must have checkpoints is then unknown)."""
    expected: dict[str, str] = {}
    # (key, name shown, bytes, parser, problem kind when unreadable: "" for result.json, judged with its best)
    sources: list[tuple[str, str, bytes, Callable[[bytes, str], dict[str, str]], str]] = []
    if result_data is not None:
        sources.append(
            (root.join(s3_layout.RESULT_KEY).key, s3_layout.RESULT_KEY, result_data, recorded_checkpoints, "")
        )
    if status_data is not None:
        sources.append(
            (
                root.join(s3_layout.STATUS_KEY).key,
                s3_layout.STATUS_KEY,
                status_data,
                recorded_checkpoints,
                INVALID_RECORD,
            )
        )
    for key, data in sorted((states or {}).items()):
        name = key[len(root.prefix) :]
        sources.append((key, name, data, experiment_state_checkpoints, INVALID_RECORD))
    for key, name, data, parse, invalid_kind in sources:
        try:
            found = parse(data, name)
        except FormatError as exc:
            if invalid_kind:
                run.problems.append(Finding(invalid_kind, key, str(exc)))
            continue
        for trial, uri in found.items():
            expected.setdefault(trial, f"{name} records its checkpoint {uri}")
    return expected


def missing_trial_findings(
    root: S3Uri, expected: Mapping[str, str], facts: Mapping[str, TrialFacts | None], problems: Sequence[Finding]
) -> list[Finding]:
    """A problem for each trial the records say checkpointed that has nothing committed in S3 (and no problem yet)."""
    findings: list[Finding] = []
    for trial, why in sorted(expected.items()):
        prefix = root.join(s3_layout.relative_trial_key(trial)).prefix
        if any(p.key.startswith(prefix) for p in problems):
            continue  # already not verified, for a reason named under the trial
        if trial not in facts:
            findings.append(Finding(MISSING_TRIAL, prefix, f"no object under train/{trial}/, but {why} (deleted?)"))
            continue
        trial_facts = facts[trial]
        if trial_facts is None:
            continue  # its S3 error is already a problem
        snapshot = trial_facts.snapshot
        if snapshot is None:
            findings.append(Finding(MISSING_SNAPSHOT, prefix + s3_layout.SNAPSHOT_FILE, f"no Ray snapshot, but {why}"))
        elif isinstance(snapshot, Snapshot) and not snapshot.committed:
            findings.append(Finding(MISSING_CHECKPOINT, prefix, f"Ray's snapshot commits no checkpoint, but {why}"))
    return findings


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
            CheckpointAssessment(replace(a.report, status=failed[(a.report.trial, a.report.name)]), a.problems)
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
