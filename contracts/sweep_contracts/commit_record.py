"""The commit record, in one place: what Ray committed in one checkpoint, written by our Train callback and read back by
the verifier. Standard library only.

The callback writes it after Ray's checkpoint manager registered the checkpoint; the training image and the operator
import this same code.

    _commit_record.json   {"version": 1, "checkpoint": "checkpoint_...", "fingerprint": "s3-etag",
                           "files": [{"path", "size", "fingerprint"}], "recordedAt": ..., "backfilled": false}

The fingerprint is what the store gives for free in a listing (S3's ETag), so writing a record reads no checkpoint
data and verifying one costs nothing beyond the listing the verifier makes anyway; a local directory (run-local)
has no ETag and records sha256.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from .checkpoint_manifest import FormatError, load_json_object, relative_path

VERSION: Final = 1
FINGERPRINT_S3_ETAG: Final = "s3-etag"
FINGERPRINT_SHA256: Final = "sha256"
FINGERPRINT_KINDS: Final = (FINGERPRINT_S3_ETAG, FINGERPRINT_SHA256)
# A record names at most this many files (the verifier lists at most a million keys per run anyway).
MAX_FILES: Final = 1_000_000


@dataclass(frozen=True)
class RecordEntry:
    path: str  # relative to the checkpoint directory
    size: int
    fingerprint: str  # an S3 ETag as listed (quotes stripped), or sha256 hex


@dataclass(frozen=True)
class CommitRecord:
    checkpoint: str
    fingerprint: str  # FINGERPRINT_S3_ETAG or FINGERPRINT_SHA256
    files: tuple[RecordEntry, ...]
    backfilled: bool = False


def normalize_etag(etag: str) -> str:
    """An ETag as S3 lists it (`"abc"`, sometimes `W/"abc"` behind proxies) without its quotes."""
    etag = etag.strip()
    if etag.startswith("W/"):
        etag = etag[2:]
    return etag.strip('"')


def _md5_hex(value: str) -> bool:
    return len(value) == 32 and all(c in "0123456789abcdef" for c in value.lower())


def same_content(recorded: str, listed: str) -> bool:
    """Whether two ETags (quotes stripped) name the same bytes. Equal ones do; so do a one-part multipart upload's
    (`md5(md5(bytes))-1`, what pyarrow, and so Ray, uploads even a small file as) and a single PUT's (`md5(bytes)`),
    so a file restored by a plain PUT of the same bytes is recognised. A multipart ETag of several parts depends on
    the part sizes: against a single PUT's it proves nothing either way and counts as different."""
    if recorded == listed:
        return True
    for single, multi in ((recorded, listed), (listed, recorded)):
        if multi.endswith("-1") and _md5_hex(single) and _md5_hex(multi[:-2]):
            return hashlib.md5(bytes.fromhex(single), usedforsecurity=False).hexdigest() == multi[:-2].lower()
    return False


def record_document(
    checkpoint: str,
    files: Iterable[tuple[str, int, str]],
    *,
    fingerprint: str,
    recorded_at: str,
    backfilled: bool = False,
) -> dict[str, Any]:
    """The JSON document for `(path, size, fingerprint)` entries, as the Train callback stores it."""
    if fingerprint not in FINGERPRINT_KINDS:
        raise ValueError(f"fingerprint: got {fingerprint!r}; expected one of {FINGERPRINT_KINDS}")
    return {
        "version": VERSION,
        "checkpoint": checkpoint,
        "fingerprint": fingerprint,
        "files": [{"path": p, "size": s, "fingerprint": f} for p, s, f in sorted(files)],
        "recordedAt": recorded_at,
        "backfilled": backfilled,
    }


def parse_record(data: bytes, name: str = "_commit_record.json") -> CommitRecord:
    """Parse one commit record; raises FormatError naming the field that is wrong. An empty file list is refused:
    Ray commits no empty checkpoint, so such a record proves nothing."""
    doc = load_json_object(data, name)
    if doc.get("version") != VERSION:
        raise FormatError(f"version: got {doc.get('version')!r}; this verifier reads version {VERSION}")
    checkpoint = doc.get("checkpoint")
    if not isinstance(checkpoint, str) or not checkpoint or "/" in checkpoint:
        raise FormatError(f"checkpoint: got {checkpoint!r}; expected the checkpoint directory's name")
    kind = doc.get("fingerprint")
    if kind not in FINGERPRINT_KINDS:
        raise FormatError(f"fingerprint: got {kind!r}; expected one of {', '.join(FINGERPRINT_KINDS)}")
    files = doc.get("files")
    if not isinstance(files, list) or not files:
        raise FormatError(
            f"files: got {type(files).__name__}; expected a non-empty list of {{path, size, fingerprint}}"
        )
    if len(files) > MAX_FILES:
        raise FormatError(f"files: {len(files)} entries; a record names at most {MAX_FILES}")
    entries: list[RecordEntry] = []
    for i, item in enumerate(files):
        if not isinstance(item, dict):
            raise FormatError(f"files[{i}]: got {item!r}; expected an object {{path, size, fingerprint}}")
        path = relative_path(item.get("path"), f"files[{i}].path")
        size = item.get("size")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise FormatError(f"files[{i}].size: got {size!r}; expected an integer >= 0")
        value = item.get("fingerprint")
        if not isinstance(value, str) or not value or len(value) > 128:
            raise FormatError(f"files[{i}].fingerprint: got {value!r}; expected a non-empty string")
        entries.append(RecordEntry(path, size, value))
    return CommitRecord(checkpoint, kind, tuple(entries), doc.get("backfilled") is True)
