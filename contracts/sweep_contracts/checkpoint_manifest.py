"""The checkpoint manifest, in one place: what the entrypoints write into every checkpoint and the verifier reads back
(R10, R22). Standard library only, for both sides.

    _manifest.json              {"files": [{"path", "size", "sha256"}], "rank": 0, "epoch": 3, "worldSize": 2}
    _manifest.rank-0001.json    the same for one rank of a sharded save: its own files; worldSize required
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from . import s3_layout

FILES: Final = "files"
PATH: Final = "path"
SIZE: Final = "size"
SHA256: Final = "sha256"
RANK: Final = "rank"
EPOCH: Final = "epoch"
WORLD_SIZE: Final = "worldSize"
_SHA256_HEX_LEN: Final = 64


class FormatError(ValueError):
    """A snapshot, manifest or result document we cannot trust; the message says what is wrong."""


@dataclass(frozen=True)
class ManifestEntry:
    path: str  # relative to the checkpoint directory
    size: int
    sha256: str  # lowercase hex


@dataclass(frozen=True)
class Manifest:
    """One parsed manifest. `world_size` is how many ranks wrote the checkpoint (None only in a non-sharded one)."""

    files: tuple[ManifestEntry, ...]
    rank: int | None
    epoch: int | None
    world_size: int | None = None


def manifest_document(
    entries: Iterable[tuple[str, int, str]], *, rank: int, epoch: int | None, world_size: int
) -> dict[str, Any]:
    """The JSON document for `(path, size, sha256)` entries, as the writer stores it."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} of world size {world_size}: need 0 <= rank < world size")
    return {
        FILES: [{PATH: p, SIZE: s, SHA256: h} for p, s, h in entries],
        RANK: rank,
        EPOCH: epoch,
        WORLD_SIZE: world_size,
    }


def encode(document: Mapping[str, Any]) -> bytes:
    return json.dumps(document, indent=1, sort_keys=True).encode()


def load_json_object(data: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"{what} is not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise FormatError(f"{what} must be a JSON object, got {type(doc).__name__}")
    return doc


def optional_int(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise FormatError(f"{where}: got {value!r}; expected an integer or null")
    return value


def relative_path(value: Any, where: str) -> str:
    """`value` as a path relative to a checkpoint directory; FormatError naming `where` otherwise."""
    if not isinstance(value, str) or not value or value.startswith("/"):
        raise FormatError(f"{where}: got {value!r}; expected a path relative to the checkpoint directory")
    if any(part in ("", ".", "..") for part in value.split("/")):
        raise FormatError(f"{where}: got {value!r}; no empty, '.' or '..' segments allowed")
    return value


def parse_manifest(data: bytes, name: str = s3_layout.MANIFEST_FILE) -> Manifest:
    """Parse one manifest; raises FormatError naming the field that is wrong.

    A per-rank manifest must name its world size (else a missing highest rank could not be noticed) and agree
    with its file name about its rank."""
    doc = load_json_object(data, name)
    files = doc.get(FILES)
    if not isinstance(files, list) or not files:
        raise FormatError(f"{FILES}: got {files!r}; expected a non-empty list of {{path, size, sha256}}")
    entries: list[ManifestEntry] = []
    for i, item in enumerate(files):
        if not isinstance(item, dict):
            raise FormatError(f"files[{i}]: got {item!r}; expected an object {{path, size, sha256}}")
        path = relative_path(item.get(PATH), f"files[{i}].path")
        size = item.get(SIZE)
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise FormatError(f"files[{i}].size: got {size!r}; expected an integer >= 0")
        sha = item.get(SHA256)
        if (
            not isinstance(sha, str)
            or len(sha) != _SHA256_HEX_LEN
            or not all(c in "0123456789abcdefABCDEF" for c in sha)
        ):
            raise FormatError(f"files[{i}].sha256: got {sha!r}; expected 64 hexadecimal digits")
        entries.append(ManifestEntry(path, size, sha.lower()))
    rank = optional_int(doc.get(RANK), RANK)
    named_rank = s3_layout.manifest_rank(name)
    if named_rank is not None and rank is not None and rank != named_rank:
        raise FormatError(f"rank: got {rank}; the file name {name} says rank {named_rank}")
    world_size = optional_int(doc.get(WORLD_SIZE), WORLD_SIZE)
    if world_size is not None and world_size < 1:
        raise FormatError(f"{WORLD_SIZE}: got {world_size}; expected an integer >= 1")
    if named_rank is not None:
        if world_size is None:
            raise FormatError(
                f"{WORLD_SIZE}: missing; a per-rank manifest must say how many ranks wrote the checkpoint"
            )
        if named_rank >= world_size:
            raise FormatError(f"rank: {named_rank} is not below {WORLD_SIZE} {world_size}")
    return Manifest(tuple(entries), rank, optional_int(doc.get(EPOCH), EPOCH), world_size)


def missing_rank_manifests(manifests: Mapping[str, Manifest | FormatError]) -> tuple[int, list[int], str | None]:
    """(world size, ranks below it that have no manifest, a disagreement between manifests or None).

    `manifests` maps manifest file names of one checkpoint to what was parsed from them. A sharded checkpoint is
    complete only with one manifest per rank 0..worldSize-1; a manifest that failed to parse still counts as
    present here (it is reported as invalid on its own)."""
    ranks = {r for r in (s3_layout.manifest_rank(n) for n in manifests) if r is not None}
    if not ranks:
        return 1, [], None
    sizes = {
        m.world_size for n, m in manifests.items() if isinstance(m, Manifest) and s3_layout.manifest_rank(n) is not None
    }
    if len(sizes) > 1:
        return (
            max(ranks) + 1,
            [],
            f"per-rank manifests disagree on {WORLD_SIZE}: {sorted(s for s in sizes if s is not None)}",
        )
    world_size = next(iter(sizes), None)
    if world_size is None:  # every per-rank manifest is unreadable: the highest rank present is all we know
        world_size = max(ranks) + 1
    return world_size, sorted(set(range(world_size)) - ranks), None
