"""Experiment tracking as the driver reports it and the operator mirrors it: the run's `tracking` block, status.tracking
and the TrackingAvailable condition.

The block is written by training_entrypoints.tracking into the run's progress documents; one module, so both ends read
it the same way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

CONDITION: Final = "TrackingAvailable"
REASON_AVAILABLE: Final = "Logging"
REASON_UNAVAILABLE: Final = "TrackingServerUnavailable"
REASON_CAUGHT_UP: Final = "TrackingCaughtUp"
DOCUMENT_KEY: Final = "tracking"  # the block's key in _sweep/status.json and _sweep/result.json
BACKEND_MLFLOW: Final = "mlflow"

# The tags that find a sweep's runs again (a resumed attempt, a restarted driver): never the run names, which a
# user may edit in the UI.
TAG_NAMESPACE: Final = "sweeps.dev/namespace"
TAG_SWEEP: Final = "sweeps.dev/sweep"
TAG_RUN_ID: Final = "sweeps.dev/run-id"
TAG_TRIAL_ID: Final = "sweeps.dev/trial-id"
TAG_ROLE: Final = "sweeps.dev/role"  # "sweep" on the parent run, "trial" on each child
TAG_CHECKPOINT: Final = "sweeps.dev/checkpoint"  # the trial's last committed checkpoint (s3:// URI)
TAG_BEST_CHECKPOINT: Final = "sweeps.dev/best-checkpoint"  # its best committed checkpoint, at the end of the run
# The highest step logged on a trial's run: a continuing driver numbers the trial's next reports after it.
TAG_LAST_STEP: Final = "sweeps.dev/last-step"
ROLE_SWEEP: Final = "sweep"
ROLE_TRIAL: Final = "trial"

# The block is written by the tenant's driver: ids must look like MLflow's (hex run ids, numeric experiment ids)
# before they go into a URL, and messages are cut.
_ID_RE = re.compile(r"^[0-9A-Za-z_-]{1,64}$")
_ERROR_CHARS: Final = 300


def default_experiment_name(namespace: str, sweep: str) -> str:
    """spec.tracking.mlflow.experimentName when left empty."""
    return f"{namespace}/{sweep}"


def run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """The MLflow UI's page of a run."""
    return f"{tracking_uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _id(value: Any) -> str | None:
    return value if isinstance(value, str) and _ID_RE.match(value) else None


@dataclass(frozen=True)
class TrackingState:
    """What the driver last said about its tracking server."""

    tracking_uri: str
    experiment_id: str | None
    run_id: str | None
    available: bool
    pending: int
    dropped: int
    error: str

    @property
    def url(self) -> str | None:
        if self.experiment_id and self.run_id:
            return run_url(self.tracking_uri, self.experiment_id, self.run_id)
        return None

    def status(self) -> dict[str, Any]:
        """status.tracking (camelCase, as the CRD has it)."""
        return {
            "url": self.url,
            "experimentId": self.experiment_id,
            "runId": self.run_id,
            "available": self.available,
            "pending": self.pending,
            "dropped": self.dropped,
            "lastError": None if self.available else (self.error or None),
        }

    @classmethod
    def from_status(cls, block: Mapping[str, Any] | None, tracking_uri: str | None) -> TrackingState | None:
        """The state back from status.tracking (what `status()` wrote), None without one."""
        if not tracking_uri or not isinstance(block, Mapping) or "available" not in block:
            return None
        error = block.get("lastError")
        return _state(block, tracking_uri, error if isinstance(error, str) else "")

    @property
    def reason(self) -> str:
        return REASON_AVAILABLE if self.available else REASON_UNAVAILABLE

    @property
    def message(self) -> str:
        dropped = (
            f"; {self.dropped} metric points were dropped while it was unreachable (the driver keeps a bounded buffer)"
            if self.dropped
            else ""
        )
        if self.available:
            return f"logging to the MLflow tracking server at {self.tracking_uri}{dropped}"
        # No counts that change every report: the operator says it again only when the message changes.
        return (
            f"the MLflow tracking server at {self.tracking_uri} does not answer ({self.error or 'no reply'}); "
            "training goes on, and what could not be logged is logged when it answers again, up to the driver's "
            f"buffer{dropped}"
        )


def tracking_state(doc: Mapping[str, Any] | None, tracking_uri: str | None) -> TrackingState | None:
    """The driver's tracking block of `doc`, judged against the admitted spec's `tracking_uri` (the URL the status
    links to is built from it, never taken from the document); None without tracking or a block."""
    block = (doc or {}).get(DOCUMENT_KEY)
    if not tracking_uri or not isinstance(block, Mapping) or block.get("backend") != BACKEND_MLFLOW:
        return None
    error = block.get("error")
    return _state(block, tracking_uri, " ".join(error.split())[:_ERROR_CHARS] if isinstance(error, str) else "")


def _state(block: Mapping[str, Any], tracking_uri: str, error: str) -> TrackingState:
    """The fields a driver's block and the status's block share (each names and bounds its error itself)."""
    return TrackingState(
        tracking_uri=tracking_uri,
        experiment_id=_id(block.get("experimentId")),
        run_id=_id(block.get("runId")),
        available=block.get("available") is True,
        pending=_count(block.get("pending")),
        dropped=_count(block.get("dropped")),
        error=error,
    )


def tracking_uri_of(spec: Any) -> str | None:
    """spec.tracking.mlflow.trackingUri of a parsed SweepSpec, None without tracking."""
    tracking = getattr(spec, "tracking", None)
    mlflow = getattr(tracking, "mlflow", None)
    uri = getattr(mlflow, "tracking_uri", None)
    return uri if isinstance(uri, str) and uri else None
