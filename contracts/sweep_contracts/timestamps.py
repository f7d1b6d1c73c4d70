"""The one RFC 3339 form every part writes (UTC, whole seconds, `Z`), and its reader."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["parse_time", "rfc3339"]


def rfc3339(moment: datetime | float | None = None) -> str:
    """`moment` (a datetime, Unix time, or now when None) as `2026-12-03T15:00:00Z`."""
    if moment is None:
        moment = datetime.now(UTC)
    elif not isinstance(moment, datetime):
        moment = datetime.fromtimestamp(moment, tz=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> datetime | None:
    """An RFC 3339 time as an aware datetime (None when empty); ValueError when malformed."""
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))
