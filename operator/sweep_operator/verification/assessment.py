"""The pure comparison: one trial's listing, snapshot and manifests against each other, and the best and recorded
checkpoints against the verified ones.

Also the trials the records say checkpointed against what S3 holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sweep_contracts import s3_layout
from sweep_contracts.checkpoint_manifest import (
    FormatError,
    Manifest,
    missing_rank_manifests,
)
from sweep_contracts.commit_record import FINGERPRINT_S3_ETAG, FINGERPRINT_SHA256, CommitRecord, same_content
from sweep_contracts.constants import SUPPORTED_RAY_VERSION
from sweep_contracts.s3_layout import S3Uri

from .findings import (
    BEST_CHECKPOINT_UNVERIFIED,
    FINGERPRINT_MISMATCH,
    INVALID_COMMIT_RECORD,
    INVALID_MANIFEST,
    INVALID_RECORD,
    INVALID_RESULT,
    INVALID_SNAPSHOT,
    LEVEL_COMMITTED,
    LEVEL_FULL_STATE,
    MISSING_CHECKPOINT,
    MISSING_FILE,
    MISSING_MANIFEST,
    MISSING_SNAPSHOT,
    MISSING_TRIAL,
    RECORDED_CHECKPOINT_UNVERIFIED,
    SIZE_MISMATCH,
    SNAPSHOT_RAY_VERSION,
    UNCOMMITTED,
    UNCOMMITTED_CHECKPOINT,
    VERIFIED,
    CheckpointReport,
    Finding,
)
from .records import Snapshot, best_checkpoint_uri, recorded_checkpoints


@dataclass(frozen=True)
class TrialObjects:
    """A trial prefix's listing, grouped: files directly in it and one `{relative key: size}` per sub-directory."""

    trial: str
    files: Mapping[str, int]
    dirs: Mapping[str, Mapping[str, int]]
    etags: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # per sub-directory, as `dirs`

    @classmethod
    def from_listing(
        cls, trial: str, objects: Mapping[str, int], etags: Mapping[str, str] | None = None
    ) -> TrialObjects:
        """`objects` maps keys relative to the trial dir to sizes (`etags` to ETags); `dir/` markers (pyarrow) keep a
        dir known."""
        files: dict[str, int] = {}
        dirs: dict[str, dict[str, int]] = {}
        dir_etags: dict[str, dict[str, str]] = {}
        for rel, size in objects.items():
            head, sep, rest = rel.partition("/")
            if not sep:
                files[head] = size
                continue
            contents = dirs.setdefault(head, {})
            if rest and not rest.endswith("/"):
                contents[rest] = size
                etag = (etags or {}).get(rel)
                if etag:
                    dir_etags.setdefault(head, {})[rest] = etag
        return cls(trial, files, dirs, dir_etags)

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
    record: CommitRecord | FormatError | None = None,
    etags: Mapping[str, str] | None = None,
) -> CheckpointAssessment:
    """Compare one committed checkpoint's listing with its proofs (`contents` None: no object at all): our helpers'
    manifests (the full-state level) and the commit record of what Ray committed (the committed level, any loop)."""

    def result(
        problems: list[Finding], files: int = 0, size: int = 0, to_hash: Sequence[FileToHash] = (), level: str = ""
    ) -> CheckpointAssessment:
        status = problems[0].kind if problems else VERIFIED
        report = CheckpointReport(trial, name, dir_key, True, files, size, status, level if not problems else "")
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
    if not manifests and record is None:
        return result(
            [
                Finding(
                    MISSING_MANIFEST,
                    dir_key + s3_layout.COMMIT_RECORD_FILE,
                    f"neither a commit record ({s3_layout.COMMIT_RECORD_FILE}, written after Ray commits a "
                    f"checkpoint) nor a manifest ({s3_layout.MANIFEST_FILE}) among {len(contents)} object(s); "
                    "the checkpoint cannot be proven complete",
                )
            ]
        )
    problems: list[Finding] = []
    files = size = 0
    to_hash: list[FileToHash] = []
    if manifests:
        files, size = _assess_manifests(trial, name, dir_key, contents, manifests, problems, to_hash)
    if record is not None:
        record_files, record_size = _assess_record(
            trial, name, dir_key, contents, record, etags or {}, problems, to_hash
        )
        if not manifests:
            files, size = record_files, record_size
    return result(problems, files, size, to_hash, LEVEL_FULL_STATE if manifests else LEVEL_COMMITTED)


def _assess_manifests(
    trial: str,
    name: str,
    dir_key: str,
    contents: Mapping[str, int],
    manifests: Mapping[str, Manifest | FormatError],
    problems: list[Finding],
    to_hash: list[FileToHash],
) -> tuple[int, int]:
    """Our helpers' manifests against the listing: (files, bytes) they name; problems and files to hash appended."""
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
    return files, size


