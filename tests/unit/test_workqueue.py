"""The controller's work queue: deduplication, one pass at a time per key, urgent keys first."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from sweep_operator.workqueue import ROUTINE, URGENT, FairPool, WorkQueue, fair_share


def wait_until(condition: Callable[[], object], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def test_urgent_keys_go_first_and_queued_duplicates_collapse() -> None:
    done: list[str] = []
    gate = threading.Event()

    def work(key: str) -> None:
        if key == "blocker":
            gate.wait(5)
        done.append(key)

    queue: WorkQueue[str] = WorkQueue(work, workers=1)
    try:
        queue.add("blocker")  # holds the only worker while the rest queue up
        wait_until(lambda: queue.pending() == 1 and not queue._queued)
        for key in ("a", "b", "a", "c", "b"):
            queue.add(key, ROUTINE)
        queue.add("new", URGENT)
        queue.add("c", URGENT)  # raised: goes before a and b, once
        gate.set()
        wait_until(lambda: queue.pending() == 0)
        assert done == ["blocker", "new", "c", "a", "b"]
    finally:
        queue.stop()


def test_a_key_asked_for_while_it_runs_gets_exactly_one_more_pass_never_two_at_once() -> None:
    running = threading.Event()
    release = threading.Event()
    active: list[int] = [0]
    overlap: list[bool] = []
    passes: list[str] = []

    def work(key: str) -> None:
        active[0] += 1
        overlap.append(active[0] > 1)
        passes.append(key)
        if len(passes) == 1:
            running.set()
            release.wait(5)
        active[0] -= 1

    queue: WorkQueue[str] = WorkQueue(work, workers=4)
    try:
        queue.add("sweep")
        assert running.wait(5)
        for _ in range(10):
            queue.add("sweep")  # four idle workers, yet none may take it while it runs
        time.sleep(0.05)
        assert passes == ["sweep"]
        release.set()
        wait_until(lambda: queue.pending() == 0)
        assert passes == ["sweep", "sweep"] and not any(overlap)
    finally:
        queue.stop()


def test_a_failing_pass_is_logged_and_the_queue_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    done: list[str] = []

    def work(key: str) -> None:
        if key == "bad":
            raise RuntimeError("boom")
        done.append(key)

    queue: WorkQueue[str] = WorkQueue(work, workers=1)
    try:
        queue.add("bad")
        queue.add("good")
        wait_until(lambda: done == ["good"])
        assert "boom" in caplog.text
    finally:
        queue.stop()
    queue.add("after-stop")  # a stopped queue starts again on demand
    wait_until(lambda: done == ["good", "after-stop"])
    queue.stop()


def test_a_pass_the_shutdown_did_not_wait_for_fails_quietly(caplog: pytest.LogCaptureFixture) -> None:
    """The guard's queue stops without waiting (a verification may take long); its pass then fails on the API server
    stopped after it. That is the shutdown, not an error of the operator: a debug record, no traceback at ERROR."""
    import logging

    running, release = threading.Event(), threading.Event()

    def work(key: str) -> None:
        running.set()
        release.wait(5)
        raise RuntimeError("connection refused")

    queue: WorkQueue[str] = WorkQueue(work, workers=1, name="guard")
    with caplog.at_level(logging.DEBUG, logger="sweep_operator.workqueue"):
        queue.add("held")
        assert running.wait(5)
        queue.stop(timeout=0)
        release.set()
        wait_until(lambda: "failed after the queue stopped" in caplog.text)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_workers_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="workers"):
        WorkQueue(lambda key: None, workers=-1)


def test_without_workers_a_request_runs_in_the_callers_thread_and_errors_reach_it() -> None:
    seen: list[tuple[str, str]] = []

    def work(key: str) -> None:
        seen.append((key, threading.current_thread().name))
        if key == "bad":
            raise RuntimeError("boom")

    queue: WorkQueue[str] = WorkQueue(work, workers=0)
    queue.add("sweep")
    assert seen == [("sweep", threading.current_thread().name)] and not queue.threaded
    with pytest.raises(RuntimeError, match="boom"):
        queue.add("bad")
    assert queue.pending() == 0  # a failed pass leaves nothing running


def test_run_now_beside_a_worker_keeps_one_pass_per_key() -> None:
    """A pass in the caller's thread (the controller admits the next queued sweep inline) and the workers share
    the rule: while one runs, the other only owes it one more pass."""
    entered, gate = threading.Event(), threading.Event()
    passes: list[str] = []

    def work(key: str) -> None:
        passes.append(threading.current_thread().name)
        if len(passes) == 1:
            entered.set()
            gate.wait(5)

    queue: WorkQueue[str] = WorkQueue(work, workers=1)
    try:
        queue.add("sweep")
        assert entered.wait(5)
        queue.run_now("sweep")  # returns at once: the worker owes one more pass
        queue.run_now("sweep")
        assert len(passes) == 1
        gate.set()
        wait_until(lambda: queue.pending() == 0)  # nothing queued or running: no third pass can follow
        assert len(passes) == 2 and all(name.startswith("reconcile") for name in passes)
        queue.run_now("sweep")  # nothing running: the caller's thread does it
        assert passes[-1] == threading.current_thread().name
    finally:
        gate.set()
        queue.stop()


def test_a_pass_runs_in_the_context_of_the_latest_request() -> None:
    import contextvars

    who: contextvars.ContextVar[str] = contextvars.ContextVar("who")
    seen: list[str] = []
    queue: WorkQueue[str] = WorkQueue(lambda key: seen.append(who.get("unset")), workers=1)
    try:

        def ask(name: str) -> None:
            who.set(name)
            queue.add("sweep")

        contextvars.copy_context().run(ask, "handler")
        wait_until(lambda: seen == ["handler"])  # kopf.event() finds kopf's context variables this way
    finally:
        queue.stop()


def test_add_after_runs_the_key_once_its_delay_has_passed_and_keeps_the_earliest_timer() -> None:
    """client-go's AddAfter: the guard's holds come back after their backoff, not before, and a key waits on one
    timer only (the earliest asked for)."""
    import threading

    from sweep_operator.workqueue import WorkQueue

    ran: list[str] = []
    done = threading.Event()

    def work(key: str) -> None:
        ran.append(key)
        done.set()

    queue: WorkQueue[str] = WorkQueue(work, workers=1)
    try:
        queue.add_after("held", 30.0)
        queue.add_after("held", 0.05)  # earlier: replaces the 30 s timer
        queue.add_after("held", 60.0)  # later: ignored
        assert done.wait(10.0), "the delayed key never ran"
        assert ran == ["held"]
    finally:
        queue.stop()


def test_delayed_keys_share_one_thread_come_due_in_order_and_stop_drops_them() -> None:
    """With workers, every add_after waits in one heap served by one thread (the operator's ticks put every sweep
    there each interval): keys come due in their order, stop() drops the waiting ones, a later add_after runs."""
    import threading

    from sweep_operator.workqueue import WorkQueue

    ran: list[str] = []
    done = threading.Event()

    def work(key: str) -> None:
        ran.append(key)
        if len(ran) == 3:
            done.set()

    queue: WorkQueue[str] = WorkQueue(work, workers=1)
    before = threading.active_count()
    try:
        for key in ("c", "a", "b"):
            queue.add_after(key, {"a": 0.05, "b": 0.1, "c": 0.15}[key])
        queue.add_after("never", 60.0)
        assert threading.active_count() <= before + 2, "one delay thread (and a worker), not a timer per key"
        assert done.wait(10.0)
        assert ran == ["a", "b", "c"]
        assert queue.delayed("never")
        queue.stop()
        assert not queue.delayed("never")
        queue.add_after("again", 0.01)
        wait_until(lambda: ran[-1:] == ["again"])
    finally:
        queue.stop()


def test_a_closed_queue_refuses_later_requests_where_a_stopped_one_starts_again() -> None:
    """At shutdown a pass still running on another queue may ask the guard's queue for work; once closed, that
    request must not start new workers against the API server stopping after it (they would fail loudly)."""
    done: list[str] = []
    queue: WorkQueue[str] = WorkQueue(done.append, workers=1, name="guard")
    queue.add("before")
    wait_until(lambda: done == ["before"])
    queue.close()
    queue.add("after-close")
    queue.add_after("later", 0.0)
    assert queue.pending() == 0 and not queue._threads and queue._delay_thread is None
    inline: WorkQueue[str] = WorkQueue(done.append, workers=0)
    inline.close()
    inline.add("inline-after-close")
    assert done == ["before"]


def test_the_delay_thread_is_woken_only_for_a_new_earliest_entry() -> None:
    """A tick re-armed later than what the delay thread already waits for does not wake it (it looks at the heap
    again when the earlier one comes due); a new earliest entry does, and comes due on time."""
    import threading

    from sweep_operator.workqueue import WorkQueue

    ran: list[str] = []
    done = threading.Event()

    def work(key: str) -> None:
        ran.append(key)
        if key == "soon":
            done.set()

    queue: WorkQueue[str] = WorkQueue(work, workers=1)
    wakes: list[str] = []
    try:
        queue.add_after("first", 60.0)  # starts the thread
        notify = queue._delay_cv.notify
        queue._delay_cv.notify = lambda n=1: (wakes.append("notify"), notify(n))[1]  # type: ignore[method-assign]  # counting the wake-ups
        for i in range(20):
            queue.add_after(f"later-{i}", 120.0 + i)
        assert wakes == []
        queue.add_after("soon", 0.05)
        assert wakes == ["notify"]
        assert done.wait(10.0), "the earliest entry never came due"
        assert ran == ["soon"]
    finally:
        queue.stop()


# ---------------------------------------------------------------------------- fairness between flows (namespaces)
def namespace(key: str) -> str:
    return key.split("/")[0]


@pytest.mark.parametrize(
    ("workers", "flows", "share"),
    [(1, 1, 1), (1, 5, 1), (2, 1, 1), (4, 1, 3), (8, 1, 7), (8, 2, 3), (8, 3, 2), (8, 9, 1), (16, 8, 1)],
)
def test_a_flows_share_keeps_one_worker_for_a_newcomer_and_splits_the_rest_rounded_down(
    workers: int, flows: int, share: int
) -> None:
    assert fair_share(workers, flows) == share


class Gates:
    """Passes that wait until their key is released (a Ray head trickling until the call's deadline)."""

    def __init__(self) -> None:
        self.events: dict[str, threading.Event] = {}
        self.done: list[str] = []
        self.lock = threading.Lock()

    def gate(self, key: str) -> threading.Event:
        with self.lock:
            return self.events.setdefault(key, threading.Event())

    def work(self, key: str) -> None:
        if not key.startswith("quiet"):
            self.gate(key).wait(10)
        self.done.append(key)

    def release_all(self) -> None:
        with self.lock:
            events = list(self.events.values())
        for event in events:
            event.set()


def test_a_flow_alone_uses_every_worker_and_a_flow_arriving_takes_the_first_one_freed() -> None:
    gates = Gates()
    queue: WorkQueue[str] = WorkQueue(gates.work, workers=4, flow=namespace)
    try:
        for i in range(10):
            queue.add(f"a/{i}")
        wait_until(lambda: queue._running == {f"a/{i}" for i in range(4)})
        queue.add("b/0")
        gates.gate("a/0").set()
        wait_until(lambda: "b/0" in queue._running)
        assert "a/4" not in queue._running
        gates.release_all()
        for i in range(10):
            gates.gate(f"a/{i}").set()
        gates.gate("b/0").set()
        wait_until(lambda: queue.pending() == 0)
        assert len(gates.done) == 11 and queue._busy == 0
    finally:
        gates.release_all()
        queue.stop()


def test_flows_with_work_take_turns_and_each_keeps_its_own_order() -> None:
    gate = threading.Event()
    done: list[str] = []

    def work(key: str) -> None:
        if key == "a/0":
            gate.wait(5)
        done.append(key)

    queue: WorkQueue[str] = WorkQueue(work, workers=1, flow=namespace)
    try:
        queue.add("a/0")  # holds the only worker while both flows queue up
        wait_until(lambda: "a/0" in queue._running)
        for i in range(1, 5):
            queue.add(f"a/{i}")
        for i in range(3):
            queue.add(f"b/{i}", ROUTINE)
        queue.add("a/urgent", URGENT)  # first within its own flow, not ahead of b's turn
        gate.set()
        wait_until(lambda: queue.pending() == 0)
        assert done == ["a/0", "a/urgent", "b/0", "a/1", "b/1", "a/2", "b/2", "a/3", "a/4"]
    finally:
        gate.set()
        queue.stop()


def test_a_parked_flow_runs_again_once_a_pass_of_its_own_ends() -> None:
    gates = Gates()
    queue: WorkQueue[str] = WorkQueue(gates.work, workers=3, flow=namespace)
    try:
        queue.add("b/0")
        wait_until(lambda: "b/0" in queue._running)
        for i in range(4):
            queue.add(f"a/{i}")
        # Two flows: each is sure of one worker, and the third is kept back: a/1..a/3 wait parked.
        wait_until(lambda: queue._running == {"b/0", "a/0"})
        gates.gate("a/0").set()
        wait_until(lambda: "a/1" in queue._running)
        assert "a/2" not in queue._running
        for key in ("b/0", "a/1", "a/2", "a/3"):
            gates.gate(key).set()
        wait_until(lambda: queue.pending() == 0)
        assert sorted(gates.done) == ["a/0", "a/1", "a/2", "a/3", "b/0"]
    finally:
        gates.release_all()
        queue.stop()


def test_a_fair_pool_serves_flows_in_turn_returns_results_and_errors_and_cancels_at_shutdown() -> None:
    gate = threading.Event()
    order: list[str] = []

    def task(name: str) -> str:
        if name == "a0":
            gate.wait(5)
        if name == "boom":
            raise ValueError("bucket unreachable")
        order.append(name)
        return name.upper()

    pool = FairPool(1)
    first = pool.submit_to("a", task, "a0")
    wait_until(lambda: pool._queue.pending() == 1 and not pool._queue._queued)
    futures = [pool.submit_to("a", task, f"a{i}") for i in (1, 2)] + [pool.submit_to("b", task, "b0")]
    failing = pool.submit(task, "boom")
    gate.set()
    assert [f.result(5) for f in (first, *futures)] == ["A0", "A1", "A2", "B0"]
    with pytest.raises(ValueError, match="bucket unreachable"):
        failing.result(5)
    assert order == ["a0", "a1", "b0", "a2"]  # b's one task goes before a's second queued one
    blocker = threading.Event()
    held = pool.submit_to("a", blocker.wait, 5)
    wait_until(lambda: pool._queue.pending() == 1 and not pool._queue._queued)
    waiting = pool.submit_to("b", task, "never")
    pool.shutdown(wait=False)
    assert waiting.cancelled()
    blocker.set()
    assert held.result(5) is True
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(task, "late")


def test_a_busy_flow_borrows_idle_workers_but_the_last_is_kept_for_a_newcomer() -> None:
    """Team A's passes all hang (trickling heads) on six workers: alone, it holds all six. Teams B and C arriving
    take the workers A's ending passes free (below their share); once a third of A's passes ends, the worker stays
    free (A holds more than its share, and one is kept back while several teams have work) for the quiet team."""
    gates = Gates()
    queue: WorkQueue[str] = WorkQueue(gates.work, workers=6, flow=namespace)
    try:
        for i in range(8):
            queue.add(f"a/{i}")
        wait_until(lambda: queue._running == {f"a/{i}" for i in range(6)})
        queue.add("b/0")
        gates.gate("a/0").set()
        wait_until(lambda: "b/0" in queue._running)
        queue.add("c/0")
        gates.gate("a/1").set()
        wait_until(lambda: "c/0" in queue._running)
        assert "a/6" not in queue._running
        gates.gate("a/2").set()
        wait_until(lambda: "a/2" in gates.done and queue._busy == 5)
        assert not any(f"a/{i}" in queue._running for i in (6, 7))  # over its share: the spare is kept
        queue.add("quiet/stop")
        wait_until(lambda: "quiet/stop" in gates.done)
        gates.release_all()
        for key in [f"a/{i}" for i in range(8)] + ["b/0", "c/0"]:
            gates.gate(key).set()
        wait_until(lambda: queue.pending() == 0)
        assert len(gates.done) == 11 and queue._busy == 0
    finally:
        gates.release_all()
        queue.stop()
