"""Synthetic sweep runs in S3, laid out exactly as the entrypoints write them, with methods that break them.

    sweep = write_sweep(s3_client, bucket, trials=2, checkpoints=2, files=3)
    sweep.corrupt_file()                      # same size, different bytes: only --deep notices
    verify_sweep_checkpoints(s3_client, sweep.root_uri)

Snapshots use Ray 2.58.0's real `_CheckpointManagerState` JSON (see fixtures/, produced by a real run);
manifests use the entrypoints' format (sweep_contracts.checkpoint_manifest).
Every breaker returns the S3 key (or key prefix) it touched, so a test can assert the verifier names it.
The client only needs put_object, delete_object and list_objects_v2 (boto3, or fake_s3.FakeS3 in unit tests).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweep_contracts import checkpoint_manifest, s3_layout
from sweep_contracts.s3_layout import S3Uri

FIXTURES = Path(__file__).resolve().parent / "fixtures"
# Ray's own snapshot from a real 1-worker Train V2 run (generate_ray_snapshot.py regenerates it).
REAL_RAY_SNAPSHOT = FIXTURES / "checkpoint_manager_snapshot.ray-2.58.0.json"
# Tune's own experiment state from a real 2.58.0 run (2 trials whose last results carry a checkpoint_path).
REAL_TUNE_EXPERIMENT_STATE = FIXTURES / "experiment_state.ray-2.58.0.json"
EXPERIMENT_STATE_NAME = "experiment_state-2026-12-02_10-00-00.json"

DEFAULT_PREFIX = "sweeps/team-a/digits-r1a2b3"
METRIC = "val_loss"


# ---------------------------------------------------------------------------------- documents


def ray_snapshot(
    checkpoint_dir_names: Sequence[str],
    *,
    metrics: Mapping[str, Mapping[str, Any]] | None = None,
    latest: str | None = None,
    report_index_start: int = 0,
) -> dict[str, Any]:
    """A `checkpoint_manager_snapshot.json` document exactly as Ray 2.58.0 writes it.

    `checkpoint_dir_names` are the kept (committed) checkpoints, in Ray's order (worst first when scored);
    `latest` defaults to the last of them; `metrics` maps a name to its reported metrics.
    """
    metrics = metrics or {}
    names = list(checkpoint_dir_names)
    latest = latest if latest is not None else (names[-1] if names else None)

    def result(name: str) -> dict[str, Any]:
        return {"version": 0, "checkpoint_dir_name": name, "metrics": dict(metrics.get(name, {}))}

    return {
        "ray_version": "2.58.0",
        "checkpoint_results": [result(n) for n in names],
        "checkpoint_report_indices": [report_index_start + i for i in range(len(names))],
        "latest_checkpoint_result": result(latest) if latest is not None else None,
        "pending_training_results": [],
        "pending_validation_specs": [],
        "current_report_index": report_index_start + len(names),
        "validated_checkpoint_dir_names": [],
        "timed_out_validation_checkpoint_dir_names": [],
        "failed_validation_checkpoint_dir_names": [],
    }


def manifest_document(
    files: Mapping[str, bytes], *, rank: int = 0, epoch: int | None = None, world_size: int | None = None
) -> dict[str, Any]:
    """A checkpoint manifest for `files` ({path relative to the checkpoint dir: content}), through the product's
    one schema module (`world_size` defaults to rank + 1)."""
    entries = [(path, len(data), hashlib.sha256(data).hexdigest()) for path, data in sorted(files.items())]
    return checkpoint_manifest.manifest_document(entries, rank=rank, epoch=epoch, world_size=world_size or rank + 1)


def tune_experiment_state(trials: Mapping[str, str | None]) -> dict[str, Any]:
    """Tune 2.58.0's `experiment_state-*.json` for `trials` ({trial id: the checkpoint path its last result
    forwarded, scheme-less as TuneReportCallback gives it, or None}), built on the real fixture's trial entries."""
    real = json.loads(REAL_TUNE_EXPERIMENT_STATE.read_text())
    template_trial, template_meta = (json.loads(part) for part in real["trial_data"][0])
    trial_data = []
    for trial_id, path in trials.items():
        last = {k: v for k, v in template_meta["last_result"].items() if k != "checkpoint_path"}
        last["trial_id"] = trial_id
        if path is not None:
            last["checkpoint_path"] = path
        trial_data.append(
            [json.dumps({**template_trial, "trial_id": trial_id}), json.dumps({**template_meta, "last_result": last})]
        )
    return {**real, "trial_data": trial_data}


