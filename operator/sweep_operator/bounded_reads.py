"""S3 document reads with one wall-clock deadline for the whole request (connect, headers, body).

botocore's timeouts bound each socket read, not a request: an endpoint a tenant runs (`spec.storage.endpointUrl`)
that answers a byte every few seconds would hold the operator's worker for as long as it trickles. A read runs on
a thread of its own, and the caller waits for it at most the deadline; then the read is abandoned: its socket is
shut down where the answer's body has begun (the thread ends at once), else it ends at botocore's own timeouts.
A flow (a namespace) may leave at most `max_late` abandoned reads behind, so a slow endpoint costs a bounded number
of threads and bytes; past that its reads are refused at once until one ends.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

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

        threading.Thread(target=run, name="s3-read", daemon=True).start()
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
