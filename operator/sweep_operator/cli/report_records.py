"""What `sweepctl report` reads, as `RunRecords`: the run root's records (a local directory or S3), and the sweep's name
and final phase from the cluster or the run root."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sweep_contracts.api import DRIVER_END_PHASES, DRIVER_STOPPED

from ..status import epoch_seconds


@dataclass
class RunRecords:
    """Everything a report shows, as read (no I/O after this point)."""

    root: str
    sweep: Mapping[str, Any] | None = None  # the TrainingSweep object, when the cluster was read
    progress: Mapping[str, Any] | None = None  # _sweep/status.json
    result: Mapping[str, Any] | None = None  # _sweep/result.json
    trial_results: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # tune/<trial>/result.json rows
    trial_params: dict[str, dict[str, Any]] = field(default_factory=dict)  # tune/<trial>/params.json
    verification: Mapping[str, Any] | None = None  # verification.VerificationResult.to_dict()
    events: list[Mapping[str, Any]] = field(default_factory=list)  # {time, object, reason, message}

    @property
    def status(self) -> Mapping[str, Any]:
        return (self.sweep or {}).get("status") or {}

    @property
    def spec(self) -> Mapping[str, Any]:
        return (self.sweep or {}).get("spec") or {}


class RunStore(Protocol):
    def read(self, relative: str) -> bytes | None: ...

    def trial_dirs(self) -> list[str]: ...


class LocalStore:
    def __init__(self, root: str) -> None:
        self.root = Path(root)

    def read(self, relative: str) -> bytes | None:
        path = self.root / relative
        return path.read_bytes() if path.is_file() else None

    def trial_dirs(self) -> list[str]:
        tune = self.root / "tune"
        return sorted(p.name for p in tune.iterdir() if p.is_dir()) if tune.is_dir() else []


class S3Store:
    def __init__(self, client: Any, root: str) -> None:
        from sweep_contracts.s3_layout import S3Uri

        self.client, self.uri = client, S3Uri.parse(root)

    def read(self, relative: str) -> bytes | None:
        try:
            return self.client.get_object(Bucket=self.uri.bucket, Key=self.uri.join(relative).key)["Body"].read()
        except Exception as exc:  # absent: the report shows what there is; any other S3 error is reported
            code = (getattr(exc, "response", None) or {}).get("Error", {}).get("Code")
            if code in ("NoSuchKey", "404"):
                return None
            raise

    def trial_dirs(self) -> list[str]:
        prefix = self.uri.join("tune").prefix
        names: set[str] = set()
        for page in self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.uri.bucket, Prefix=prefix, Delimiter="/"
        ):
            names.update(p["Prefix"][len(prefix) :].strip("/") for p in page.get("CommonPrefixes", []))
        return sorted(names)


def _json(data: bytes | None) -> Any:
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


def _json_lines(data: bytes | None) -> list[dict[str, Any]]:
    rows = []
    for line in (data or b"").decode(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line still being written by a running trial
        if isinstance(row, dict):
            rows.append(row)
    return rows


def read_records(store: RunStore, root: str, *, sweep: Mapping[str, Any] | None = None) -> RunRecords:
    """What the run root holds: progress, result, and every trial's Tune results (the per-epoch metrics)."""
    from sweep_contracts import s3_layout

    records = RunRecords(root=root, sweep=sweep)
    records.progress = _json(store.read(s3_layout.STATUS_KEY))
    records.result = _json(store.read(s3_layout.RESULT_KEY))
    for trial in store.trial_dirs():
        rows = _json_lines(store.read(f"{s3_layout.TUNE_EXPERIMENT_NAME}/{trial}/result.json"))
        params = _json(store.read(f"{s3_layout.TUNE_EXPERIMENT_NAME}/{trial}/params.json"))
        if rows or isinstance(params, dict):
            records.trial_results[trial] = rows
            records.trial_params[trial] = {k: v for k, v in (params or {}).items() if not k.startswith("_")}
    return records


# ------------------------------------------------------------------------------ the sweep and how its run ended

# The phases the driver writes when its run is over (training_entrypoints.sweep): Stopped is a graceful stop by a
# signal (a delete, a Kueue preemption, a budget), the others end the run.