def file_content(trial: str, checkpoint: str, path: str, size: int) -> bytes:
    """Deterministic bytes for one synthetic file (different for every file)."""
    seed = hashlib.sha256(f"{trial}/{checkpoint}/{path}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def _json_bytes(doc: Any) -> bytes:
    return json.dumps(doc, indent=2).encode()


# ---------------------------------------------------------------------------------- the sweep


@dataclass
class SyntheticSweep:
    """A sweep run written into a bucket; `root_uri` is what `sweepctl verify` takes.

    `checkpoints[trial]` are the committed checkpoint names (oldest first); `files[(trial, name)]` their
    files ({relative path: content}); the best checkpoint is the last one of the first trial.
    """

    client: Any
    root: S3Uri
    trials: tuple[str, ...]
    checkpoints: dict[str, tuple[str, ...]]
    files: dict[tuple[str, str], dict[str, bytes]]
    ranks: int
    objects_written: int = 0
    best: tuple[str, str] | None = None
    extra_keys: list[str] = field(default_factory=list)
    trial_results: list[dict[str, Any]] = field(default_factory=list)  # result.json's and status.json's trialResults

    # --------------------------------------------------------------------------- locations

    @property
    def bucket(self) -> str:
        return self.root.bucket

    @property
    def root_uri(self) -> str:
        return str(self.root)

    def trial_prefix(self, trial: str) -> str:
        return self.root.join(s3_layout.relative_trial_key(trial)).prefix

    def checkpoint_prefix(self, trial: str, checkpoint: str) -> str:
        return f"{self.trial_prefix(trial)}{checkpoint}/"

    def checkpoint_uri(self, trial: str, checkpoint: str) -> str:
        return str(self.root.join(s3_layout.relative_trial_key(trial, checkpoint)))

    def snapshot_key(self, trial: str) -> str:
        return self.trial_prefix(trial) + s3_layout.SNAPSHOT_FILE

    def manifest_keys(self, trial: str, checkpoint: str) -> list[str]:
        prefix = self.checkpoint_prefix(trial, checkpoint)
        if self.ranks == 1:
            return [prefix + s3_layout.MANIFEST_FILE]
        return [prefix + s3_layout.rank_manifest_name(r) for r in range(self.ranks)]

    @property
    def result_key(self) -> str:
        return self.root.join(s3_layout.RESULT_KEY).key

    @property
    def best_checkpoint_uri(self) -> str | None:
        return self.checkpoint_uri(*self.best) if self.best else None

    @property
    def committed_count(self) -> int:
        return sum(len(names) for names in self.checkpoints.values())

    @property
    def committed_bytes(self) -> int:
        return sum(len(data) for files in self.files.values() for data in files.values())

    def _pick(self, trial: str | None, checkpoint: str | None, path: str | None = None) -> tuple[str, str, str]:
        trial = trial or self.trials[0]
        checkpoint = checkpoint or self.checkpoints[trial][-1]
        path = path or sorted(self.files[(trial, checkpoint)])[0]
        return trial, checkpoint, path

    def file_key(self, trial: str | None = None, checkpoint: str | None = None, path: str | None = None) -> str:
        trial, checkpoint, path = self._pick(trial, checkpoint, path)
        return self.checkpoint_prefix(trial, checkpoint) + path

    # --------------------------------------------------------------------------- breakers
    # Defaults: the first trial, its latest checkpoint, its first file (by path).

    def delete_file(self, trial: str | None = None, checkpoint: str | None = None, path: str | None = None) -> str:
        """Remove one file a manifest lists (an upload that never landed)."""
        key = self.file_key(trial, checkpoint, path)
        self.client.delete_object(Bucket=self.bucket, Key=key)
        return key

    def truncate_file(
        self, trial: str | None = None, checkpoint: str | None = None, path: str | None = None, keep: int = 1
    ) -> str:
        """Overwrite one file with its first `keep` bytes (a partial upload)."""
        trial, checkpoint, path = self._pick(trial, checkpoint, path)
        key = self.file_key(trial, checkpoint, path)
        self.client.put_object(Bucket=self.bucket, Key=key, Body=self.files[(trial, checkpoint)][path][:keep])
        return key

    def corrupt_file(self, trial: str | None = None, checkpoint: str | None = None, path: str | None = None) -> str:
        """Overwrite one file with different bytes of the same size: only a deep (sha256) check notices."""
        trial, checkpoint, path = self._pick(trial, checkpoint, path)
        key = self.file_key(trial, checkpoint, path)
        original = self.files[(trial, checkpoint)][path]
        self.client.put_object(Bucket=self.bucket, Key=key, Body=bytes(b ^ 0xFF for b in original))
        return key

    def delete_manifest(self, trial: str | None = None, checkpoint: str | None = None, rank: int | None = None) -> str:
        """Remove a checkpoint's manifest (`rank` picks one per-rank manifest of a sharded save)."""
        trial, checkpoint, _ = self._pick(trial, checkpoint)
        keys = self.manifest_keys(trial, checkpoint)
        key = keys[rank or 0] if self.ranks > 1 else keys[0]
        self.client.delete_object(Bucket=self.bucket, Key=key)
        return key

    def write_manifest_bytes(self, data: bytes, trial: str | None = None, checkpoint: str | None = None) -> str:
        """Replace a checkpoint's (first) manifest with arbitrary bytes (malformed manifests)."""
        trial, checkpoint, _ = self._pick(trial, checkpoint)
        key = self.manifest_keys(trial, checkpoint)[0]
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data)
        return key

    def delete_snapshot(self, trial: str | None = None) -> str:
        """Remove Ray's commit record of a trial that has checkpoint dirs."""
        key = self.snapshot_key(trial or self.trials[0])
        self.client.delete_object(Bucket=self.bucket, Key=key)
        return key

    def write_snapshot_bytes(self, data: bytes, trial: str | None = None) -> str:
        """Replace a trial's snapshot with arbitrary bytes (malformed or foreign snapshots)."""
        key = self.snapshot_key(trial or self.trials[0])
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data)
        return key

    def delete_checkpoint_dir(self, trial: str | None = None, checkpoint: str | None = None) -> str:
        """Remove every object of a checkpoint the snapshot still names (deleted before/after the commit)."""
        trial, checkpoint, _ = self._pick(trial, checkpoint)
        prefix = self.checkpoint_prefix(trial, checkpoint)
        while True:
            page = self.client.list_objects_v2(Bucket=self.bucket, Prefix=prefix)
            for obj in page.get("Contents", []):
                self.client.delete_object(Bucket=self.bucket, Key=obj["Key"])
            if not page.get("IsTruncated"):
                return prefix

    def delete_trial_dir(self, trial: str | None = None) -> str:
        """Remove everything under `train/<trial>/` (snapshot and checkpoints): the records still name the trial."""
        return self._delete_prefix(self.trial_prefix(trial or self.trials[0]))

    def delete_train_dir(self) -> str:
        """Remove all of `train/`."""
        return self._delete_prefix(self.root.join(s3_layout.TRAIN_DIR).prefix)

    def _delete_prefix(self, prefix: str) -> str:
        while True:
            page = self.client.list_objects_v2(Bucket=self.bucket, Prefix=prefix)
            for obj in page.get("Contents", []):
                self.client.delete_object(Bucket=self.bucket, Key=obj["Key"])
            if not page.get("IsTruncated") or not page.get("Contents"):
                return prefix

    def add_uncommitted_checkpoint(
        self, trial: str | None = None, name: str = "checkpoint_epoch-999999", files: int = 2
    ) -> str:
        """A checkpoint dir no snapshot names (an interrupted save): a warning, never a problem."""
        trial = trial or self.trials[0]
        contents = {f"part-{i:04d}.bin": file_content(trial, name, str(i), 32) for i in range(files)}
        prefix = self.checkpoint_prefix(trial, name)
        for path, data in contents.items():
            self.client.put_object(Bucket=self.bucket, Key=prefix + path, Body=data)
        return prefix

    def set_best_checkpoint_uri(self, uri: str | None) -> str:
        """Rewrite `_sweep/result.json` so its best checkpoint is `uri`."""
        self.client.put_object(
            Bucket=self.bucket, Key=self.result_key, Body=_json_bytes(_result_document(uri, self.trial_results))
        )
        return self.result_key

    def point_best_at_uncommitted(self, trial: str | None = None) -> str:
        """Make result.json's best checkpoint one that the snapshot does not commit (it exists, unverified)."""
        prefix = self.add_uncommitted_checkpoint(trial)
        return self.set_best_checkpoint_uri(f"s3://{self.bucket}/{prefix.rstrip('/')}")

    def delete_result(self) -> str:
        self.client.delete_object(Bucket=self.bucket, Key=self.result_key)
        return self.result_key


