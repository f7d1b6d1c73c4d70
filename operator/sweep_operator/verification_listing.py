"""The verifier's S3 access: one paginated listing of a run's `train/` handed out trial by trial as it passes
(so reads overlap the listing), whole small objects, streamed hashes, the bucket's retention settings; every failure
an S3AccessError naming the key."""

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

from .verification_assessment import TrialFacts, TrialObjects, manifest_names
from .verification_records import parse_snapshot

HASH_CHUNK_BYTES: Final = 1 << 20  # deep mode holds at most concurrency x 1 MiB of object data
_LIST_PAGE_SIZE: Final = 1000
# A run's train/ holds trials x kept checkpoints x ranks x files: thousands, rarely more. The listing is held in
# memory, and anyone whose code writes the run root decides its size: past this many keys the run is not verified
# (a finding naming the bound) rather than the operator's memory spent on it.
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


def iter_listing(
    client: S3Reader,
    bucket: str,
    prefix: str,
    *,
    stop: threading.Event | None = None,
    limit: int = MAX_LISTED_OBJECTS,
) -> Iterator[tuple[str, int, str]]:
    """Every object under `prefix` as (key relative to prefix, size, ETag without quotes), paginated (ListObjectsV2,
    1000 a page); at most `limit` keys (TooManyObjects past it), and no page asked for once `stop` is set
    (ListingStopped)."""
    token: str | None = None
    listed = 0
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
    for rel, size, etag in iter_listing(client, bucket, train_prefix, stop=stop, limit=limit):
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


# A run's JSON records (status, result, Train's snapshots, manifests, Tune's experiment state) are written by the
# tenant's code: the operator reads at most this much of one, so an outsized object cannot exhaust its memory
# (the guard then holds, naming the object; progress is best effort).
MAX_DOCUMENT_BYTES = 16 * 1024 * 1024


class DocumentTooLarge(ValueError):
    """An S3 object over MAX_DOCUMENT_BYTES where the operator expects a JSON record."""


def read_document(response: Mapping[str, Any], key: str, limit: int = MAX_DOCUMENT_BYTES) -> bytes:
    """The body of a `get_object` answer, at most `limit` bytes read (DocumentTooLarge beyond it); closed after."""
    body = response["Body"]
    try:
        size = response.get("ContentLength")
        if isinstance(size, int) and size > limit:
            raise DocumentTooLarge(f"{key} is {size} bytes, more than the {limit} the operator reads of a run's record")
        data = body.read(limit + 1)
        if len(data) > limit:
            raise DocumentTooLarge(f"{key} is more than the {limit} bytes the operator reads of a run's record")
        return data
    finally:
        close = getattr(body, "close", None)
        if close is not None:
            close()


def read_object(client: S3Reader, bucket: str, key: str, missing_ok: bool = False) -> bytes | None:
    """The whole object (small JSON documents only, at most MAX_DOCUMENT_BYTES); None if it does not exist and
    `missing_ok`."""
    try:
        return read_document(client.get_object(Bucket=bucket, Key=key), key)
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


def read_experiment_states(client: S3Reader, root: S3Uri) -> dict[str, bytes]:
    """Every `tune/experiment_state-*.json` of the run (one per Tune session) by key: one listing of that prefix."""
    prefix = root.join(s3_layout.TUNE_EXPERIMENT_NAME).prefix + EXPERIMENT_STATE_PREFIX
    keys = [prefix + rel for rel, _, _ in iter_listing(client, root.bucket, prefix) if rel and "/" not in rel]
    return {key: read_object(client, root.bucket, key) or b"" for key in keys}
