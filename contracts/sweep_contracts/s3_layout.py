"""The storage layout of one sweep run: the only contract between the entrypoints and the verifier.

    <storage.uri>/<namespace>/<sweep>-<runId>/
      tune/...                               Tune experiment (tune.RunConfig(storage_path=root, name="tune"))
      train/<trialId>/                       one Train run per trial
        checkpoint_manager_snapshot.json     Ray's commit record
        checkpoint_epoch-000003/...          files + _manifest.json (a sharded save: shard-NNNN/ + _manifest.rank-NNNN.json
                                             per rank; the manifest document: checkpoint_manifest.py), written by our
                                             helpers; _commit_record.json, what Ray committed, for any loop
                                             (commit_record.py)
      _sweep/status.json                     progress written by the driver every few seconds
      _sweep/result.json                     final best trial + its checkpoint URI
      _sweep/preflight-<token>.json          the driver's storage probe, deleted at once; _sweep/gpu-preflight/

Every run gets its own prefix (R16): a new runId is a new run; resuming means reusing a runId on purpose.
The same layout works for an `s3://` root and for a local directory (run-local).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

S3_SCHEME: Final = "s3://"

TUNE_EXPERIMENT_NAME: Final = "tune"
TRAIN_DIR: Final = "train"
SWEEP_META_DIR: Final = "_sweep"
STATUS_FILE: Final = "status.json"
RESULT_FILE: Final = "result.json"
PREFLIGHT_PREFIX: Final = "preflight-"
SNAPSHOT_FILE: Final = "checkpoint_manager_snapshot.json"
MANIFEST_FILE: Final = "_manifest.json"
# Written by the operator's Train callback into each checkpoint Ray committed: every file with its size and the
# store's fingerprint (commit_record.py).
COMMIT_RECORD_FILE: Final = "_commit_record.json"
CHECKPOINT_DIR_PREFIX: Final = "checkpoint_"
CHECKPOINT_DIR_FORMAT: Final = "checkpoint_epoch-{epoch:06d}"

_RANK_MANIFEST_RE: Final = re.compile(r"^_manifest\.rank-(\d{4,})\.json$")

# https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html (general purpose buckets)
_BUCKET_RE: Final = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_IP_RE: Final = re.compile(r"^\d+\.\d+\.\d+\.\d+$")


def bucket_name_problem(bucket: str) -> str | None:
    """Why `bucket` is not a valid S3 bucket name, or None when it is."""
    if not _BUCKET_RE.match(bucket):
        return "3-63 characters of lowercase letters, digits, '.' and '-', starting and ending with a letter or digit"
    if ".." in bucket or ".-" in bucket or "-." in bucket:
        return "no '..', '.-' or '-.' sequences"
    if _IP_RE.match(bucket):
        return "not formatted as an IP address"
    if bucket.startswith(("xn--", "sthree-")) or bucket.endswith(("-s3alias", "--ol-s3", "--x-s3")):
        return "no reserved prefix (xn--, sthree-) or suffix (-s3alias, --ol-s3, --x-s3)"
    return None


@dataclass(frozen=True)
class S3Uri:
    """An `s3://bucket/key` location; `key` has no leading or trailing slash ("" for the bucket root)."""

    bucket: str
    key: str = ""

    @classmethod
    def parse(cls, uri: str) -> S3Uri:
        """Parse `s3://bucket[/prefix]`; raises ValueError naming what is wrong."""
        if not uri.startswith(S3_SCHEME):
            raise ValueError(f"{uri!r} is not an s3:// URI (expected s3://bucket/prefix)")
        rest = uri[len(S3_SCHEME) :]
        bucket, _, key = rest.partition("/")
        if not bucket:
            raise ValueError(f"{uri!r} has no bucket (expected s3://bucket/prefix)")
        problem = bucket_name_problem(bucket)
        if problem:
            raise ValueError(f"{uri!r}: bucket {bucket!r} is not a valid S3 bucket name ({problem})")
        key = key.strip("/")
        if "//" in key:
            raise ValueError(f"{uri!r} has an empty path segment ('//')")
        return cls(bucket, key)

    def join(self, *parts: str) -> S3Uri:
        """This location with `parts` appended as path segments."""
        segments = [self.key] if self.key else []
        segments += [p.strip("/") for p in parts if p.strip("/")]
        return S3Uri(self.bucket, "/".join(segments))

    @property
    def prefix(self) -> str:
        """The key as a listing prefix: `key/` (or "" at the bucket root)."""
        return f"{self.key}/" if self.key else ""

    @property
    def path(self) -> str:
        """`bucket/key`: the scheme-less form Ray reports for checkpoint paths."""
        return f"{self.bucket}/{self.key}" if self.key else self.bucket

    def __str__(self) -> str:
        return f"{S3_SCHEME}{self.path}"


def is_s3_uri(location: str) -> bool:
    return location.startswith(S3_SCHEME)


def join(root: str, *parts: str) -> str:
    """Join path segments onto an `s3://` URI or a local directory, POSIX style."""
    segments = [root.rstrip("/")] + [p.strip("/") for p in parts if p.strip("/")]
    return "/".join(segments)


def run_dir_name(sweep: str, run_id: str) -> str:
    """The run's directory under `<storage.uri>/<namespace>/`."""
    return f"{sweep}-{run_id}"


