"""Commit records: after Ray commits a checkpoint, every file in it with its size and the store's fingerprint, so a
checkpoint written by any loop can be proven complete and unchanged (the document: sweep_contracts.commit_record).

A Train callback writes them on the controller, off its event loop; the trial driver and the sweep driver backfill
what a controller that died left unrecorded (Ray's snapshot already named the checkpoint, our record did not follow).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import hashlib
import json
import logging
import os
import posixpath
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from ray.train.v2.api.callback import UserCallback

from sweep_contracts import commit_record, s3_layout
from sweep_contracts.timestamps import rfc3339

from . import ray_internals
from .trial_stop import committed_checkpoint_names

logger = logging.getLogger(__name__)

# How long the controller waits, at its shutdown or abort, for records still being written; env var to change it.
ENV_RECORD_TIMEOUT: Final = "SWEEP_COMMIT_RECORD_TIMEOUT_S"
DEFAULT_RECORD_TIMEOUT_S: Final = 30.0
# Per request: a record is one listing and one small PUT; a store that does not answer must not hold a trial.
_CONNECT_TIMEOUT_S: Final = 5
_READ_TIMEOUT_S: Final = 20
_HASH_CHUNK: Final = 1 << 20


def record_timeout_s(env: Mapping[str, str] | None = None) -> float:
    raw = (os.environ if env is None else env).get(ENV_RECORD_TIMEOUT, "")
    try:
        value = float(raw) if raw else DEFAULT_RECORD_TIMEOUT_S
    except ValueError:
        return DEFAULT_RECORD_TIMEOUT_S
    return value if value > 0 else DEFAULT_RECORD_TIMEOUT_S


# ------------------------------------------------------------------------------------------- stores


class Store(Protocol):
    """What records need of a run root: small reads and writes, and a listing with each file's fingerprint."""

    fingerprint: str

    def read(self, location: str) -> bytes | None: ...

    def write(self, location: str, data: bytes) -> None: ...

    def list(self, location: str) -> dict[str, tuple[int, str]]: ...

    def exists(self, location: str) -> bool: ...


class S3Store:
    """boto3, because the fingerprint is the ETag of a listing (pyarrow's file info has none): recording a checkpoint
    reads none of its data. Endpoint and region come from the same variables Ray's pyarrow uses."""

    fingerprint = commit_record.FINGERPRINT_S3_ETAG

    def __init__(self, client: Any | None = None):
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = _s3_client()
        return self._client

    def read(self, location: str) -> bytes | None:
        uri = s3_layout.S3Uri.parse(location)
        try:
            body = self.client.get_object(Bucket=uri.bucket, Key=uri.key)["Body"]
        except Exception as exc:
            if _error_code(exc) in ("NoSuchKey", "404"):
                return None
            raise OSError(f"cannot read {location}: {exc}") from exc
        try:
            return bytes(body.read())
        finally:
            body.close()

    def write(self, location: str, data: bytes) -> None:
        uri = s3_layout.S3Uri.parse(location)
        try:
            self.client.put_object(Bucket=uri.bucket, Key=uri.key, Body=data, ContentType="application/json")
        except Exception as exc:
            raise OSError(f"cannot write {location}: {exc}") from exc

    def list(self, location: str) -> dict[str, tuple[int, str]]:
        uri = s3_layout.S3Uri.parse(location)
        found: dict[str, tuple[int, str]] = {}
        try:
            for page in self.pages(uri):
                for obj in page.get("Contents", []):
                    rel = obj["Key"][len(uri.prefix) :]
                    if rel and not rel.endswith("/"):
                        found[rel] = (int(obj.get("Size", 0)), commit_record.normalize_etag(str(obj.get("ETag", ""))))
        except Exception as exc:
            raise OSError(f"cannot list {location}: {exc}") from exc
        return found

    def exists(self, location: str) -> bool:
        uri = s3_layout.S3Uri.parse(location)
        try:
            page = self.client.list_objects_v2(Bucket=uri.bucket, Prefix=uri.key, MaxKeys=1)
        except Exception as exc:
            raise OSError(f"cannot list {location}: {exc}") from exc
        return any(obj.get("Key") == uri.key for obj in page.get("Contents", []))

    def pages(self, uri: s3_layout.S3Uri, delimiter: str = "") -> Iterator[dict[str, Any]]:
        """ListObjectsV2 pages under `uri`'s prefix."""
        token = ""
        while True:
            kwargs: dict[str, Any] = {"Bucket": uri.bucket, "Prefix": uri.prefix}
            if delimiter:
                kwargs["Delimiter"] = delimiter
            if token:
                kwargs["ContinuationToken"] = token
            page = self.client.list_objects_v2(**kwargs)
            yield page
            token = page.get("NextContinuationToken") or ""
            if not page.get("IsTruncated") or not token:
                return


