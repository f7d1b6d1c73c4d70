"""The operator's memory budget for what tenants write, sized from the pod's memory limit, and the bounded reading of
one JSON document.

An outsized run (its JSON documents, its listing, Tune's experiment states) fails for its own sweep and never takes the
operator down; a document's bytes, nesting depth and element count are checked before parsing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

from . import sizing

KiB: Final = 1 << 10
MiB: Final = 1 << 20

# The chart's default resources.limits.memory (the sizing rule at the sweeps the chart is sized for): assumed when the
# operator is not told its limit (no limit set, or a run outside Kubernetes), so the defaults are a default install's.
DEFAULT_MEMORY_LIMIT_BYTES: Final = sizing.memory_limit_mib(sizing.SIZED_FOR_SWEEPS) * MiB
# The operator's own working set (interpreter, kopf, the Kubernetes and S3 clients, its caches of every sweep: the
# sizing rule's) keeps half of the limit and at least the rule's at that size; the rest is what tenants' data may use.
OWN_BYTES_AT_LEAST: Final = sizing.own_mib(sizing.SIZED_FOR_SWEEPS) * MiB
TENANT_BYTES_AT_LEAST: Final = 32 * MiB
# What one parsed JSON element costs at most, counted generously: an empty dict is 64 bytes, an empty list 56, a
# short string about 50, and its slot in the container holding it 8 (measured with tracemalloc).
PARSED_BYTES_PER_ELEMENT: Final = 96
# What one listed key costs a verification while it holds the run's facts: the listing and the trial's facts each
# keep the key (2 x its length) and about 220 bytes of dict slots, size and ETag (measured: 335 bytes for a 60-character
# key, 2,015 for a 900-character one).
LISTED_KEY_OVERHEAD_BYTES: Final = 224

# Train's snapshots, our manifests and commit records are read whole up to this: a commit record lists every file of a
# checkpoint (~120 bytes each), so a checkpoint of 100,000 files still fits.
MAX_DOCUMENT_BYTES: Final = 16 * MiB
# Tune writes one experiment_state-*.json per Tune session (the run's first attempt, each retry and resume): far
# fewer than this for any run failurePolicy allows.
MAX_EXPERIMENT_STATE_FILES: Final = 64


class DocumentTooLarge(ValueError):
    """A JSON document over one of its bounds (bytes, nesting depth, elements); the message names the document and
    the bound."""


@dataclass(frozen=True)
class DocumentBounds:
    """How much of one JSON document the operator reads and parses."""

    max_bytes: int
    max_depth: int
    max_elements: int  # values in arrays and objects, the containers included

    @property
    def parsed_bytes(self) -> int:
        """At most what one parsed document takes (its strings' characters and every element's object)."""
        return self.max_bytes + self.max_elements * PARSED_BYTES_PER_ELEMENT


# `_sweep/status.json` and `_sweep/result.json`: the operator needs their counts, best trial and trialResults (an id,
# a status, a checkpoint URI and a count per trial: ~220 bytes and 5 elements a row in status.json; result.json adds
# each trial's config and value, a few hundred bytes and ~12 elements). 512 KiB and 32,768 elements hold about 2,400
# trials' rows in status.json and 1,500 to 2,500 in result.json; parsed, one takes at most 3.6 MiB (a 16 MiB list of
# empty lists took 360 MiB).
RUN_RECORD_BOUNDS: Final = DocumentBounds(max_bytes=512 * KiB, max_depth=32, max_elements=32_768)

_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_BRACKETS_ONLY = (bytes.maketrans(b"{}", b"[]"), bytes(c for c in range(256) if c not in b"[]{}"))


def check_json_shape(text: str, what: str, bounds: DocumentBounds) -> None:
    """DocumentTooLarge when the JSON in `text` has more elements or deeper nesting than `bounds`, found without
    parsing it: strings are blanked out, then the structural characters counted. For valid JSON the count is exact
    (an empty container counts twice); text that is not JSON passes or not, and its parse then fails."""
    skeleton = _JSON_STRING.sub("0", text)
    elements = skeleton.count("[") + skeleton.count("{") + skeleton.count(",") + 1
    if elements > bounds.max_elements:
        raise DocumentTooLarge(
            f"{what} has more than {bounds.max_elements} JSON elements (about {elements}), more than the operator "
            "parses of it"
        )
    brackets = skeleton.encode("utf-8", "replace").translate(*_BRACKETS_ONLY)
    if b"[" * (bounds.max_depth + 1) in brackets:
        raise DocumentTooLarge(f"{what} is nested more than {bounds.max_depth} levels deep")
    depth = 0
    while brackets:  # each round removes the innermost level: the rounds are the depth
        shorter = brackets.replace(b"[]", b"")
        if len(shorter) == len(brackets):
            return  # unbalanced: not JSON, which the parse says
        brackets, depth = shorter, depth + 1
        if depth > bounds.max_depth:
            raise DocumentTooLarge(f"{what} is nested more than {bounds.max_depth} levels deep")


def bytes_over(size: int, what: str, limit: int) -> DocumentTooLarge:
    return DocumentTooLarge(f"{what} is {size} bytes, more than the {limit} the operator reads of it")


def load_json(data: bytes | str, what: str, bounds: DocumentBounds) -> Any:
    """The parsed document, its bounds checked first (DocumentTooLarge); ValueError when it is not UTF-8 JSON."""
    if len(data) > bounds.max_bytes:
        raise bytes_over(len(data), what, bounds.max_bytes)
    text = data if isinstance(data, str) else data.decode("utf-8")
    check_json_shape(text, what, bounds)
    return json.loads(text)


@dataclass(frozen=True)
class VerificationBudget:
    """What one verification may hold of a run's data besides its snapshots, manifests and commit records."""

    listing_bytes: int  # the run's listed keys, as the verifier holds them (LISTED_KEY_OVERHEAD_BYTES each + 2x key)
    experiment_state_files: int
    experiment_state_bytes: int  # every experiment state of the run together; read, parsed and dropped one by one
    run_records: DocumentBounds = RUN_RECORD_BOUNDS

    @property
    def experiment_state_bounds(self) -> DocumentBounds:
        """One experiment state, and each trial document inside it (Tune nests them as JSON strings)."""
        size = min(MAX_DOCUMENT_BYTES, self.experiment_state_bytes)
        return DocumentBounds(max_bytes=size, max_depth=64, max_elements=max(1024, size // PARSED_BYTES_PER_ELEMENT))

    @property
    def listed_keys_at_most(self) -> int:
        """How many keys of 60 characters (a typical checkpoint file's) the listing's share holds."""
        return self.listing_bytes // (LISTED_KEY_OVERHEAD_BYTES + 2 * 60)


@dataclass(frozen=True)
class MemoryBudget:
    """The tenant share of the pod's memory, split into a fixed share per verification and per poll that may run at
    once: one run past its share fails for its sweep alone, and all of them together stay within the limit."""

    limit_bytes: int
    limit_known: bool
    tenant_bytes: int
    verification_bytes: int
    poll_bytes: int
    verification: VerificationBudget
    run_records: DocumentBounds  # what a progress poll reads of status.json / result.json

    @staticmethod
    def from_limit(limit_bytes: int, *, verifications: int, readers: int) -> MemoryBudget:
        """`limit_bytes`: the pod's memory limit (0: unknown, the chart's default assumed); `verifications`: how many
        run at once (the guard's pool and the finishing sweeps' pool); `readers`: the threads that may read a run's
        status or result document at once (the reconcile, guard and finishing workers)."""
        return _budget(int(limit_bytes), max(1, verifications), max(1, readers))

    def describe(self) -> str:
        """One line for the startup log and docs/guard.md's example."""
        source = "the pod's limit" if self.limit_known else "no limit known, the chart's default assumed"
        return (
            f"memory budget: limit {self.limit_bytes // MiB} MiB ({source}); tenants' data {self.tenant_bytes // MiB}"
            f" MiB: {self.verification_bytes / MiB:.1f} MiB per verification (listing {_mib(self.verification.listing_bytes)}"
            f", about {self.verification.listed_keys_at_most} keys; experiment states {_mib(self.verification.experiment_state_bytes)}"
            f" in at most {self.verification.experiment_state_files} files), {self.poll_bytes / MiB:.1f} MiB per poll"
            f" (status and result documents up to {self.run_records.max_bytes // KiB} KiB, {self.run_records.max_elements} elements)"
        )


def _mib(size: int) -> str:
    return f"{size / MiB:.1f} MiB"


@lru_cache(maxsize=16)
def _budget(limit_bytes: int, verifications: int, readers: int) -> MemoryBudget:
    known = limit_bytes > 0
    limit = limit_bytes if known else DEFAULT_MEMORY_LIMIT_BYTES
    tenant = max(limit - max(limit // 2, OWN_BYTES_AT_LEAST), TENANT_BYTES_AT_LEAST)
    # Three quarters to the verifications (each holds a whole run's listing), a quarter to the status and result
    # documents read at once (one each); a small limit shrinks the documents' bounds below what the operator needs.
    per_verification = tenant * 3 // 4 // verifications
    per_poll = tenant // 4 // readers
    size = min(RUN_RECORD_BOUNDS.max_bytes, per_poll // 4)
    records = DocumentBounds(
        max_bytes=size,
        max_depth=RUN_RECORD_BOUNDS.max_depth,
        max_elements=max(1024, min(RUN_RECORD_BOUNDS.max_elements, (per_poll - size) // PARSED_BYTES_PER_ELEMENT)),
    )
    verification = VerificationBudget(
        listing_bytes=per_verification // 2,
        experiment_state_files=MAX_EXPERIMENT_STATE_FILES,
        experiment_state_bytes=per_verification // 2,
        run_records=records,
    )
    return MemoryBudget(limit, known, tenant, per_verification, per_poll, verification, records)


# One verification with a process of its own (`sweepctl verify`, `sweepctl release`): the default limit's whole
# tenant share.
STANDALONE_BUDGET: Final = MemoryBudget.from_limit(0, verifications=1, readers=1)
