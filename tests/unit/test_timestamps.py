"""The one RFC 3339 form (sweep_contracts.timestamps): what the operator, the sandbox and the driver all write."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from sweep_contracts.timestamps import epoch_seconds, parse_time, rfc3339


@pytest.mark.parametrize(
    "moment,text",
    [
        (0, "1970-01-01T00:00:00Z"),
        (1796320497.9, "2026-12-03T17:54:57Z"),  # whole seconds: the fraction is dropped, not rounded
        (datetime(2026, 12, 3, 18, 0, tzinfo=timezone(timedelta(hours=2))), "2026-12-03T16:00:00Z"),
    ],
)
def test_rfc3339_writes_utc_whole_seconds(moment: float | datetime, text: str) -> None:
    assert rfc3339(moment) == text
    parsed = parse_time(text)
    assert parsed is not None and parsed.tzinfo is not None and rfc3339(parsed) == text


def test_now_and_empty() -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    parsed = parse_time(rfc3339())
    assert parsed is not None and before <= parsed <= datetime.now(UTC)
    assert parse_time("") is None and parse_time(None) is None
    with pytest.raises(ValueError):
        parse_time("yesterday")


@pytest.mark.parametrize(
    "value,seconds",
    [
        ("2026-12-03T17:54:57Z", 1796320497.0),
        ("2026-12-03T17:54:57.5+00:00", 1796320497.5),  # KubeRay's metav1.MicroTime fraction is kept
        ("2026-12-03T17:54:57", 1796320497.0),  # no offset: UTC, as every writer here writes (not the local zone)
        (1796320497, 1796320497.0),  # already seconds (the driver's progress file)
        (12.5, 12.5),
        (True, None),  # a bool is not a time, though Python counts it as an int
        (None, None),
        ("", None),
        ("yesterday", None),  # another writer's garbage is skipped, not a crash in a reconcile pass
        ({"at": 1}, None),
    ],
)
def test_epoch_seconds_is_the_one_reader_of_times_and_numbers(value: object, seconds: float | None) -> None:
    assert epoch_seconds(value) == seconds