def _result_document(
    best_uri: str | None, trial_results: Sequence[Mapping[str, Any]] = (), trial: str = "trial_0000", value: float = 0.1
) -> dict[str, Any]:
    best = None
    if best_uri is not None:
        best = {"id": trial, "metric": METRIC, "value": value, "config": {"lr": 0.01}, "checkpointUri": best_uri}
    total = max(1, len(trial_results))
    return {
        "bestTrial": best,
        "trials": {"total": total, "terminated": total, "errored": 0},
        "trialResults": [dict(r) for r in trial_results],
        "finishedAt": "2026-12-02T10:00:00Z",
    }


def write_sweep(
    client: Any,
    bucket: str,
    prefix: str = DEFAULT_PREFIX,
    *,
    trials: int = 2,
    checkpoints: int = 2,
    files: int = 3,
    file_size: int = 256,
    ranks: int = 1,
    dir_markers: bool = True,
    tune_files: int = 3,
    experiment_state: bool = True,
    write_result: bool = True,
    concurrency: int = 8,
) -> SyntheticSweep:
    """Write a complete, verifiable sweep run under `s3://bucket/prefix` and describe it.

    trials x checkpoints x files objects of `file_size` bytes, one snapshot per trial (all checkpoints
    committed), `_manifest.json` per checkpoint (or `ranks` per-rank manifests, each listing its own
    shard files, R10), pyarrow-style `dir/` markers, Tune's experiment state naming every trial's checkpoint, a few
    Tune files the verifier must ignore, the `.validate_storage_marker` Ray writes, and `_sweep/status.json` +
    `_sweep/result.json` (both with every trial's checkpoint in `trialResults`).
    """
    if min(trials, checkpoints, files, ranks) < 1 or file_size < 0 or files < ranks:
        raise ValueError(
            f"need trials, checkpoints, ranks >= 1, files >= ranks, file_size >= 0; got {trials=} {checkpoints=} {files=} {ranks=} {file_size=}"
        )
    root = S3Uri.parse(f"s3://{bucket}/{prefix}")
    objects: dict[str, bytes] = {}
    trial_ids = tuple(f"trial_{t:04d}" for t in range(trials))
    committed: dict[str, tuple[str, ...]] = {}
    contents: dict[tuple[str, str], dict[str, bytes]] = {}
    sweep = SyntheticSweep(client, root, trial_ids, committed, contents, ranks)
    for t, trial in enumerate(trial_ids):
        names = tuple(s3_layout.checkpoint_dir_name(epoch) for epoch in range(checkpoints))
        committed[trial] = names
        trial_prefix = sweep.trial_prefix(trial)
        metrics = {}
        for epoch, name in enumerate(names):
            ckpt_prefix = sweep.checkpoint_prefix(trial, name)
            if dir_markers:
                objects[ckpt_prefix] = b""
            shard = {
                ("model.pt" if ranks == 1 and i == 0 else f"rank-{i % ranks:04d}/shard-{i:05d}.bin"): i % ranks
                for i in range(files)
            }
            data = {path: file_content(trial, name, path, file_size) for path in shard}
            contents[(trial, name)] = data
            objects.update({ckpt_prefix + path: blob for path, blob in data.items()})
            for rank in range(ranks):
                own = {p: b for p, b in data.items() if shard[p] == rank}
                manifest_name = s3_layout.MANIFEST_FILE if ranks == 1 else s3_layout.rank_manifest_name(rank)
                objects[ckpt_prefix + manifest_name] = _json_bytes(
                    manifest_document(own, rank=rank, epoch=epoch, world_size=ranks)
                )
            metrics[name] = {METRIC: 1.0 / (epoch + 1) + t, "epoch": epoch}
        objects[trial_prefix + s3_layout.SNAPSHOT_FILE] = _json_bytes(ray_snapshot(names, metrics=metrics))
        objects[trial_prefix + ".validate_storage_marker"] = b""
    for i in range(tune_files):
        objects[root.join(s3_layout.TUNE_EXPERIMENT_NAME, f"basic-variant-state-{i}.json").key] = b"{}"
    sweep.best = (trial_ids[0], committed[trial_ids[0]][-1])
    sweep.trial_results = [
        {
            "id": trial,
            "status": "TERMINATED",
            "value": None,
            "config": {},
            "checkpointUri": sweep.checkpoint_uri(trial, committed[trial][-1]),
        }
        for trial in trial_ids
    ]
    if experiment_state:
        state = tune_experiment_state(
            {
                t: s3_layout.strip_scheme(r["checkpointUri"])
                for t, r in zip(trial_ids, sweep.trial_results, strict=False)
            }
        )
        objects[root.join(s3_layout.TUNE_EXPERIMENT_NAME, EXPERIMENT_STATE_NAME).key] = _json_bytes(state)
    status_rows = [{k: r[k] for k in ("id", "status", "checkpointUri")} for r in sweep.trial_results]
    objects[root.join(s3_layout.STATUS_KEY).key] = _json_bytes(
        {"trials": {"total": trials}, "trialResults": status_rows, "updatedAt": "2026-12-02T10:00:00Z"}
    )
    if write_result:
        objects[sweep.result_key] = _json_bytes(_result_document(sweep.best_checkpoint_uri, sweep.trial_results))

    def put(item: tuple[str, bytes]) -> None:
        client.put_object(Bucket=bucket, Key=item[0], Body=item[1])

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(put, objects.items()))
    sweep.objects_written = len(objects)
    return sweep
