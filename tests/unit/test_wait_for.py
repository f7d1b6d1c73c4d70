"""`tests.support.waiting.wait_for`, the poll every sandbox and integration test waits with."""

from __future__ import annotations

import time

import pytest

from tests.support.waiting import GiveUp, wait_for


def test_errors_count_as_not_yet_until_the_condition_holds() -> None:
    calls: list[int] = []

    def condition() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise KeyError("not created yet")
        return "there"

    assert wait_for(condition, 5, interval=0) == "there"
    assert len(calls) == 3


def test_a_timeout_names_what_was_awaited_and_the_last_error() -> None:
    def condition() -> None:
        raise KeyError("404")

    with pytest.raises(TimeoutError, match=r"waiting for the pod \(last error: KeyError\('404'\)\)"):
        wait_for(condition, 0.05, interval=0.01, what="the pod")


def test_give_up_ends_the_wait_at_once() -> None:
    # A sweep that Failed never succeeds: waiting out the timeout only hides the reason for minutes.
    calls: list[int] = []

    def condition() -> None:
        calls.append(1)
        raise GiveUp("the sweep failed: local Ray exited")

    started = time.monotonic()
    with pytest.raises(GiveUp, match="local Ray exited"):
        wait_for(condition, 60, interval=0.01)
    assert calls == [1] and time.monotonic() - started < 30
