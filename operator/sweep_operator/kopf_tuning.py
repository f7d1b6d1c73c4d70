"""Targeted adjustments to kopf's internals, applied when the operator starts (kopf-aware, like `handlers`).

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

`tune_watch_router`: kopf hands every watch event to a per-object worker that builds causes, body views and a
logger before any handler (or its `when=`) can say the event is of no interest. Our own writes' echoes (a sweep's
status and finalizer writes, a RayJob's create) were half of the events into the operator in a burst, and our
handlers only note, check and enqueue. An operator registers a `WatchRouter` on its kopf settings
(`set_watch_router`): an event it calls an echo is dropped, and a resource it routes is handled by the route before
kopf's multiplexer (a route may leave an event to kopf). The watch itself is untouched (kopf's resourceVersion
bookkeeping, re-lists and reconnects happen inside `infinite_watch`, before the router). Applied on the same
conditions and switch as the others.

`tune_json_patch`: kopf's `Patch.as_json_patch` deep-copies the whole body before it looks whether the patch is
empty, and diffs the whole body after; every admission response pays it (an empty patch for each validation, the
finalizer for each sweep's mutation), as does each patch kopf writes. The tuned one answers an empty patch at once and,
for a merge patch without callables, copies and diffs only the top-level fields the patch names: the same operations,
since the other fields are unchanged. A patch with callables (they may touch anything) goes to kopf's own.

`tune_gc` (the operator's process only, not in-process tests): the garbage collector's thresholds for a process
whose live objects are mostly parsed watch bodies and kopf's per-object state.
"""

from __future__ import annotations

import copy
import gc
import importlib.metadata
import inspect
import json
import logging
import os
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import Any

import orjson
from kopf._cogs.aiokits import aiotasks
from kopf._cogs.clients import api, watching
from kopf._cogs.structs import patches
from kopf._core.reactor import queueing

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


def _applies(written_for: Any, marker: str, what: str) -> bool:
    """Whether an adjustment may go in: not switched off (`SWEEP_KOPF_UNTUNED`), the kopf version it was written
    for, and `marker` still in the source of what it replaces (else kopf is left as it is, with a warning)."""
    if os.environ.get(UNTUNED_ENV, "").strip() in ("1", "true"):
        log.info("kopf's %s left as it ships (%s is set)", what, UNTUNED_ENV)
        return False
    version = importlib.metadata.version("kopf")
    try:
        source = inspect.getsource(written_for)
    except (OSError, TypeError):
        source = ""
    if version != KOPF_VERSION or marker not in source:
        log.warning(
            "kopf %s: its %s left as it is (the adjustment was written for kopf %s)", version, what, KOPF_VERSION
        )
        return False
    return True


def tune_kopf() -> bool:
    """Apply the adjustment (idempotent). Returns whether kopf now runs with it."""
    current = aiotasks.Scheduler.spawn
    if getattr(current, "tuned_by_sweep_operator", False):
        return True
    if not _applies(current, _YIELD, "scheduler"):
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
    if not _applies(api.stream, _DECODE, "watch decoding"):
        return False
    api.json = _WatchJson()  # type: ignore[assignment]  # the patch itself (see the module docstring)
    return True


_WATCH_CALL = "watching.infinite_watch("  # kopf 1.45.2's `queueing.watcher`: where each stream comes from
UNTUNED_INFINITE_WATCH = watching.infinite_watch  # as kopf ships it (only this module replaces it)
_ROUTER_ATTRIBUTE = "sweep_operator_watch_router"


