"""The verifier's S3 access: one paginated listing of a run's `train/` handed out trial by trial as it passes, whole
small objects, streamed hashes, bucket retention.

Reads overlap the listing; every failure is an S3AccessError naming the key.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, Protocol

from sweep_contracts import s3_layout
from sweep_contracts.checkpoint_manifest import (
    FormatError,
    Manifest,
    parse_manifest,
)
from sweep_contracts.commit_record import CommitRecord, normalize_etag, parse_record
from sweep_contracts.s3_layout import S3Uri
from sweep_contracts.tune_state import EXPERIMENT_STATE_PREFIX

from ..memory_budget import (
    LISTED_KEY_OVERHEAD_BYTES,
    MAX_DOCUMENT_BYTES,
    DocumentBounds,
    DocumentTooLarge,
    VerificationBudget,
    bytes_over,
    check_json_shape,
)
from .assessment import TrialFacts, TrialObjects, manifest_names
from .records import experiment_state_checkpoints, parse_snapshot

HASH_CHUNK_BYTES: Final = 1 << 20  # deep mode holds at most concurrency x 1 MiB of object data
_READ_CHUNK_BYTES: Final = 1 << 20  # a document is read in pieces, so a verification that ended stops reading it
_LIST_PAGE_SIZE: Final = 1000
# A run's train/ holds trials x kept checkpoints x ranks x files: thousands, rarely more. The listing is held in
# memory, and anyone whose code writes the run root decides its size: past this many keys, or past the bytes of the
# verification's memory budget (memory_budget.VerificationBudget.listing_bytes), the run is not verified (a finding
# naming the bound) rather than the operator's memory spent on it.
MAX_LISTED_OBJECTS: Final = 1_000_000


class S3Reader(Protocol):
    """The subset of a boto3 S3 client the verifier uses (inject a real client or a fake)."""

    def list_objects_v2(self, **kwargs: Any) -> dict[str, Any]: ...

    def get_object(self, **kwargs: Any) -> dict[str, Any]: ...

    def get_bucket_versioning(self, **kwargs: Any) -> dict[str, Any]: ...

    def get_bucket_lifecycle_configuration(self, **kwargs: Any) -> dict[str, Any]: ...


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


class TooManyObjects(S3AccessError):
    """More keys under a prefix than the verifier lists (MAX_LISTED_OBJECTS)."""


class ListingStopped(S3AccessError):
    """The verification this listing served is over (its deadline passed): no further page is asked for."""


class OverBudget(S3AccessError):
    """A run's record, or its records together, over what the operator reads of them (its memory budget)."""


def iter_listing(
    client: S3Reader,
    bucket: str,
    prefix: str,
    *,
    stop: threading.Event | None = None,
    limit: int = MAX_LISTED_OBJECTS,
    max_bytes: int | None = None,
) -> Iterator[tuple[str, int, str]]:
    """Every object under `prefix` as (key relative to prefix, size, ETag without quotes), paginated (ListObjectsV2,
    1000 a page); at most `limit` keys and `max_bytes` of them as the verifier holds them (TooManyObjects past
    either), and no page asked for once `stop` is set (ListingStopped)."""
    token: str | None = None
    listed = held = 0
    while True:
        if stop is not None and stop.is_set():
            raise ListingStopped(prefix, "the verification ended before the listing did")
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": _LIST_PAGE_SIZE}
        if token:
            kwargs["ContinuationToken"] = token
        page = _s3_call(prefix, client.list_objects_v2, **kwargs)
        contents = page.get("Contents", [])
        listed += len(contents)
        if listed > limit:
            raise TooManyObjects(
                prefix, f"more than {limit} objects under it; the verifier lists at most {limit} (docs/guard.md)"
            )
        if max_bytes is not None:
            held += sum(2 * (len(obj["Key"]) - len(prefix)) + LISTED_KEY_OVERHEAD_BYTES for obj in contents)
            if held > max_bytes:
                raise TooManyObjects(
                    prefix,
                    f"its keys take more than {max_bytes // 1024} KiB as the verifier holds them (after {listed} "
                    "objects), more than one verification's share of the operator's memory (docs/guard.md)",
                )
        for obj in contents:
            yield obj["Key"][len(prefix) :], int(obj.get("Size", 0)), normalize_etag(str(obj.get("ETag", "")))
        if not page.get("IsTruncated"):
            return
        token = page.get("NextContinuationToken")
        if not token:
            raise S3AccessError(prefix, "listing truncated without a continuation token")


def list_prefix(client: S3Reader, bucket: str, prefix: str) -> dict[str, int]:
    """Every object under `prefix` as {key relative to prefix: size}."""
    return {rel: size for rel, size, _ in iter_listing(client, bucket, prefix)}


