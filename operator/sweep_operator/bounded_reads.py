"""S3 document reads with one wall-clock deadline for the whole request (connect, headers, body).

botocore's timeouts bound each socket read, not a request: an endpoint a tenant runs (`spec.storage.endpointUrl`)
that answers a byte every few seconds would hold the operator's worker for as long as it trickles. A read runs on
a thread of its own, and the caller waits for it at most the deadline; then the read is abandoned: its socket is
shut down where the answer's body has begun (the thread ends at once), else it ends at botocore's own timeouts.
A flow (a namespace) may leave at most `max_late` abandoned reads behind, so a slow endpoint costs a bounded number
of threads and bytes; past that its reads are refused at once until one ends.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

KiB = 1024
DOCUMENT_DEADLINE_S = 10.0  # a status or result document is kilobytes: S3 answers one in well under a second
MAX_LATE_PER_FLOW = 2


class ReadDeadlineExceeded(Exception):
    """The endpoint did not give the whole answer within the deadline (or still owes earlier ones)."""


class DeadlineReads:
    """Reads bounded by one deadline each, with at most `max_late` abandoned reads per flow."""

    def __init__(self, deadline_s: float = DOCUMENT_DEADLINE_S, max_late: int = MAX_LATE_PER_FLOW) -> None:
        if deadline_s <= 0 or max_late < 1:
            raise ValueError(f"deadline_s must be > 0 and max_late >= 1, got {deadline_s!r}, {max_late!r}")
        self.deadline_s, self.max_late = deadline_s, max_late
        self._lock = threading.Lock()
        self._late: Counter[Hashable] = Counter()
        self._threads = ReusedThreads("s3-read")

    def late(self, flow: Hashable) -> int:
        """Reads of `flow` abandoned at their deadline and not yet ended."""
        with self._lock:
            return self._late[flow]

    def read(
        self,
        flow: Hashable,
        get: Callable[[], Mapping[str, Any]],
        read_body: Callable[[Mapping[str, Any]], bytes],
        what: str,
    ) -> bytes:
        """`read_body(get())` within the deadline; ReadDeadlineExceeded past it. Errors of either reach the caller."""
        with self._lock:
            if self._late[flow] >= self.max_late:
                raise ReadDeadlineExceeded(
                    f"{what}: not read: {self._late[flow]} earlier reads from its endpoint are still unanswered past "
                    f"their {self.deadline_s:g} s deadline"
                )
        future: Future[bytes] = Future()
        state = {"done": False, "abandoned": False}
        body: list[Any] = []

        def run() -> None:
            try:
                response = get()
                body.append(response.get("Body"))
                future.set_result(read_body(response))
            except BaseException as exc:  # the caller's future carries it
                future.set_exception(exc)
            finally:
                with self._lock:
                    state["done"] = True
                    if state["abandoned"]:
                        self._less(flow)

        self._threads.run(run)
        try:
            return future.result(timeout=self.deadline_s)
        except FutureTimeout:
            with self._lock:
                if not state["done"]:
                    state["abandoned"] = True
                    self._late[flow] += 1
            if body:
                _shut_down(body[0])
            raise ReadDeadlineExceeded(f"{what}: no whole answer within {self.deadline_s:g} s") from None

    def _less(self, flow: Hashable) -> None:
        self._late[flow] -= 1
        if self._late[flow] <= 0:
            del self._late[flow]


class ReusedThreads:
    """Daemon threads that run one function each and wait a while for the next: a read per sweep and poll would
    otherwise start a thread each (a tenth of the operator's CPU with every sweep running). A thread still busy, an
    abandoned read's included, is never waited for: a call with no idle thread gets a new one, so nothing queues
    behind a slow endpoint, and daemon threads never hold the process's exit."""

    def __init__(self, name: str, idle_s: float = 60.0) -> None:
        self.name, self.idle_s = name, idle_s
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[Callable[[], None]]] = []

    @property
    def idle(self) -> int:
        with self._lock:
            return len(self._idle)

    def run(self, function: Callable[[], None]) -> None:
        """`function()` on an idle thread, else on a new one."""
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is not None:
            inbox.put(function)
            return
        inbox = queue.SimpleQueue()
        inbox.put(function)
        threading.Thread(target=self._serve, args=(inbox,), name=self.name, daemon=True).start()

    def _serve(self, inbox: queue.SimpleQueue[Callable[[], None]]) -> None:
        while True:
            try:
                function = inbox.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    if inbox in self._idle:  # no call took it meanwhile: end
                        self._idle.remove(inbox)
                        return
                continue  # a call took this thread just now: its function is on the way
            with contextlib.suppress(Exception):  # the function reports its own outcome; this thread only serves
                function()
            with self._lock:
                self._idle.append(inbox)


def _shut_down(body: Any) -> None:
    """End a read blocked on the body's socket from another thread: urllib3's `shutdown` (a close from another
    thread does not wake a blocked recv)."""
    raw = getattr(body, "_raw_stream", body)
    try:
        shutdown = getattr(raw, "shutdown", None)
        if shutdown is not None:
            shutdown()
        else:
            body.close()
    except Exception:  # best effort: the read still ends at botocore's own timeouts
        pass


class UnchangedDocuments:
    """The last body read of each run document with its ETag, so the next read asks S3 for it only if it changed
    (`If-None-Match`): a progress document its driver did not rewrite is not downloaded again, whatever the poll
    interval. Bounded by bytes (least recently read dropped first); a body over `max_entry_bytes` is not kept, so one
    namespace's large documents cannot push out everyone else's."""

    def __init__(self, max_bytes: int = 16 * KiB * KiB, max_entry_bytes: int = 256 * KiB) -> None:
        if max_bytes < 1 or not 0 < max_entry_bytes <= max_bytes:
            raise ValueError(f"need 0 < max_entry_bytes <= max_bytes, got {max_entry_bytes!r}, {max_bytes!r}")
        self.max_bytes, self.max_entry_bytes = max_bytes, max_entry_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, tuple[str, bytes]] = OrderedDict()
        self._bytes = 0

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return self._bytes

    def get(self, key: Hashable) -> tuple[str, bytes] | None:
        """(ETag, body) last kept for `key`, now the most recently read."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def keep(self, key: Hashable, etag: str | None, body: bytes) -> None:
        """Remember `body` under its ETag; without an ETag (an endpoint that sends none) or over the entry bound,
        forget what was kept, so a stale body is never answered for a newer one."""
        with self._lock:
            self._drop(key)
            if not etag or len(body) > self.max_entry_bytes:
                return
            self._entries[key] = (etag, body)
            self._bytes += len(body)
            while self._bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))

    def forget(self, key: Hashable) -> None:
        with self._lock:
            self._drop(key)

    def _drop(self, key: Hashable) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= len(entry[1])