class LocalStore:
    """A local directory (run-local): no ETag, so files are fingerprinted by sha256."""

    fingerprint = commit_record.FINGERPRINT_SHA256

    def read(self, location: str) -> bytes | None:
        try:
            with open(location, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def write(self, location: str, data: bytes) -> None:
        os.makedirs(os.path.dirname(location), exist_ok=True)
        tmp = f"{location}.tmp-{os.getpid()}-{threading.get_ident()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, location)

    def exists(self, location: str) -> bool:
        return os.path.isfile(location)

    def list(self, location: str) -> dict[str, tuple[int, str]]:
        found: dict[str, tuple[int, str]] = {}
        for folder, _, files in os.walk(location):
            for name in files:
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, location).replace(os.sep, "/")
                digest = hashlib.sha256()
                with open(path, "rb") as f:
                    for chunk in iter(lambda: f.read(_HASH_CHUNK), b""):
                        digest.update(chunk)
                found[rel] = (os.path.getsize(path), digest.hexdigest())
        return found


@functools.lru_cache(maxsize=1)
def _s3_client() -> Any:
    import boto3
    from botocore.config import Config

    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None
    config = Config(
        connect_timeout=_CONNECT_TIMEOUT_S,
        read_timeout=_READ_TIMEOUT_S,
        retries={"max_attempts": 4, "mode": "standard"},
    )
    return boto3.client("s3", region_name=region, config=config)


def _error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    return str(((response or {}).get("Error") or {}).get("Code", "")) if isinstance(response, dict) else ""


def store_for(location: str) -> Store:
    return S3Store() if s3_layout.is_s3_uri(location) else LocalStore()


# ------------------------------------------------------------------------------------------ records


@dataclass(frozen=True)
class RecordOutcome:
    checkpoint: str
    written: bool
    why: str  # "recorded", "not committed", "no files"


def _committed(store: Store, trial_dir: str) -> set[str] | None:
    """The checkpoint folders Ray's snapshot commits; None when the trial has no (readable) snapshot."""
    data = store.read(s3_layout.join(trial_dir, ray_internals.SNAPSHOT_FILENAME))
    if data is None:
        return None
    try:
        snapshot = json.loads(data)
    except ValueError:
        return None
    return committed_checkpoint_names(snapshot) if isinstance(snapshot, dict) else None


def _record_bytes(name: str, files: Mapping[str, tuple[int, str]], fingerprint: str, backfilled: bool) -> bytes:
    entries = [(rel, size, value) for rel, (size, value) in files.items() if rel != s3_layout.COMMIT_RECORD_FILE]
    document = commit_record.record_document(
        name, entries, fingerprint=fingerprint, recorded_at=rfc3339(), backfilled=backfilled
    )
    return json.dumps(document, indent=1, sort_keys=True).encode()


def record_checkpoint(checkpoint_dir: str, store: Store | None = None) -> RecordOutcome:
    """Write the commit record of one checkpoint Ray has committed (its snapshot names it), listing what is there.

    Called after Ray's checkpoint manager registered the checkpoint: every file was uploaded before the report reached
    the controller, and retention may already have deleted it again (then nothing is written)."""
    store = store or store_for(checkpoint_dir)
    name = posixpath.basename(checkpoint_dir.rstrip("/"))
    committed = _committed(store, posixpath.dirname(checkpoint_dir.rstrip("/")))
    if committed is None or name not in committed:
        return RecordOutcome(name, False, "not committed")
    files = {k: v for k, v in store.list(checkpoint_dir).items() if k != s3_layout.COMMIT_RECORD_FILE}
    if not files:
        return RecordOutcome(name, False, "no files")
    store.write(
        s3_layout.join(checkpoint_dir, s3_layout.COMMIT_RECORD_FILE),
        _record_bytes(name, files, store.fingerprint, backfilled=False),
    )
    return RecordOutcome(name, True, "recorded")