def list_trials(
    client: S3Reader,
    bucket: str,
    train_prefix: str,
    on_trial: Callable[[str, Mapping[str, int], Mapping[str, str]], None],
    *,
    stop: threading.Event | None = None,
    limit: int = MAX_LISTED_OBJECTS,
    max_bytes: int | None = None,
) -> dict[str, dict[str, int]]:
    """One paginated listing of the run's `train/`, grouped by trial; `on_trial(trial, sizes, etags)` is called as
    soon as the listing has moved past a trial, so its reads overlap the rest of the listing.

    S3 lists keys in lexicographic order, which keeps a trial's keys contiguous; a store that does not
    (S3 Express directory buckets) gets `on_trial` again for a trial whose keys came back later, with all
    of them. Files directly under `train/` belong to no trial and are ignored.
    """
    trials: dict[str, dict[str, int]] = {}
    etags: dict[str, dict[str, str]] = {}
    announced: set[str] = set()
    late: set[str] = set()
    current: str | None = None
    for rel, size, etag in iter_listing(client, bucket, train_prefix, stop=stop, limit=limit, max_bytes=max_bytes):
        trial, sep, rest = rel.partition("/")
        if not sep or not trial:
            continue
        if trial != current:
            if current is not None:
                on_trial(current, trials[current], etags[current])
                announced.add(current)
            if trial in announced:
                late.add(trial)
                # the announced mappings may be in use: never mutate them
                trials[trial], etags[trial] = dict(trials[trial]), dict(etags[trial])
            current = trial
        trials.setdefault(trial, {})[rest] = size
        etags.setdefault(trial, {})[rest] = etag
    if current is not None and current not in late:
        on_trial(current, trials[current], etags[current])
    for trial in sorted(late):
        on_trial(trial, trials[trial], etags[trial])
    return trials


def has_any_object(client: S3Reader, bucket: str, prefix: str) -> bool:
    page = _s3_call(prefix, client.list_objects_v2, Bucket=bucket, Prefix=prefix, MaxKeys=1)
    return bool(page.get("Contents"))


# Train's snapshots, our manifests and commit records (written by the tenant's code) are read up to
# MAX_DOCUMENT_BYTES, so an outsized object cannot exhaust the operator's memory (the guard then holds, naming the
# object); a run's status and result documents and Tune's experiment states have bounds of their own, from the memory
# budget (memory_budget.py).


def read_document(
    response: Mapping[str, Any], key: str, limit: int = MAX_DOCUMENT_BYTES, *, stop: threading.Event | None = None
) -> bytes:
    """The body of a `get_object` answer, at most `limit` bytes read (DocumentTooLarge beyond it) in pieces, no
    further piece once `stop` is set (ListingStopped); closed after."""
    body = response["Body"]
    try:
        size = response.get("ContentLength")
        if isinstance(size, int) and size > limit:
            raise bytes_over(size, key, limit)
        if stop is None:
            data = body.read(limit + 1)
        else:
            pieces, got = [], 0
            while got <= limit:
                if stop.is_set():
                    raise ListingStopped(key, "the verification ended before this record was read")
                piece = body.read(min(_READ_CHUNK_BYTES, limit + 1 - got))
                if not piece:
                    break
                pieces.append(piece)
                got += len(piece)
            data = b"".join(pieces)
        if len(data) > limit:
            raise DocumentTooLarge(f"{key} is more than the {limit} bytes the operator reads of it")
        return data
    finally:
        close = getattr(body, "close", None)
        if close is not None:
            close()


def read_object(
    client: S3Reader,
    bucket: str,
    key: str,
    missing_ok: bool = False,
    *,
    limit: int = MAX_DOCUMENT_BYTES,
    stop: threading.Event | None = None,
) -> bytes | None:
    """The whole object (small JSON documents only, at most `limit` bytes); None if it does not exist and
    `missing_ok`."""
    try:
        return read_document(client.get_object(Bucket=bucket, Key=key), key, limit, stop=stop)
    except ListingStopped:
        raise
    except Exception as exc:
        if missing_ok and _error_code(exc) in ("NoSuchKey", "404"):
            return None
        raise S3AccessError(key, describe_s3_error(exc)) from exc


def read_record(client: S3Reader, bucket: str, key: str, bounds: DocumentBounds) -> bytes | None:
    """A run's `_sweep/status.json` or `result.json` as bytes whose size, nesting and element count are within
    `bounds` (OverBudget naming the bound otherwise), None when absent; the parse is the caller's."""
    try:
        data = read_object(client, bucket, key, True, limit=bounds.max_bytes)
    except S3AccessError as exc:
        if isinstance(exc.__cause__, DocumentTooLarge):
            raise OverBudget(key, str(exc.__cause__)) from exc
        raise
    if data is not None:
        try:
            check_json_shape(data.decode("utf-8", "replace"), key, bounds)
        except DocumentTooLarge as exc:
            raise OverBudget(key, str(exc)) from None
    return data


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


