"""The GPUHourLedger's spec and status as pydantic models (its CRD is generated from them) and the bounds that keep
one namespace's ledger object small."""

from __future__ import annotations

from pydantic import Field

from .status_models import StatusModel

LEDGER_MAX_SWEEPS = 128  # entries past which the oldest that reserve nothing merge into one (docs/budgets.md)
# Admitted GPU attempts one namespace's ledger holds reservations for at once; a further attempt waits Queued until
# one ends. Entries that reserve cannot merge (each is its attempt's promise), so the object must hold them all: this
# many beside LEDGER_MAX_SWEEPS others, each at most 17 intervals, stay under 1 MiB (tests/unit/test_hours_ledger.py).
LEDGER_MAX_RESERVATIONS = 256
LEDGER_MAX_ENTRIES = LEDGER_MAX_SWEEPS + LEDGER_MAX_RESERVATIONS  # the CRD's bound on status.sweeps
LEDGER_MAX_INTERVALS = 64  # per entry; finished ones merge past 16 (a sweep's own record holds at most 64)


class LedgerIntervalStatus(StatusModel):
    pod: str = Field(..., description="The pod's uid; merged:<uid> for finished intervals merged into one.")
    gpus: float = Field(..., description="nvidia.com/gpu held (a merged entry: their mean over its span).")
    start: str = Field(..., description="When the pod was scheduled, RFC 3339.")
    end: str | None = Field(None, description="When it stopped holding GPUs, RFC 3339; unset while it still does.")


class LedgerReservationStatus(StatusModel):
    gpu_hours: float = Field(..., description="GPU-hours granted to the attempt at its admission (its worst case).")
    since: str = Field(..., description="The admission; the attempt's use from here on spends the reservation.")
    attempt: str = Field(..., description="Which admission of the sweep: initial, or resume-<n>.")
    run_until_exhausted: bool | None = Field(
        None, description="The attempt reserved what was left of the window; it is stopped when that is spent."
    )


class LedgerSweepStatus(StatusModel):
    name: str = Field(..., description="The sweep's name (a re-created sweep of the same name is another entry).")
    uid: str = Field(..., description="The sweep's uid.")
    deleted: bool | None = Field(None, description="The sweep is gone; its hours stay until they leave the window.")
    used_gpu_hours: float | None = Field(None, description="GPU-hours it used inside the window, at updatedAt.")
    reserved_gpu_hours: float | None = Field(
        None, description="What is left of its reservation at updatedAt (0 once its run ended)."
    )
    reservation: LedgerReservationStatus | None = Field(None, description="The admitted attempt's reservation.")
    intervals: list[LedgerIntervalStatus] | None = Field(
        None, max_length=LEDGER_MAX_INTERVALS, description="Its GPU pods' intervals (the record itself)."
    )


class GPUHourLedgerSpec(StatusModel):
    gpu_hours: float = Field(..., description="The namespace's GPU-hour budget per window (the platform team's).")
    window_seconds: int = Field(..., description="The rolling window the budget counts over, in seconds.")


class GPUHourLedgerStatus(StatusModel):
    used_gpu_hours: float | None = Field(None, description="GPU-hours used inside the window, at updatedAt.")
    reserved_gpu_hours: float | None = Field(
        None, description="GPU-hours promised to admitted attempts and not yet used, at updatedAt."
    )
    left_gpu_hours: float | None = Field(None, description="The budget less use and reservations, at updatedAt.")
    window: str | None = Field(None, description="The window, for people (7d).")
    frees_at: str | None = Field(
        None, description="When the window's use falls enough for one more GPU-hour (unset: there is room now)."
    )
    updated_at: str | None = Field(None, description="When the operator last wrote the ledger (RFC 3339).")
    sweeps: list[LedgerSweepStatus] | None = Field(
        None,
        max_length=LEDGER_MAX_ENTRIES,
        description="Every sweep (deleted ones too) with GPU-hours in the window or a reservation.",
    )