def run_root(storage_uri: str, namespace: str, sweep: str, run_id: str) -> str:
    """`<storage.uri>/<namespace>/<sweep>-<runId>`: the root of one run, an s3:// URI or a local dir."""
    return join(storage_uri, namespace, run_dir_name(sweep, run_id))


def checkpoint_dir_name(epoch: int) -> str:
    """`checkpoint_epoch-000003`: the name every checkpoint of ours is reported under."""
    return CHECKPOINT_DIR_FORMAT.format(epoch=epoch)


def rank_manifest_name(rank: int) -> str:
    """Per-rank manifest for sharded saves (R10): `_manifest.rank-0003.json`."""
    return f"_manifest.rank-{rank:04d}.json"


def rank_shard_dir(rank: int) -> str:
    """The sub-directory of a checkpoint that holds one rank's files in a sharded save (R10): `shard-0003`."""
    return f"shard-{rank:04d}"


def is_manifest_name(name: str) -> bool:
    return name == MANIFEST_FILE or bool(_RANK_MANIFEST_RE.match(name))


def manifest_rank(name: str) -> int | None:
    """The rank of a per-rank manifest name (`_manifest.rank-0003.json` -> 3); None for any other name."""
    match = _RANK_MANIFEST_RE.match(name)
    return int(match.group(1)) if match else None


def strip_scheme(location: str) -> str:
    """`s3://b/k` -> `b/k` (how pyarrow and Ray report S3 paths); local paths unchanged."""
    return location[len(S3_SCHEME) :] if is_s3_uri(location) else location


@dataclass(frozen=True)
class RunLayout:
    """Paths inside one run root (an `s3://` URI or a local directory)."""

    root: str

    @property
    def tune_storage_path(self) -> str:
        """`storage_path` for `tune.RunConfig` (experiment name `tune` under it)."""
        return self.root

    @property
    def tune_dir(self) -> str:
        return join(self.root, TUNE_EXPERIMENT_NAME)

    @property
    def train_storage_path(self) -> str:
        """`storage_path` for every trial's `train.RunConfig` (name = trial id)."""
        return join(self.root, TRAIN_DIR)

    def trial_dir(self, trial_id: str) -> str:
        return join(self.root, TRAIN_DIR, trial_id)

    def snapshot_path(self, trial_id: str) -> str:
        return join(self.trial_dir(trial_id), SNAPSHOT_FILE)

    def checkpoint_dir(self, trial_id: str, checkpoint_name: str) -> str:
        return join(self.trial_dir(trial_id), checkpoint_name)

    @property
    def meta_dir(self) -> str:
        return join(self.root, SWEEP_META_DIR)

    @property
    def status_path(self) -> str:
        return join(self.meta_dir, STATUS_FILE)

    @property
    def result_path(self) -> str:
        return join(self.meta_dir, RESULT_FILE)

    def preflight_path(self, token: str) -> str:
        """The driver's pre-flight probe (written, read, listed and deleted before the first trial)."""
        return join(self.meta_dir, f"{PREFLIGHT_PREFIX}{token}.json")


# Keys relative to a run root, for code that lists a bucket once and matches in memory (the verifier).
def relative_trial_key(trial_id: str, *parts: str) -> str:
    return join(TRAIN_DIR, trial_id, *parts)


STATUS_KEY: Final = f"{SWEEP_META_DIR}/{STATUS_FILE}"
RESULT_KEY: Final = f"{SWEEP_META_DIR}/{RESULT_FILE}"
