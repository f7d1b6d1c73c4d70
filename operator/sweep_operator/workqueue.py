"""A controller work queue: reconcile requests by key, deduplicated, served by a few threads, most urgent first.

Watch events only say "look at this sweep again"; they land here instead of running a reconcile each in kopf's
handler thread. Like client-go's workqueue:

- a key waits in the queue at most once; asking again for a queued key only raises its priority;
- a key is never worked on by two threads at once; asking for it while it runs owes it exactly one more pass
  (this is the operator's one "one pass per key" rule: `run_now` passes in the caller's thread obey it too);
- lower priority numbers go first, then first come first served;
- a pass runs in the context variables of the latest request for its key, as kopf runs a sync handler in the
  handler's context (its loggers and settings).

The operator puts sweeps that wait for admission (no run yet) ahead of mirroring the status of running ones:
with many sweeps applied at once, the time until each gets its RayJob no longer grows with the status traffic
of those admitted before it. With `workers=0` every request runs at once in the caller's thread (tests drive
the controller that way).

Given a `flow` (the operator's is the key's namespace), the queue is fair between flows, as API Priority and
Fairness bounds one flow's share of a priority level: each flow has its own queue, flows with work take turns, and
a flow runs more keys at once than its share (`fair_share`) only on workers that would idle otherwise, keeping one
back while other flows have work. One namespace's slow passes (a Ray head that
trickles its replies, a bucket at its deadline) then hold at most its share of the workers, each for at most its
call's deadline, and another namespace's work starts on a worker kept free for it. `FairPool` is the same
discipline for tasks that have no key of their own (the guard's verifications).
"""

from __future__ import annotations

import contextvars
import heapq
import itertools
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)

URGENT = 0  # a sweep waiting for admission: its RayJob does not exist yet
ROUTINE = 1  # status mirroring, ticks, anything else


