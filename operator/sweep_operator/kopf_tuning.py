"""Two targeted adjustments to kopf's internals, applied when the operator starts (kopf-aware, like `handlers`).

kopf multiplexes each watch stream into one worker task per object. For every object it has not seen yet,
its scheduler's `spawn()` ends with `await asyncio.sleep(0)`, which kopf's source says is "mainly for tests".
That sleep sends the watcher to the back of the event loop's ready queue once per new object. When
hundreds of object workers are busy, each trip is a full loop iteration, so a burst of new sweeps arrives
no faster than one per iteration.

We measured this at 1000 sweeps applied at once: the emulator had written every ADDED event within the 5 s
apply, yet kopf's watcher read them 15 s (p50) to 31 s (max) later. Once read, an event reached our handler
in 0.15 s. See docs/benchmarks.md.

The replacement is kopf 1.45.2's `spawn()` without that final sleep. Coroutines are still queued under the
same condition, and kopf's spawner task still starts them, all pending at once. Only the watcher's needless
yield goes. It is applied only to the kopf version it was written against, and only when that version's
source still has the sleep. Otherwise kopf is left as it is, with a warning. `SWEEP_KOPF_UNTUNED=1` in the
operator's environment leaves kopf as it ships (to measure the gain: bench/operator_scale.py with and without).

`tune_watch_decoding`: kopf decodes every line of its watch streams with the standard library's `json.loads`, a
fifth of the operator's CPU in a burst (docs/benchmarks.md); orjson decodes them instead, and anything orjson refuses
(an integer over 64 bits, a NaN in a tenant's spec) is decoded by `json` as before, so no object stops a watch.
Applied on the same conditions and switch as the scheduler's.

`tune_gc` (the operator's process only, not in-process tests): the garbage collector's thresholds for a process
whose live objects are mostly parsed watch bodies and kopf's per-object state.
"""

from __future__ import annotations

import gc
import importlib.metadata
import inspect
import json
import logging
import os
from collections.abc import Coroutine
from typing import Any

import orjson
from kopf._cogs.aiokits import aiotasks
from kopf._cogs.clients import api

log = logging.getLogger(__name__)

KOPF_VERSION = "1.45.2"  # pinned in pyproject.toml; a new kopf needs this module re-read against its source
_YIELD = "await asyncio.sleep(0)"
UNTUNED_ENV = "SWEEP_KOPF_UNTUNED"
UNTUNED_SPAWN = aiotasks.Scheduler.spawn  # as kopf ships it (only this module replaces it)


async def _spawn_without_yield(
    self: aiotasks.Scheduler, coro: Coroutine[Any, Any, Any], *, name: str | None = None
) -> None:
    """kopf 1.45.2 `Scheduler.spawn`, less its trailing zero-second sleep."""
    if self._closed:
        await aiotasks.cancel_coro(coro=coro, name=name)
        raise RuntimeError("Cannot add new coroutines to a closed and inactive scheduler.")
    async with self._condition:
        await self._pending_coros.put(aiotasks.SchedulerJob(coro=coro, name=name))
        self._condition.notify_all()  # -> kopf's task_spawner()


_spawn_without_yield.tuned_by_sweep_operator = True  # type: ignore[attr-defined]  # a marker on a function object


def tune_kopf() -> bool:
    """Apply the adjustment (idempotent). Returns whether kopf now runs with it."""
    current = aiotasks.Scheduler.spawn
    if getattr(current, "tuned_by_sweep_operator", False):
        return True
    if os.environ.get(UNTUNED_ENV, "").strip() in ("1", "true"):
        log.info("kopf's scheduler left as it ships (%s is set)", UNTUNED_ENV)
        return False
    version = importlib.metadata.version("kopf")
    try:
        source = inspect.getsource(current)
    except (OSError, TypeError):
        source = ""
    if version != KOPF_VERSION or _YIELD not in source:
        log.warning("kopf %s: scheduler left as it is (the adjustment was written for kopf %s)", version, KOPF_VERSION)
        return False
    aiotasks.Scheduler.spawn = _spawn_without_yield  # type: ignore[method-assign]  # the patch itself (see above)
    return True


_DECODE = "json.loads(line.decode('utf-8'))"  # kopf 1.45.2's `api.stream`, the one use of `json` in that module


class _WatchJson:
    """The `json` kopf's watch stream sees: orjson's decoder, the standard one for what orjson refuses."""

    @staticmethod
    def loads(text: str | bytes) -> Any:
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:  # orjson is stricter than json (big integers, NaN): decode as kopf would
            return json.loads(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(json, name)


UNTUNED_JSON = api.json  # as kopf ships it (only this module replaces it)


def tune_watch_decoding() -> bool:
    """Decode kopf's watch streams with orjson (idempotent). Returns whether kopf now does."""
    if isinstance(api.json, _WatchJson):
        return True
    if os.environ.get(UNTUNED_ENV, "").strip() in ("1", "true"):
        return False
    version = importlib.metadata.version("kopf")
    try:
        source = inspect.getsource(api.stream)
    except (OSError, TypeError):
        source = ""
    if version != KOPF_VERSION or _DECODE not in source:
        log.warning(
            "kopf %s: watch decoding left as it is (the adjustment was written for kopf %s)", version, KOPF_VERSION
        )
        return False
    api.json = _WatchJson()  # type: ignore[assignment]  # the patch itself (see the module docstring)
    return True


# Young collections every 10,000 net container allocations instead of 700; a full one after 20 x 20 of those, and
# (CPython's own rule) only when the objects that survived since the last full one are a quarter of the old ones.
GC_THRESHOLDS = (10_000, 20, 20)
UNTUNED_GC_ENV = "SWEEP_GC_UNTUNED"


def tune_gc() -> bool:
    """Raise the collector's thresholds and move everything alive now (imports, settings, clients: the operator's
    start-up) out of its reach for good (gc.freeze). A burst of watch events allocates a container per JSON field;
    with CPython's defaults each 700 of them run a young collection, and full collections walk every object the
    process ever kept (the modules and their classes too), a quarter of the operator's CPU in a burst of 1,000
    sweeps (docs/benchmarks.md). Cycles are still collected, only less often. `SWEEP_GC_UNTUNED=1` leaves it."""
    if os.environ.get(UNTUNED_GC_ENV, "").strip() in ("1", "true"):
        return False
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    return True