def backfill_trial(trial_dir: str, store: Store | None = None) -> list[str]:
    """Write the missing commit records of one Train run's committed checkpoints; the names written. What a
    controller that died after Ray's snapshot and before our record left unproven. Only a checkpoint without a
    record is listed (a local directory's files are hashed to be listed)."""
    store = store or store_for(trial_dir)
    committed = _committed(store, trial_dir)
    written = []
    for name in sorted(committed or ()):
        checkpoint_dir = s3_layout.join(trial_dir, name)
        location = s3_layout.join(checkpoint_dir, s3_layout.COMMIT_RECORD_FILE)
        if store.exists(location):
            continue
        files = {k: v for k, v in store.list(checkpoint_dir).items() if k != s3_layout.COMMIT_RECORD_FILE}
        if not files:
            continue  # deleted since, or never there: the verifier says which
        store.write(location, _record_bytes(name, files, store.fingerprint, backfilled=True))
        written.append(name)
    if written:
        logger.info("backfilled %d commit record(s) under %s: %s", len(written), trial_dir, ", ".join(written))
    return written


def _trial_dirs(train_root: str, store: Store) -> Iterator[str]:
    if isinstance(store, S3Store):
        uri = s3_layout.S3Uri.parse(train_root)
        for page in store.pages(uri, delimiter="/"):
            for common in page.get("CommonPrefixes", []):
                trial = common["Prefix"][len(uri.prefix) :].strip("/")
                if trial:
                    yield s3_layout.join(train_root, trial)
        return
    with contextlib.suppress(FileNotFoundError):
        for entry in sorted(os.scandir(train_root), key=lambda e: e.name):
            if entry.is_dir():
                yield s3_layout.join(train_root, entry.name)


def backfill_run(train_root: str, timeout_s: float | None = None, store: Store | None = None) -> list[str]:
    """Backfill every trial of a run (`<run root>/train`), best effort and bounded: `trial/checkpoint` names written.
    The sweep driver calls it before its final records, so a trial stopped mid-record is proven all the same."""
    store = store or store_for(train_root)
    deadline = time.monotonic() + (timeout_s if timeout_s is not None else record_timeout_s())
    written: list[str] = []
    try:
        for trial_dir in _trial_dirs(train_root, store):
            if time.monotonic() > deadline:
                logger.warning("commit records: backfill of %s stopped at its time limit", train_root)
                break
            try:
                written += [f"{posixpath.basename(trial_dir)}/{n}" for n in backfill_trial(trial_dir, store)]
            except OSError as exc:
                logger.warning("commit records: could not backfill %s: %s", trial_dir, exc)
    except Exception as exc:  # listing the run failed: the verifier will say which checkpoints are unproven
        logger.warning("commit records: could not list %s: %s", train_root, exc)
    return written


# ------------------------------------------------------------------------------------------ the callback


class CommitRecordCallback(UserCallback, ray_internals.ControllerCallback):
    """Runs in the Train controller: after each report with a checkpoint (Ray's checkpoint manager has registered it,
    written its snapshot and applied retention by then), writes the checkpoint's commit record on a background thread,
    so a slow store never holds the controller's event loop; waits for records in flight, bounded, at the
    controller's shutdown and abort."""

    def __init__(self, train_run_dir: str, timeout_s: float | None = None):
        self._train_run_dir = train_run_dir
        self._timeout_s = timeout_s if timeout_s is not None else record_timeout_s()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: list[concurrent.futures.Future[RecordOutcome]] = []

    def __getstate__(self) -> dict[str, Any]:
        # The callback is pickled into the controller actor: threads and futures stay behind.
        return {**self.__dict__, "_pool": None, "_pending": []}

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        if checkpoint is None:
            return
        if self._pool is None:
            # One thread: records are written in report order, and at most one request at a time per trial.
            self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="commit-record")
        location = s3_layout.join(self._train_run_dir, posixpath.basename(str(checkpoint.path).rstrip("/")))
        future = self._pool.submit(record_checkpoint, location)
        future.add_done_callback(_log_outcome)
        self._pending = [f for f in self._pending if not f.done()] + [future]

    async def before_controller_shutdown(self) -> None:
        pending = [asyncio.wrap_future(f) for f in self._pending if not f.done()]
        if pending:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), self._timeout_s)
        self._shutdown()

    def before_controller_abort(self) -> None:
        concurrent.futures.wait([f for f in self._pending if not f.done()], timeout=self._timeout_s)
        self._shutdown()

    def _shutdown(self) -> None:
        unfinished = sum(1 for f in self._pending if not f.done())
        if unfinished:
            logger.warning("commit records: %d not written in time; the trial's next start or the driver backfills "
                           "them", unfinished)  # fmt: skip
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _log_outcome(future: concurrent.futures.Future[RecordOutcome]) -> None:
    exc = future.exception() if not future.cancelled() else None
    if exc is not None:
        logger.warning("commit records: could not record a checkpoint (backfilled later): %s", exc)
    elif not future.cancelled():
        outcome = future.result()
        logger.debug("commit record of %s: %s", outcome.checkpoint, outcome.why)