def sweep_identity(records: RunRecords) -> tuple[str, str]:
    """(namespace, name) of the sweep: its metadata, else result.json's, else the run root's own path, which is
    `<storage.uri>/<namespace>/<sweep>-<runId>` (a run id never holds a dash), else the root itself."""
    meta = (records.sweep or {}).get("metadata") or {}
    if meta.get("name"):
        return str(meta.get("namespace") or ""), str(meta["name"])
    result = records.result or {}
    if result.get("sweep"):
        return str(result.get("namespace") or ""), str(result["sweep"])
    parts = [p for p in records.root.rstrip("/").split("/") if p]
    if len(parts) >= 2 and "-" in parts[-1]:
        return parts[-2], parts[-1].rsplit("-", 1)[0]
    return "", parts[-1] if parts else records.root


def _result_phase(result: Mapping[str, Any]) -> str:
    if result.get("errors"):
        return "Failed"
    return "DeadlineExceeded" if result.get("deadlineReached") else "Succeeded"


def _attempt(document: Mapping[str, Any] | None) -> int:
    value = (document or {}).get("attempt")
    return value if isinstance(value, int) else 1


@dataclass(frozen=True)
class RunEnd:
    """How the run ended as its records say: `phase` (the sweep's own while it exists), `run_phase` (the driver's
    last word) and a sentence saying where that comes from."""

    phase: str
    run_phase: str
    detail: str


def run_end(records: RunRecords) -> RunEnd:
    """The phase the run ended in: the driver's status.json once it wrote an end phase (a graceful stop after a
    delete writes Stopped, no result.json), else result.json's outcome, else the last phase recorded."""
    progress, result = records.progress or {}, records.result
    recorded = str(progress.get("phase") or "")
    if recorded in DRIVER_END_PHASES:
        run_phase, detail = recorded, f"the driver recorded {recorded} at {progress.get('updatedAt') or '?'}"
        stop = progress.get("stop") or {}
        if recorded == DRIVER_STOPPED and stop:
            detail += f" (stopped by {stop.get('signal') or progress.get('stoppedBy') or 'a signal'}"
            detail += f" requested at {stop.get('requestedAt') or '?'}, after {stop.get('waitedSeconds', '?')} s)"
    elif result is not None and _attempt(result) >= _attempt(progress):
        run_phase = _result_phase(result)
        detail = f"result.json: finished at {result.get('finishedAt') or '?'}"
    elif recorded:
        run_phase = recorded
        detail = f"last recorded at {progress.get('updatedAt') or '?'}; no end recorded (still running, or killed)"
    else:
        run_phase, detail = "unknown", "the run root holds no _sweep/status.json or result.json"
    phase = str(records.status.get("phase") or "")
    if not phase or phase == run_phase:
        return RunEnd(run_phase, run_phase, detail)
    return RunEnd(phase, run_phase, f"the sweep is {phase}; its run: {run_phase} ({detail})")


def run_finished_at(records: RunRecords) -> float | None:
    """When the run ended: the sweep's finishedAt while it exists, else the driver's own records."""
    if records.sweep is not None:
        return epoch_seconds(records.status.get("finishedAt"))
    progress = records.progress or {}
    if progress.get("phase") in DRIVER_END_PHASES and records.result is None:
        stop = progress.get("stop") or {}
        return epoch_seconds(stop.get("stoppedAt")) or epoch_seconds(progress.get("updatedAt"))
    return epoch_seconds((records.result or {}).get("finishedAt"))


def trial_counts(records: RunRecords) -> str:
    """`4 total: 4 terminated` from the status' summary or the driver's counts (never a dict's repr)."""
    counts = (records.result or records.progress or {}).get("trials") or {}
    if not isinstance(counts, Mapping) or not counts:
        seen = f"{len(records.trial_results)} with results in tune/" if records.trial_results else "-"
        return str(records.status.get("trialsSummary") or seen)
    parts = [f"{counts[k]} {k}" for k in ("terminated", "running", "pending", "errored") if counts.get(k)]
    summary = f"{counts.get('total', '?')} total" + (f": {', '.join(parts)}" if parts else "")
    done = records.status.get("trialsSummary")
    return f"{done} done ({summary})" if done else summary