def _assess_record(
    trial: str,
    name: str,
    dir_key: str,
    contents: Mapping[str, int],
    record: CommitRecord | FormatError,
    etags: Mapping[str, str],
    problems: list[Finding],
    to_hash: list[FileToHash],
) -> tuple[int, int]:
    """The commit record against the listing: every file Ray committed is there with its size and its ETag (a
    same-size rewrite changes the ETag); (files, bytes) it names."""
    record_key = dir_key + s3_layout.COMMIT_RECORD_FILE
    if isinstance(record, FormatError):
        problems.append(Finding(INVALID_COMMIT_RECORD, record_key, str(record)))
        return 0, 0
    if record.checkpoint != name:
        problems.append(
            Finding(INVALID_COMMIT_RECORD, record_key, f"records checkpoint {record.checkpoint!r}, not {name!r}")
        )
        return 0, 0
    size = 0
    for entry in record.files:
        key = dir_key + entry.path
        size += entry.size
        actual = contents.get(entry.path)
        if actual is None:
            problems.append(
                Finding(
                    MISSING_FILE, key, f"committed by Ray ({entry.size} bytes, per the commit record) but not in S3"
                )
            )
        elif actual != entry.size:
            problems.append(Finding(SIZE_MISMATCH, key, f"{actual} bytes in S3, the commit record says {entry.size}"))
        elif record.fingerprint == FINGERPRINT_S3_ETAG:
            listed = etags.get(entry.path)
            if listed is None or not same_content(entry.fingerprint, listed):
                problems.append(
                    Finding(
                        FINGERPRINT_MISMATCH,
                        key,
                        f"ETag {listed or 'unknown'} in S3, the commit record says {entry.fingerprint}: "
                        "the file was rewritten after Ray committed it (a file of several upload parts restored by "
                        "one PUT has another ETag too: restore it in parts of the same size)",
                    )
                )
        elif record.fingerprint == FINGERPRINT_SHA256:
            to_hash.append(FileToHash(trial, name, key, entry.size, entry.fingerprint))
    return len(record.files), size


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


@dataclass(frozen=True)
class TrialFacts:
    """What S3 holds for one trial: its listing, its snapshot and the manifests of its committed checkpoints."""

    objects: TrialObjects
    snapshot: Snapshot | FormatError | None = None
    manifests: Mapping[str, Mapping[str, Manifest | FormatError]] = field(default_factory=dict)
    records: Mapping[str, CommitRecord | FormatError] = field(default_factory=dict)


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
        assessment = assess_checkpoint(
            trial,
            name,
            f"{trial_prefix}{name}/",
            contents,
            facts.manifests.get(name, {}),
            facts.records.get(name),
            facts.objects.etags.get(name),
        )
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


def expected_trials(
    root: S3Uri,
    result_data: bytes | None,
    status_data: bytes | None,
    states: Mapping[str, Mapping[str, str] | FormatError] | None,
) -> tuple[dict[str, str], list[Finding]]:
    """({trial: which record says it checkpointed}, problems), from every record that survives; an unreadable status
    or experiment state is a problem (which trials must have checkpoints is then unknown). `states`: each experiment
    state's {trial: checkpoint path} as the reader took it (listing.read_experiment_states), or why it
    is unreadable."""
    expected: dict[str, str] = {}
    problems: list[Finding] = []
    # (key, name shown, what was read, parser, problem kind when unreadable: "" for result.json, judged with its best)
    sources: list[tuple[str, str, Any, Callable[[Any, str], Mapping[str, str]], str]] = []
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
    for key, taken in sorted((states or {}).items()):
        sources.append((key, key[len(root.prefix) :], taken, _taken, INVALID_RECORD))
    for key, name, data, parse, invalid_kind in sources:
        try:
            found = parse(data, name)
        except FormatError as exc:
            if invalid_kind:
                problems.append(Finding(invalid_kind, key, str(exc)))
            continue
        for trial, uri in found.items():
            expected.setdefault(trial, f"{name} records its checkpoint {uri}")
    return expected, problems


def _taken(taken: Mapping[str, str] | FormatError, _: str) -> Mapping[str, str]:
    if isinstance(taken, FormatError):
        raise taken
    return taken


def recorded_checkpoint_findings(
    root: S3Uri, result_data: bytes, verified: Sequence[tuple[str, str]], problems: Sequence[Finding]
) -> tuple[str | None, list[Finding]]:
    """(the best checkpoint's URI, problems) from `_sweep/result.json`: the best checkpoint and every checkpoint it
    records for a trial must be among the `verified` (trial, checkpoint) pairs; a trial with a problem already named
    under it is not judged twice."""
    key = root.join(s3_layout.RESULT_KEY).key
    best_uri: str | None = None
    try:
        best_uri = best_checkpoint_uri(result_data)
        recorded = recorded_checkpoints(result_data, s3_layout.RESULT_KEY)
    except FormatError as exc:
        return best_uri, [Finding(INVALID_RESULT, key, str(exc))]
    findings: list[Finding] = []
    finding = check_best_checkpoint(best_uri, root, verified)
    if finding:
        findings.append(finding)
    best = s3_layout.strip_scheme(best_uri or "").rstrip("/")
    for trial, uri in sorted(recorded.items()):
        trial_prefix = root.join(s3_layout.relative_trial_key(trial)).prefix
        if s3_layout.strip_scheme(uri).rstrip("/") == best or any(
            p.key.startswith(trial_prefix) for p in [*problems, *findings]
        ):
            continue  # already judged as the best checkpoint, or the trial is not verified for a named reason
        finding = check_best_checkpoint(
            uri, root, verified, kind=RECORDED_CHECKPOINT_UNVERIFIED, what=f"trial {trial}'s checkpoint"
        )
        if finding:
            findings.append(finding)
    return best_uri, findings