def collect_trial(
    client: S3Reader, root: S3Uri, trial: str, listing: Mapping[str, int], etags: Mapping[str, str] | None = None
) -> TrialFacts:
    """Given one trial's listing, read its snapshot, then the manifests and commit records of the checkpoints it
    commits."""
    trial_prefix = root.join(s3_layout.relative_trial_key(trial)).prefix
    objects = TrialObjects.from_listing(trial, listing, etags)
    if not objects.has_snapshot:
        return TrialFacts(objects)
    data = read_object(client, root.bucket, trial_prefix + s3_layout.SNAPSHOT_FILE)
    try:
        snapshot = parse_snapshot(data or b"")
    except FormatError as exc:
        return TrialFacts(objects, exc)
    manifests: dict[str, dict[str, Manifest | FormatError]] = {}
    records: dict[str, CommitRecord | FormatError] = {}
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
        if s3_layout.COMMIT_RECORD_FILE in contents:
            raw = read_object(client, root.bucket, f"{trial_prefix}{name}/{s3_layout.COMMIT_RECORD_FILE}") or b""
            try:
                records[name] = parse_record(raw, s3_layout.COMMIT_RECORD_FILE)
            except FormatError as exc:
                records[name] = exc
    return TrialFacts(objects, snapshot, manifests, records)


def read_retention(client: S3Reader, bucket: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    versioning = _s3_call("", client.get_bucket_versioning, Bucket=bucket)
    try:
        lifecycle = client.get_bucket_lifecycle_configuration(Bucket=bucket)
    except Exception as exc:
        if _error_code(exc) == "NoSuchLifecycleConfiguration":
            return versioning, []
        raise S3AccessError("", describe_s3_error(exc)) from exc
    return versioning, list(lifecycle.get("Rules", []))


def read_experiment_states(
    client: S3Reader, root: S3Uri, budget: VerificationBudget, *, stop: threading.Event | None = None
) -> dict[str, dict[str, str] | FormatError]:
    """Which trials checkpointed, by each `tune/experiment_state-*.json` of the run (one per Tune session): {key:
    {trial: checkpoint path}, or the FormatError that makes it unreadable}. One listing of that prefix, then the files
    one at a time, each parsed and dropped before the next is read; past the budget's count or bytes, OverBudget
    naming the bound (the verification then fails closed), and nothing more is read once `stop` is set."""
    prefix = root.join(s3_layout.TUNE_EXPERIMENT_NAME).prefix + EXPERIMENT_STATE_PREFIX
    where, files = prefix + "*.json", list[tuple[str, int]]()
    # Tune writes nothing else under this prefix: a few times the files' bound is all a run may have there.
    for rel, size, _ in iter_listing(client, root.bucket, prefix, stop=stop, limit=4 * budget.experiment_state_files):
        if rel and "/" not in rel:
            files.append((prefix + rel, size))
        if len(files) > budget.experiment_state_files:
            raise OverBudget(
                where,
                f"more than {budget.experiment_state_files} experiment states; the verifier reads at most "
                f"{budget.experiment_state_files} of a run (one per Tune session)",
            )
    total = sum(size for _, size in files)
    if total > budget.experiment_state_bytes:
        raise OverBudget(where, _states_over(total, budget))
    bounds, states, read = budget.experiment_state_bounds, dict[str, dict[str, str] | FormatError](), 0
    for key, _ in files:
        # Each read is bounded by what is left of the budget, whatever size the listing said.
        left = min(bounds.max_bytes, budget.experiment_state_bytes - read)
        try:
            data = read_object(client, root.bucket, key, limit=left, stop=stop) or b""
        except S3AccessError as exc:
            if isinstance(exc.__cause__, DocumentTooLarge):
                raise OverBudget(where, _states_over(read + left + 1, budget)) from exc
            raise
        read += len(data)
        try:
            states[key] = experiment_state_checkpoints(data, key[len(root.prefix) :], bounds)
        except DocumentTooLarge as exc:
            raise OverBudget(key, str(exc)) from None
        except FormatError as exc:
            states[key] = exc
        del data
    return states


def _states_over(size: int, budget: VerificationBudget) -> str:
    return (
        f"the run's experiment states take more than {budget.experiment_state_bytes} bytes ({size} or more), more "
        "than one verification's share of the operator's memory reads of them (docs/guard.md)"
    )
