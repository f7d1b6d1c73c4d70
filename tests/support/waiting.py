"""`wait_for`, the poll every sandbox and integration test waits with, and `GiveUp`, which ends a wait at once."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class GiveUp(Exception):
    """Raised by a `wait_for` condition that has seen the awaited state can no longer come (a sweep Failed)."""


def wait_for(condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02, what: str = "") -> Any:
    """Poll `condition` until it returns something truthy and return that; TimeoutError (naming `what`) otherwise.

    Exceptions from `condition` count as "not yet" (an object not created yet answers 404) until the timeout, except
    `GiveUp`, which ends the wait at once.
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            result = condition()
            if result:
                return result
        except GiveUp:
            raise
        except Exception as e:
            last_error = e
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            raise TimeoutError(f"timed out after {timeout}s waiting for {what or condition}{detail}")
        time.sleep(interval)
