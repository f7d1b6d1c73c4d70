"""Asynchronous checkpoint uploads in our helpers, without Ray: the local directory lives until its upload ended (and
never leaks), the manifest is hashed on the upload thread, at most a bounded number of checkpoints wait locally, and a
failed upload surfaces as the upload's own error.

`FakeRayAsync` stands in for `ray.train.report(checkpoint_upload_mode=ASYNC)` as ray 2.58 runs it
(ray/train/v2/_internal/execution/context.py, `TrainContext.report` and `_upload_checkpoint`): one upload thread per
worker, the `checkpoint_upload_fn` called there under a retry of errors naming a transient S3 failure (3 attempts),
the local directory deleted only when `delete_local_checkpoint_after_upload` asks for it and only after a success.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from ray.train import Checkpoint, CheckpointUploadMode

from sweep_contracts import s3_layout
from training_entrypoints import async_upload, checkpointing, ray_internals
from training_entrypoints.async_upload import CheckpointUploadError, PendingUploads
from training_entrypoints.checkpointing import manifest_problems, report_epoch, report_sharded_epoch

RAY_RETRYABLE = ("AWS Error SLOW_DOWN", "AWS Error NETWORK_CONNECTION")


def ray_like_retry(attempt: Callable[[], Any], attempts: int = 3) -> Any:
    """Ray's retry of `_upload_checkpoint` (match the error's text, retry up to 3 attempts), without its backoff."""
    for i in range(attempts):
        try:
            return attempt()
        except Exception as exc:
            if not any(token in str(exc) for token in RAY_RETRYABLE) or i + 1 == attempts:
                raise
    raise AssertionError("unreachable")


class Storage:
    """The Train run dir on 'remote' storage: Ray's default upload copies a checkpoint's files into `<name>/`."""

    def __init__(self, root: Path):
        self.root = root
        self.gates: dict[str, threading.Event] = {}  # a checkpoint's upload waits for its gate, when it has one
        self.fail: dict[str, list[BaseException]] = {}  # errors a checkpoint's next upload attempts raise
        self.events: list[str] = []
        self.attempts: dict[str, int] = {}
        self.lock = threading.Lock()

    def hold(self, name: str) -> threading.Event:
        self.gates[name] = threading.Event()
        return self.gates[name]

    def persist_current_checkpoint(self, checkpoint: Checkpoint, name: str) -> Checkpoint:
        with self.lock:
            self.attempts[name] = self.attempts.get(name, 0) + 1
        if name in self.gates:
            assert self.gates[name].wait(timeout=30), f"{name}: never released"
        if self.fail.get(name):
            raise self.fail[name].pop(0)
        shutil.copytree(checkpoint.path, self.root / name, dirs_exist_ok=True)
        with self.lock:
            self.events.append(f"uploaded {name}")
        return Checkpoint.from_directory(str(self.root / name))


class FakeRayAsync:
    """`ray.train.report`, `ray.train.get_context` and the report counter of one Train worker."""

    def __init__(self, storage: Storage):
        self.storage = storage
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="upload")
        self.reports: list[dict[str, Any]] = []
        self.futures: list[concurrent.futures.Future[Any]] = []
        self.report_call_index = 0
        self.skip_next = False  # Ray skips a report when the ranks' barrier was reset

    def report(self, metrics: dict[str, Any], checkpoint: Checkpoint | None = None, **kwargs: Any) -> None:
        if self.skip_next:
            self.skip_next = False
            return
        self.report_call_index += 1
        self.reports.append({"metrics": metrics, "checkpoint": checkpoint, **kwargs})
        if checkpoint is None or kwargs.get("checkpoint_upload_mode") != CheckpointUploadMode.ASYNC:
            return
        upload_fn = kwargs["checkpoint_upload_fn"]
        name = kwargs["checkpoint_dir_name"]

        def upload_and_report() -> Any:
            persisted = ray_like_retry(lambda: upload_fn(checkpoint, name))
            if kwargs.get("delete_local_checkpoint_after_upload"):
                shutil.rmtree(checkpoint.path)
            return persisted

        self.futures.append(self.pool.submit(upload_and_report))

    def get_context(self) -> Any:
        storage = self.storage

        class Context:
            def get_storage(self) -> Any:
                return storage

        return Context()


@pytest.fixture
def ray_async(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRayAsync]:
    import ray.train

    fake = FakeRayAsync(Storage(tmp_path / "remote"))
    monkeypatch.setattr(ray.train, "report", fake.report)
    monkeypatch.setattr(ray.train, "get_context", fake.get_context)
    monkeypatch.setattr(ray_internals, "report_call_index", lambda: fake.report_call_index)
    (tmp_path / "local").mkdir()
    monkeypatch.setattr(async_upload, "_worker_uploads", PendingUploads(tmp_path / "local", retry=ray_like_retry))
    monkeypatch.delenv(async_upload.ENV_MAX_PENDING, raising=False)
    yield fake
    for gate in fake.storage.gates.values():
        gate.set()
    fake.pool.shutdown(wait=True)


def local_dirs(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "local").iterdir())


def model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def test_the_async_report_returns_at_once_and_its_directory_lives_until_its_upload_ended(
    ray_async: FakeRayAsync, tmp_path: Path
) -> None:
    model, optimizer = model_and_optimizer()
    gate = ray_async.storage.hold("checkpoint_epoch-000000")
    report_epoch({"loss": 1.0}, epoch=0, model=model, optimizer=optimizer, upload="async")

    (report,) = ray_async.reports
    assert report["checkpoint_upload_mode"] == CheckpointUploadMode.ASYNC
    assert report["checkpoint_dir_name"] == "checkpoint_epoch-000000"
    assert report["delete_local_checkpoint_after_upload"] is False  # ours to remove, failed uploads included
    (local,) = local_dirs(tmp_path)
    assert Path(report["checkpoint"].path) == local and (local / checkpointing.MODEL_FILE).is_file()
    assert async_upload.uploads_in_flight() == 1

    gate.set()
    ray_async.futures[0].result(timeout=30)
    assert local_dirs(tmp_path) == [] and async_upload.uploads_in_flight() == 0
    uploaded = tmp_path / "remote" / "checkpoint_epoch-000000"
    assert manifest_problems(uploaded) == []
    assert {p.name for p in uploaded.iterdir()} == {
        s3_layout.MANIFEST_FILE, "model.pt", "optimizer.pt", "rng.pt", "train_state.json"
    }  # fmt: skip


def test_the_manifest_is_hashed_on_the_upload_thread_not_in_the_training_loop(
    ray_async: FakeRayAsync, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashed_on: list[str] = []
    write_manifest = checkpointing.write_manifest

    def recording(directory: Any, **kwargs: Any) -> Any:
        hashed_on.append(threading.current_thread().name)
        return write_manifest(directory, **kwargs)

    monkeypatch.setattr(checkpointing, "write_manifest", recording)
    model, optimizer = model_and_optimizer()
    gate = ray_async.storage.hold("checkpoint_epoch-000004")
    report_epoch({"loss": 1.0}, epoch=4, model=model, optimizer=optimizer, upload="async")
    assert threading.current_thread().name not in hashed_on

    gate.set()
    ray_async.futures[0].result(timeout=30)
    assert len(hashed_on) == 1 and hashed_on[0].startswith("upload")
    manifest = json.loads((tmp_path / "remote" / "checkpoint_epoch-000004" / s3_layout.MANIFEST_FILE).read_text())
    assert (manifest["epoch"], manifest["rank"], manifest["worldSize"]) == (4, 0, 1)


def test_synchronous_reports_stay_as_they_were(ray_async: FakeRayAsync, tmp_path: Path) -> None:
    model, optimizer = model_and_optimizer()
    report_epoch({"loss": 1.0}, epoch=0, model=model, optimizer=optimizer)
    (report,) = ray_async.reports
    assert set(report) == {"metrics", "checkpoint", "checkpoint_dir_name"}  # Ray's default SYNC upload
    assert local_dirs(tmp_path) == [] and ray_async.futures == []
    with pytest.raises(ValueError, match="'later' is not one of 'sync', 'async'"):
        report_epoch({"loss": 1.0}, epoch=1, model=model, upload="later")


def test_the_next_report_waits_while_max_pending_checkpoints_wait_for_their_upload(
    ray_async: FakeRayAsync, tmp_path: Path
) -> None:
    """Bound 2: two checkpoints may wait; the third report waits (in the training thread) until the oldest upload
    ended, so no more than two are ever on the local disk."""
    model, optimizer = model_and_optimizer()
    gates = [ray_async.storage.hold(s3_layout.checkpoint_dir_name(e)) for e in range(3)]
    for epoch in (0, 1):
        report_epoch({"epoch": epoch}, epoch=epoch, model=model, optimizer=optimizer, upload="async")
    assert len(local_dirs(tmp_path)) == 2

    third = threading.Thread(
        target=report_epoch,
        args=({"epoch": 2},),
        kwargs={"epoch": 2, "model": model, "optimizer": optimizer, "upload": "async"},
    )
    third.start()
    third.join(timeout=0.5)
    assert third.is_alive() and len(local_dirs(tmp_path)) == 2 and len(ray_async.reports) == 2  # held back

    gates[0].set()
    third.join(timeout=30)
    assert not third.is_alive() and len(ray_async.reports) == 3
    assert len(local_dirs(tmp_path)) == 2
    gates[1].set()
    gates[2].set()
    for future in ray_async.futures:
        future.result(timeout=30)
    assert local_dirs(tmp_path) == []
    assert ray_async.storage.events == [f"uploaded {s3_layout.checkpoint_dir_name(e)}" for e in range(3)]


def test_the_bound_comes_from_the_argument_then_the_environment_then_the_default() -> None:
    env = {async_upload.ENV_MAX_PENDING: "5"}
    assert async_upload.max_pending_uploads(None, env={}) == async_upload.DEFAULT_MAX_PENDING == 2
    assert async_upload.max_pending_uploads(None, env=env) == 5
    assert async_upload.max_pending_uploads(1, env=env) == 1
    with pytest.raises(ValueError, match="SWEEP_MAX_PENDING_UPLOADS: 'two' is not a whole number"):
        async_upload.max_pending_uploads(None, env={async_upload.ENV_MAX_PENDING: "two"})
    with pytest.raises(ValueError, match="at least 1"):
        async_upload.max_pending_uploads(0)


def test_room_is_reported_without_blocking_past_the_timeout(tmp_path: Path) -> None:
    uploads = PendingUploads(tmp_path)
    first, second = uploads.new_directory("a"), uploads.new_directory("b")
    assert uploads.wait_for_room(3, timeout_s=0) is True
    assert uploads.wait_for_room(2, timeout_s=0.01) is False
    uploads.discard(first)
    assert uploads.wait_for_room(2, timeout_s=0) is True and not first.exists() and second.exists()
    assert uploads.in_flight() == 1 and uploads.wait_until_idle(timeout_s=0.01) is False


def test_a_failed_upload_is_raised_with_its_own_error_and_leaves_no_directory(
    ray_async: FakeRayAsync, tmp_path: Path
) -> None:
    """Ray raises the upload's error for the trial; the training thread gets it at its next report too; the local
    directory is removed although the upload failed."""
    denied = OSError("When creating key 'ckpt/' in bucket 'b': AWS Error ACCESS_DENIED during PutObject operation")
    ray_async.storage.fail["checkpoint_epoch-000000"] = [denied]
    model, optimizer = model_and_optimizer()
    report_epoch({"epoch": 0}, epoch=0, model=model, optimizer=optimizer, upload="async")
    with pytest.raises(OSError) as raised:
        ray_async.futures[0].result(timeout=30)
    assert raised.value is denied  # what Ray puts in the training thread's exception queue
    assert local_dirs(tmp_path) == [] and async_upload.uploads_in_flight() == 0

    with pytest.raises(CheckpointUploadError, match=r"checkpoint_epoch-000000 failed: OSError: .*ACCESS_DENIED") as nxt:
        report_epoch({"epoch": 1}, epoch=1, model=model, optimizer=optimizer, upload="async")
    assert nxt.value.__cause__ is denied
    assert len(ray_async.reports) == 1 and local_dirs(tmp_path) == []  # nothing more written


def test_a_transient_error_is_retried_and_a_persistent_one_is_rays_final_error(
    ray_async: FakeRayAsync, tmp_path: Path
) -> None:
    """Our upload retries Ray's transient errors itself; once it gave up (and removed the directory), Ray's own
    retry of the whole upload gets the same error again, never a missing directory."""
    slow = [OSError(f"AWS Error SLOW_DOWN during PutObject operation (try {i})") for i in range(6)]
    ray_async.storage.fail["checkpoint_epoch-000000"] = slow[:1]
    ray_async.storage.fail["checkpoint_epoch-000001"] = slow[1:]
    model, optimizer = model_and_optimizer()
    report_epoch({"epoch": 0}, epoch=0, model=model, optimizer=optimizer, upload="async")
    ray_async.futures[0].result(timeout=30)
    assert ray_async.storage.attempts["checkpoint_epoch-000000"] == 2

    report_epoch({"epoch": 1}, epoch=1, model=model, optimizer=optimizer, upload="async")
    with pytest.raises(OSError) as raised:
        ray_async.futures[1].result(timeout=30)
    assert raised.value is slow[3]  # our third attempt's error, answered again to Ray's two retries
    assert ray_async.storage.attempts["checkpoint_epoch-000001"] == 3
    assert local_dirs(tmp_path) == []


def test_a_manifest_that_cannot_be_written_fails_the_upload_and_the_directory_goes(
    ray_async: FakeRayAsync, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(directory: Any, **kwargs: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpointing, "write_manifest", disk_full)
    model, optimizer = model_and_optimizer()
    report_epoch({"epoch": 0}, epoch=0, model=model, optimizer=optimizer, upload="async")
    with pytest.raises(OSError, match="No space left on device"):
        ray_async.futures[0].result(timeout=30)
    assert local_dirs(tmp_path) == [] and not (tmp_path / "remote").exists()


def test_a_report_ray_skips_or_that_raises_leaves_no_directory_waiting(
    ray_async: FakeRayAsync, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, optimizer = model_and_optimizer()
    ray_async.skip_next = True
    report_epoch({"epoch": 0}, epoch=0, model=model, optimizer=optimizer, upload="async")
    assert ray_async.reports == [] and local_dirs(tmp_path) == [] and async_upload.uploads_in_flight() == 0

    def broken_save(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("disk gone")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(RuntimeError, match="disk gone"):
        report_epoch({"epoch": 1}, epoch=1, model=model, optimizer=optimizer, upload="async")
    assert local_dirs(tmp_path) == [] and async_upload.uploads_in_flight() == 0


def test_sharded_async_reports_upload_each_ranks_shard_and_manifest_into_one_checkpoint(
    ray_async: FakeRayAsync, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpointing, "world_size_now", lambda: 2)
    for rank in (0, 1):
        monkeypatch.setattr(checkpointing, "world_rank", lambda rank=rank: rank)
        report_sharded_epoch({"epoch": 0}, epoch=0, state={"w": torch.full((3,), float(rank))}, upload="async")
    for future in ray_async.futures:
        future.result(timeout=30)
    uploaded = tmp_path / "remote" / "checkpoint_epoch-000000"
    assert sorted(p.name for p in uploaded.glob("_manifest*")) == [
        s3_layout.rank_manifest_name(0), s3_layout.rank_manifest_name(1)
    ]  # fmt: skip
    assert manifest_problems(uploaded) == [] and local_dirs(tmp_path) == []
    state, _ = checkpointing.load_shard(checkpoint=Checkpoint.from_directory(str(uploaded)), rank=1, world_size=2)
    assert torch.equal(state["w"], torch.ones(3))


def test_directories_left_by_a_process_that_is_gone_are_removed_on_the_next_use(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    leftover = tmp_path / f"sweep-async-ckpt-{dead_pid}-abc"
    alive = tmp_path / f"sweep-async-ckpt-{os.getppid()}-def"
    unrelated = tmp_path / "other-dir"
    for folder in (leftover, alive, unrelated):
        folder.mkdir()
        (folder / "model.pt").write_bytes(b"x")
    uploads = PendingUploads(tmp_path)
    mine = uploads.new_directory("checkpoint_epoch-000000")
    assert not leftover.exists() and alive.exists() and unrelated.exists() and mine.exists()
    assert mine.name.startswith(f"sweep-async-ckpt-{os.getpid()}-")


def test_a_trials_error_keeps_the_uploads_own_line_at_the_end_of_a_long_traceback() -> None:
    """The driver's one-line trial error (result.json, the driver's log) keeps the start and the end of a long error:
    Ray's error for a failed worker is a traceback whose last line is the upload's own error."""
    from training_entrypoints.trial_results import one_line as _one_line

    traceback = "ray::ImplicitFunc.train() " + 'File "x.py", line 1, in f\n' * 200
    error = RuntimeError(traceback + "OSError: When creating key 'k/checkpoint_epoch-000000/': AWS Error ACCESS_DENIED")
    line = _one_line(error)
    assert len(line) <= 2000 and "\n" not in line
    assert line.startswith("ray::ImplicitFunc.train()") and line.endswith("AWS Error ACCESS_DENIED")
    assert _one_line(RuntimeError("short\nerror")) == "short error"
