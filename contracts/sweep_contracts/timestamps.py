"""The one RFC 3339 form every part writes (UTC, whole seconds, `Z`), and its reader."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["epoch_seconds", "parse_time", "rfc3339"]


def rfc3339(moment: datetime | float | None = None) -> str:
    """`moment` (a datetime, Unix time, or now when None) as `2026-12-03T15:00:00Z`."""
    if moment is None:
        moment = datetime.now(UTC)
    elif not isinstance(moment, datetime):
        moment = datetime.fromtimestamp(moment, tz=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> datetime | None:
    """An RFC 3339 time as an aware datetime (None when empty; a time without an offset is UTC, as every writer
    here writes UTC); ValueError when malformed."""
    if not value:
        return None
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def epoch_seconds(value: object) -> float | None:
    """An RFC 3339 time, or a number already in seconds, as Unix time; None when absent or unreadable (a status
    field another writer filled is a fact to skip, not a crash)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if not isinstance(value, str):
        return None
    try:
        parsed = parse_time(value)
    except ValueError:
        return None
    return parsed.timestamp() if parsed is not None else None