class WatchRouter:
    """One operator's say over its raw watch events before kopf's multiplexer: our own writes' echoes are dropped
    (`is_echo` over (resource plural, object)), and a resource with a route is handled by it instead of kopf's
    per-object workers (the route runs in kopf's event loop and must not block). Counts both per plural."""

    def __init__(self, is_echo: Callable[[str, Mapping[str, Any]], bool]) -> None:
        self.is_echo = is_echo
        self.routes: dict[str, Callable[[Mapping[str, Any]], bool]] = {}
        self.dropped: Counter[str] = Counter()
        self.routed: Counter[str] = Counter()

    def route(self, plural: str, handle: Callable[[Mapping[str, Any]], bool]) -> None:
        """`handle` takes a raw event (True) or leaves it to kopf (False)."""
        self.routes[plural] = handle

    def takes(self, plural: str, raw_event: Any) -> bool:
        """Whether the event stops here (dropped or routed); kopf gets everything else as it ships."""
        if not isinstance(raw_event, dict) or not isinstance(raw_event.get("object"), dict):
            return False  # bookmarks and errors: kopf's
        kind = raw_event.get("type")
        if kind in ("ADDED", "MODIFIED") and self.is_echo(plural, raw_event["object"]):
            self.dropped[plural] += 1
            return True
        handle = self.routes.get(plural)
        if handle is None or kind not in (None, "ADDED", "MODIFIED", "DELETED"):  # None: the listing's
            return False
        if not handle(raw_event):
            return False
        self.routed[plural] += 1
        return True


def set_watch_router(settings: Any, router: WatchRouter) -> None:
    """Register an operator's router on its kopf settings (each operator in a process has its own)."""
    setattr(settings, _ROUTER_ATTRIBUTE, router)


async def _routed_infinite_watch(*, settings: Any, resource: Any, **kwargs: Any) -> AsyncIterator[Any]:
    """kopf's `infinite_watch`, less the events the operator's router takes."""
    router: WatchRouter | None = getattr(settings, _ROUTER_ATTRIBUTE, None)
    async for raw_event in UNTUNED_INFINITE_WATCH(settings=settings, resource=resource, **kwargs):
        if router is not None and router.takes(resource.plural, raw_event):
            continue
        yield raw_event


def tune_watch_router() -> bool:
    """Let operators take watch events before kopf's per-object processing (idempotent). Returns whether kopf now
    does; without it the routers are never asked and every event reaches kopf's handlers as it ships."""
    if watching.infinite_watch is _routed_infinite_watch:
        return True
    if not _applies(queueing.watcher, _WATCH_CALL, "watch streams"):
        return False
    watching.infinite_watch = _routed_infinite_watch  # the patch itself (see the module docstring)
    return True


UNTUNED_AS_JSON_PATCH = patches.Patch.as_json_patch  # as kopf ships it (only this module replaces it)
_COPY_BEFORE_EMPTY = "body_to_be: bodies.RawBody | None = copy.deepcopy(body_as_is)\n        if not self:"


def _as_json_patch(self: patches.Patch, body: Any = None) -> Any:
    """kopf 1.45.2 `Patch.as_json_patch`: the same operations, from the fields the patch names only."""
    if not self:
        return []
    if self.fns:
        return UNTUNED_AS_JSON_PATCH(self, body)
    base = body if body is not None else self._original
    if base is None:
        raise ValueError("Cannot build a JSON-patch without the original body as a reference.")
    as_is = {key: base[key] for key in self if key in base}
    to_be: Any = copy.deepcopy(as_is)  # kopf's RawBody: a plain dict
    self._apply_patch(to_be, (), dict(self))  # kopf's own merge of the patch into the copy
    return patches.jsonpatch.JsonPatch.from_diff(as_is, to_be).patch


def tune_json_patch() -> bool:
    """Install `_as_json_patch` (idempotent). Returns whether kopf now uses it."""
    if patches.Patch.as_json_patch is _as_json_patch:
        return True
    if not _applies(UNTUNED_AS_JSON_PATCH, _COPY_BEFORE_EMPTY, "JSON patches"):
        return False
    patches.Patch.as_json_patch = _as_json_patch  # type: ignore[method-assign]  # the patch itself (docstring)
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
