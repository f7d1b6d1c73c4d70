"""Asynchronous checkpoint uploads for the helpers in `checkpointing`: each checkpoint's local directory lives until its
upload has ended (then it is removed, uploaded or not), the manifest is hashed on Ray's upload thread, and at most a
bounded number of checkpoints wait on the local disk: the next report waits for the oldest to finish.

Ray 2.58's `ray.train.report(checkpoint_upload_mode=ASYNC)` runs each upload on one background thread per worker and
hands the report to the controller only once its upload finished; an upload error is raised in the training thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

logger = logging.getLogger(__name__)

UPLOAD_SYNC: Final = "sync"
UPLOAD_ASYNC: Final = "async"
UPLOAD_MODES: Final = (UPLOAD_SYNC, UPLOAD_ASYNC)

# How many checkpoints may wait on a worker's local disk for their upload (the one uploading included).
ENV_MAX_PENDING: Final = "SWEEP_MAX_PENDING_UPLOADS"
DEFAULT_MAX_PENDING: Final = 2

# Local directories are named after their process, so a later process can remove what a killed one left.
_DIR_PREFIX: Final = "sweep-async-ckpt-"


class CheckpointUploadError(RuntimeError):
    """An asynchronous checkpoint upload failed; raised in the training thread at its next report (the cause is the
    upload's own error, which Ray also raises for the trial)."""


def check_upload_mode(upload: str) -> str:
    if upload not in UPLOAD_MODES:
        raise ValueError(f"upload: {upload!r} is not one of {', '.join(map(repr, UPLOAD_MODES))}")
    return upload


def max_pending_uploads(value: int | None = None, env: Mapping[str, str] | None = None) -> int:
    """The bound on checkpoints waiting locally: `value` when given, else `SWEEP_MAX_PENDING_UPLOADS`, else 2."""
    if value is None:
        raw = (os.environ if env is None else env).get(ENV_MAX_PENDING, "").strip()
        try:
            value = int(raw) if raw else DEFAULT_MAX_PENDING
        except ValueError as exc:
            raise ValueError(f"{ENV_MAX_PENDING}: {raw!r} is not a whole number of checkpoints (at least 1)") from exc
    if value < 1:
        raise ValueError(f"max_pending: {value} checkpoints; at least 1 must be allowed to wait for its upload")
    return value


def _remove(directory: Path) -> None:
    try:
        shutil.rmtree(directory)
    except FileNotFoundError:
        pass
    except OSError as exc:  # the checkpoint's fate is decided; a directory left behind is only disk
        logger.warning("could not remove the local checkpoint directory %s: %s", directory, exc)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_leftovers(parent: Path) -> list[Path]:
    """Remove the local checkpoint directories that processes no longer running left under `parent` (a worker killed
    while uploads waited behind a failed one); the ones removed."""
    removed = []
    with contextlib.suppress(FileNotFoundError):
        for entry in parent.iterdir():
            if not entry.name.startswith(_DIR_PREFIX) or not entry.is_dir():
                continue
            pid = entry.name[len(_DIR_PREFIX) :].partition("-")[0]
            if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
                _remove(entry)
                removed.append(entry)
    return removed


Persist = Callable[[Any, str], Any]  # (local Checkpoint, checkpoint_dir_name) -> persisted Checkpoint
Retry = Callable[[Callable[[], Any]], Any]


def _no_retry(attempt: Callable[[], Any]) -> Any:
    return attempt()


class PendingUploads:
    """One worker's checkpoints written locally whose asynchronous upload has not ended.

    The training thread takes a directory (`new_directory`), writes the checkpoint, and reports it with
    `upload_fn(...)` as Ray's `checkpoint_upload_fn`; Ray calls that on its upload thread, where the manifest is
    written, the files uploaded as Ray's default upload does, and the directory removed, whatever the outcome.
    """

    def __init__(self, parent: Path | None = None, retry: Retry = _no_retry):
        self._parent = Path(parent) if parent is not None else Path(tempfile.gettempdir())
        self._retry = retry
        self._changed = threading.Condition()
        self._pending: dict[Path, str] = {}  # directory -> the checkpoint's name
        self._failed: dict[Path, BaseException] = {}
        self._first_failure: tuple[str, BaseException] | None = None
        self._swept = False

    # ------------------------------------------------------------------------------ training thread

    def new_directory(self, name: str) -> Path:
        """A fresh local directory for checkpoint `name`, counted as waiting for its upload from now on."""
        if not self._swept:
            self._swept = True
            remove_leftovers(self._parent)
        directory = Path(tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-", dir=self._parent))
        with self._changed:
            self._pending[directory] = name
        return directory

    def discard(self, directory: Path) -> None:
        """Forget a directory whose upload never started (its write or its report failed) and remove it."""
        with self._changed:
            self._pending.pop(directory, None)
            self._changed.notify_all()
        _remove(directory)

    def wait_for_room(self, limit: int, timeout_s: float | None = None) -> bool:
        """Block until fewer than `limit` checkpoints wait for their upload, so the next one may be written; False if
        `timeout_s` passed first. An upload that failed is raised here (CheckpointUploadError from its error)."""
        with self._changed:
            room = self._changed.wait_for(
                lambda: self._first_failure is not None or len(self._pending) < limit, timeout=timeout_s
            )
            self._raise_failure()
            return room

    def raise_if_failed(self) -> None:
        with self._changed:
            self._raise_failure()

    def _raise_failure(self) -> None:
        if self._first_failure is not None:
            name, error = self._first_failure
            raise CheckpointUploadError(
                f"the asynchronous upload of {name} failed: {type(error).__name__}: {error}"
            ) from error

    # ------------------------------------------------------------------------------ any thread

    def in_flight(self) -> int:
        """How many of this worker's checkpoints are written locally and not yet uploaded (or failed)."""
        with self._changed:
            return len(self._pending)

    def wait_until_idle(self, timeout_s: float | None = None) -> bool:
        """Block until no checkpoint waits for its upload; False if `timeout_s` passed first."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._pending, timeout=timeout_s)

    # ------------------------------------------------------------------------------ Ray's upload thread

    def upload_fn(self, directory: Path, *, prepare: Callable[[Path], Any], persist: Persist) -> Persist:
        """Ray's `checkpoint_upload_fn` for the checkpoint in `directory`: `prepare(directory)` (the manifest), then
        `persist` (Ray's own upload into the Train run dir) under `retry`, then the directory is removed.

        Ray retries a whole upload whose error names a transient S3 failure; this function retries its upload the
        same way itself and, once it has given up and removed the directory, answers Ray's retry with the same
        error, so the error a trial fails with is always the upload's own."""

        def upload(checkpoint: Any, checkpoint_dir_name: str) -> Any:
            with self._changed:
                failed = self._failed.get(directory)
            if failed is not None:
                raise failed
            try:
                prepare(directory)
                persisted = self._retry(lambda: persist(checkpoint, checkpoint_dir_name))
            except BaseException as exc:
                self._ended(directory, exc)
                raise
            self._ended(directory, None)
            return persisted

        return upload

    def _ended(self, directory: Path, error: BaseException | None) -> None:
        _remove(directory)
        with self._changed:
            name = self._pending.pop(directory, directory.name)
            if error is not None:
                self._failed[directory] = error
                if self._first_failure is None:
                    self._first_failure = (name, error)
            self._changed.notify_all()


_worker_uploads: PendingUploads | None = None
_worker_lock = threading.Lock()


def worker_uploads() -> PendingUploads:
    """This worker process's pending uploads (one per process: Ray runs one upload thread per worker)."""
    global _worker_uploads
    with _worker_lock:
        if _worker_uploads is None:
            from . import ray_internals

            _worker_uploads = PendingUploads(retry=ray_internals.retry_checkpoint_upload)
        return _worker_uploads


def report_async(
    metrics: Mapping[str, Any],
    *,
    name: str,
    write: Callable[[Path], Any],
    manifest: Callable[[Path], Any],
    max_pending: int | None = None,
) -> None:
    """Write checkpoint `name` with `write` into a directory that lives until its upload ended, and report it with
    Ray's asynchronous upload; `manifest` runs on the upload thread, before the files go. Waits first while
    `max_pending` checkpoints wait for their upload."""
    import ray.train

    from . import ray_internals

    uploads = worker_uploads()
    uploads.wait_for_room(max_pending_uploads(max_pending))
    directory = uploads.new_directory(name)
    submitted = False
    try:
        write(directory)
        before = ray_internals.report_call_index()
        ray.train.report(
            dict(metrics),
            checkpoint=ray.train.Checkpoint.from_directory(str(directory)),
            checkpoint_dir_name=name,
            checkpoint_upload_mode=ray.train.CheckpointUploadMode.ASYNC,
            # The upload function removes the directory once its upload ended, a failed one included.
            delete_local_checkpoint_after_upload=False,
            checkpoint_upload_fn=uploads.upload_fn(
                directory, prepare=manifest, persist=ray.train.get_context().get_storage().persist_current_checkpoint
            ),
        )
        # Ray skips a report (returns, nothing submitted) when a worker failed while the ranks agreed on the name.
        submitted = ray_internals.report_call_index() != before
    finally:
        if not submitted:
            uploads.discard(directory)


# ---------------------------------------------------------------------------- for a graceful stop


def uploads_in_flight() -> int:
    """How many checkpoints our helpers wrote in this worker that have not finished uploading (0 when none was
    reported asynchronously). A loop's own `CheckpointUploadMode.ASYNC` reports are not counted here."""
    return _worker_uploads.in_flight() if _worker_uploads is not None else 0