def fair_share(workers: int, flows: int) -> int:
    """The workers one flow is sure of while `flows` flows have work queued or running: an even split of all
    workers but one, rounded down (at least one). While several flows have work, the one kept back is what a flow
    arriving finds free at once; a flow at its share may borrow any other idle worker (`WorkQueue._next`), and a
    flow alone every worker."""
    if workers <= 1:
        return 1
    return max(1, (workers - 1) // max(flows, 1))


class WorkQueue(Generic[K]):
    def __init__(
        self,
        work: Callable[[K], None],
        *,
        workers: int,
        name: str = "reconcile",
        flow: Callable[[K], Hashable] | None = None,
    ) -> None:
        if workers < 0:
            raise ValueError(f"workers must be 0 (run in the caller) or more, got {workers}")
        self._work = work
        self._workers = workers
        self._name = name
        self._flow_of = flow
        self._cv = threading.Condition()
        # Each flow's own heap of (priority, seq, key); without a `flow` every key is in flow None.
        self._heaps: dict[Hashable, list[tuple[int, int, K]]] = {}
        self._turns: deque[Hashable] = deque()  # flows with queued keys that may run one now, in turn order
        self._in_turns: set[Hashable] = set()
        self._parked: set[Hashable] = set()  # flows with queued keys, holding their share of the workers
        self._flow_running: Counter[Hashable] = Counter()  # keys run by the workers, by flow
        self._flow_present: Counter[Hashable] = Counter()  # keys queued or run by the workers, by flow
        self._busy = 0  # keys run by the workers
        self._queued: dict[K, int] = {}  # key -> the priority of its live heap entry
        self._running: set[K] = set()
        self._again: dict[K, int] = {}  # running keys asked for meanwhile -> best priority asked
        self._contexts: dict[K, contextvars.Context] = {}  # key -> the context of its latest request
        self._seq = itertools.count()
        self._threads: list[threading.Thread] = []
        self._stopped = False
        self._closed = False  # for good: the operator is shutting down (close), unlike stop's restart on demand
        self._timers: dict[K, threading.Timer] = {}  # add_after without workers: one timer thread per key
        self._timer_due: dict[K, float] = {}
        # add_after with workers: one thread for every delayed key (a heap by due time), since `add` only enqueues.
        # The operator's ticks put every sweep here each interval: a timer thread per key and tick was a thread
        # start per sweep per interval, and a thousand sleeping threads.
        self._delay_cv = threading.Condition()
        self._delayed: list[tuple[float, int, K]] = []
        self._delayed_keys: dict[K, tuple[float, int, int, contextvars.Context]] = {}  # -> (due, seq, priority, ctx)
        self._delay_thread: threading.Thread | None = None

    @property
    def threaded(self) -> bool:
        """Whether requests are served by the queue's threads (else `add` runs them in the caller)."""
        return self._workers > 0

    def add(self, key: K, priority: int = ROUTINE) -> None:
        if not self.threaded:
            if not self._closed:
                self.run_now(key, priority)
            return
        with self._cv:  # `_closed` read under the lock close() sets it with: no request slips past a close
            if self._stopped or self._closed:
                return
            self._contexts[key] = contextvars.copy_context()
            if key in self._running:
                self._again[key] = min(self._again.get(key, priority), priority)
                return
            queued = self._queued.get(key)
            if queued is not None and queued <= priority:
                return
            self._push(key, priority)  # new, or more urgent than it was (the older heap entry goes stale)
            self._start_workers()

    def add_after(self, key: K, delay: float, priority: int = ROUTINE) -> None:
        """`add` once `delay` seconds have passed (client-go's AddAfter); a key waits on at most one timer, the
        earliest asked for."""
        due = time.monotonic() + max(delay, 0.0)
        if self.threaded:
            self._add_delayed(key, due, priority)
            return
        with self._cv:
            if self._stopped or self._closed:
                return
            if key in self._timers and self._timer_due[key] <= due:
                return
            old = self._timers.pop(key, None)
            if old is not None:
                old.cancel()
            # The request's context travels with it, as with `add`.
            context = contextvars.copy_context()
            timer = threading.Timer(max(delay, 0.0), context.run, args=(self._fire, key, priority))
            timer.daemon = True
            timer.name = f"{self._name}-after"
            self._timers[key], self._timer_due[key] = timer, due
        timer.start()

    def delayed(self, key: K) -> bool:
        """Whether `key` waits on an `add_after` (for tests)."""
        with self._delay_cv:
            if key in self._delayed_keys:
                return True
        with self._cv:
            return key in self._timers

    def _add_delayed(self, key: K, due: float, priority: int) -> None:
        with self._delay_cv:  # close() sets `_closed` before stop() takes this lock
            if self._stopped or self._closed:
                return
            current = self._delayed_keys.get(key)
            if current is not None and current[0] <= due:
                return
            seq = next(self._seq)
            self._delayed_keys[key] = (due, seq, priority, contextvars.copy_context())
            heapq.heappush(self._delayed, (due, seq, key))  # a replaced entry stays in the heap, stale
            if self._delay_thread is None:
                self._delay_thread = threading.Thread(target=self._run_delayed, name=f"{self._name}-after", daemon=True)
                self._delay_thread.start()
            elif self._delayed[0][1] == seq:
                # Woken only for a new earliest entry: the thread already waits for an earlier one, after which it
                # looks at the heap again (a thread woken per tick re-armed was a context switch per sweep event).
                self._delay_cv.notify()

    def _run_delayed(self) -> None:
        me = threading.current_thread()
        while True:
            with self._delay_cv:
                while True:
                    if self._delay_thread is not me:
                        return  # stopped (a later add_after starts a new thread)
                    while (
                        self._delayed and self._delayed_keys.get(self._delayed[0][2], (0, -1))[1] != self._delayed[0][1]
                    ):
                        heapq.heappop(self._delayed)  # stale: replaced by an earlier one, or dropped by stop()
                    now = time.monotonic()
                    if self._delayed and self._delayed[0][0] <= now:
                        _, _, key = heapq.heappop(self._delayed)
                        _, _, priority, context = self._delayed_keys.pop(key)
                        break
                    self._delay_cv.wait(self._delayed[0][0] - now if self._delayed else None)
            try:
                context.run(self.add, key, priority)
            except Exception:
                log.exception("%s of %s failed", self._name, key)

    def _fire(self, key: K, priority: int) -> None:
        with self._cv:
            self._timers.pop(key, None)
            self._timer_due.pop(key, None)
        try:
            self.add(key, priority)
        except Exception:  # workers=0 runs the pass here: a failure must not kill the timer thread silently
            log.exception("%s of %s failed", self._name, key)

    def run_now(self, key: K, priority: int = ROUTINE) -> None:
        """Work on `key` in the caller's thread (and once more for each burst of requests meanwhile), unless a
        pass is running elsewhere: that one then owes one more pass, and this returns at once. Errors propagate."""
        with self._cv:
            if key in self._running:
                self._again[key] = min(self._again.get(key, priority), priority)
                return
            if self._queued.pop(key, None) is not None:  # its heap entry goes stale: this pass serves it
                flow = self._flow(key)
                self._less(self._flow_present, flow)
                self._unpark()
            self._running.add(key)
        try:
            while True:
                self._work(key)
                with self._cv:
                    if self._again.pop(key, None) is None:
                        return
        finally:
            with self._cv:
                self._running.discard(key)
                self._again.pop(key, None)

    def _flow(self, key: K) -> Hashable:
        return None if self._flow_of is None else self._flow_of(key)

    def _share(self) -> int:
        if self._flow_of is None:
            return max(self._workers, 1)
        return fair_share(self._workers, len(self._flow_present))

    def _reserve(self) -> int:
        """Idle workers a flow at its share may not borrow: one while several flows have work (for a flow that
        arrives), none for a flow alone (a single tenant's burst uses every worker; a newcomer then waits for one
        pass, at most its deadline)."""
        return 1 if self._flow_of is not None and len(self._flow_present) > 1 else 0

    @staticmethod
    def _less(counter: Counter[Hashable], flow: Hashable) -> None:
        counter[flow] -= 1
        if counter[flow] <= 0:
            del counter[flow]

    def _push(self, key: K, priority: int) -> None:
        flow = self._flow(key)
        if key not in self._queued:
            self._flow_present[flow] += 1
        self._queued[key] = priority
        heapq.heappush(self._heaps.setdefault(flow, []), (priority, next(self._seq), key))
        if flow not in self._in_turns and flow not in self._parked:
            self._turns.append(flow)
            self._in_turns.add(flow)
        self._cv.notify()

    def _unpark(self) -> None:
        """Flows back in turn once they hold less than their share (a pass of theirs ended, or a flow left), or all
        of them while a worker is spare to borrow."""
        share, spare = self._share(), self._workers - self._busy > self._reserve()
        for flow in [f for f in self._parked if spare or self._flow_running[f] < share]:
            self._parked.discard(flow)
            self._turns.append(flow)
            self._in_turns.add(flow)
            self._cv.notify()

    def _next(self) -> K | None:
        """The next key to run: the head of the first flow in turn below its share (then at the back of the line
        if it has more). Stale heap entries (superseded by a more urgent one, or served by run_now) are dropped."""
        share = self._share()
        for _ in range(len(self._turns)):
            flow = self._turns.popleft()
            self._in_turns.discard(flow)
            heap = self._heaps.get(flow, [])
            while heap and self._queued.get(heap[0][2]) != heap[0][0]:
                heapq.heappop(heap)
            if not heap:
                self._heaps.pop(flow, None)
                continue
            if self._flow_running[flow] >= share and self._workers - self._busy <= self._reserve():
                self._parked.add(flow)  # at its share, and no worker to borrow beyond the one kept back
                continue
            _, _, key = heapq.heappop(heap)
            if heap:
                self._turns.append(flow)
                self._in_turns.add(flow)
            else:
                self._heaps.pop(flow, None)
            return key
        return None

    def _start_workers(self) -> None:
        while len(self._threads) < self._workers:  # started on first use: tests driving reconciles directly spawn none
            thread = threading.Thread(target=self._run, name=f"{self._name}-{len(self._threads)}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def _take(self) -> tuple[K, contextvars.Context] | None:
        with self._cv:
            while True:
                if self._stopped:
                    return None
                key = self._next()
                if key is None:
                    self._cv.wait()
                    continue
                del self._queued[key]
                self._running.add(key)
                self._flow_running[self._flow(key)] += 1
                self._busy += 1
                return key, self._contexts.pop(key, None) or contextvars.copy_context()

    def _run(self) -> None:
        while (taken := self._take()) is not None:
            key, context = taken
            try:
                context.run(self._work, key)
            except Exception:  # a failed pass is retried by the next event or tick, as kopf's on.event would be
                if threading.current_thread() not in self._threads:  # stopped meanwhile without waiting for it: it
                    # failed on what stopped after the queue (the API server), which is the shutdown, not an error
                    log.debug("%s of %s failed after the queue stopped", self._name, key, exc_info=True)
                else:
                    log.exception("%s of %s failed", self._name, key)
            finally:
                with self._cv:
                    self._running.discard(key)
                    flow = self._flow(key)
                    self._less(self._flow_running, flow)
                    self._less(self._flow_present, flow)
                    self._busy = max(0, self._busy - 1)
                    again = self._again.pop(key, None)
                    if again is not None and not self._stopped:
                        self._push(key, again)
                    self._unpark()

    def pending(self) -> int:
        """Keys waiting or running (for tests and metrics)."""
        with self._cv:
            return len(self._queued) + len(self._running)

    def close(self, timeout: float = 10.0) -> None:
        """`stop`, and refuse every later request: at shutdown a pass still running on another queue (a stop, a
        verification) may ask this one for work, which must not start new threads against a closing API server."""
        with self._cv:
            self._closed = True
        self.stop(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Forget what waits, let running passes finish, end the threads (a later `add` starts new ones)."""
        with self._cv:
            self._stopped = True
            self._heaps.clear()
            self._turns.clear()
            self._in_turns.clear()
            self._parked.clear()
            self._flow_present = Counter(self._flow_running)  # what still runs leaves as it ends
            self._queued.clear()
            self._again.clear()
            self._contexts.clear()
            for timer in self._timers.values():
                timer.cancel()
            self._timers.clear()
            self._timer_due.clear()
            self._cv.notify_all()
            threads, self._threads = self._threads, []
        with self._delay_cv:
            self._delayed.clear()
            self._delayed_keys.clear()
            self._delay_thread = None  # the thread sees it is no longer the queue's and ends
            self._delay_cv.notify_all()
        deadline = time.monotonic() + timeout
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        with self._cv:
            self._stopped = False


class FairPool:
    """An executor whose tasks are served fairly between flows (a `WorkQueue` keyed by task): the guard's
    verifications, so that one namespace's slow buckets hold at most its share of the verification threads."""

    def __init__(self, workers: int, name: str = "verify") -> None:
        if workers < 1:
            raise ValueError(f"workers must be 1 or more, got {workers}")
        self._tasks: dict[tuple[Hashable, int], tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]]
        self._tasks = {}
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._queue: WorkQueue[tuple[Hashable, int]] = WorkQueue(
            self._run, workers=workers, name=name, flow=lambda key: key[0]
        )
        self._shut = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """As `Executor.submit`, in the flow of no namespace."""
        return self.submit_to(None, fn, *args, **kwargs)

    def submit_to(self, flow: Hashable, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        key = (flow, next(self._seq))
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot submit after shutdown")
            self._tasks[key] = (future, fn, args, kwargs)
        self._queue.add(key)
        return future

    def _run(self, key: tuple[Hashable, int]) -> None:
        with self._lock:
            task = self._tasks.pop(key, None)
        if task is None:
            return
        future, fn, args, kwargs = task
        if not future.set_running_or_notify_cancel():
            return
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # the caller's future carries it, as ThreadPoolExecutor's does
            future.set_exception(exc)
        else:
            future.set_result(result)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Refuse new tasks, cancel those not started (the queue forgets them: whatever `cancel_futures` says, a
        caller must not wait for a task that will never run), let running ones end (waiting up to 10 s)."""
        with self._lock:
            self._shut = True
            pending, self._tasks = list(self._tasks.values()), {}
        for future, *_ in pending:
            future.cancel()
        self._queue.close(timeout=10.0 if wait else 0)
