"""The admission webhook's bounds: how much of a request is read and parsed, how many validations run or wait and for
how long, how long a refusal's message may be.

Any pod the NetworkPolicy admits can send the webhook a forged review, so none of it may cost the operator more than
these (docs/security.md).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Final, TypeVar

from .memory_budget import DocumentBounds, KiB

T = TypeVar("T")

# A TrainingSweep is a few KiB: its spec, kubectl's last-applied copy of it, managedFields and a status whose copies
# of the run's documents are bounded (the best trial's config at 4 KiB). A review carries the object and, for an
# update, the old one too. 256 KiB leaves a sweep of about 100 KiB room for both copies; a larger paramSpace belongs
# in the training code. What the server parses is bounded by it: the largest review parses in a few milliseconds.
DEFAULT_MAX_REQUEST_BYTES: Final = 256 * KiB
# One JSON element per 16 bytes of the cap (16,384 at 256 KiB, about 1.6 MiB parsed): a sweep's review has a few
# hundred; a body of nested empty lists, the cheapest way to many elements, has one per 2 or 3 bytes.
BYTES_PER_ELEMENT: Final = 16
MAX_REVIEW_DEPTH: Final = 64

# Validation is Python under the GIL: more threads add no throughput, and two keep one slow review from holding the
# next. Six may wait behind them: each holds its parsed review (at most `parsed_bytes` of the bounds), so the
# webhook holds at most eight at once, however many arrive.
VALIDATION_WORKERS: Final = 2
VALIDATIONS_WAITING: Final = 6
# Well under the webhook's timeout (the chart's default 10 s) under failurePolicy Fail: a refusal that says the
# webhook is busy reaches the user, where a timeout would say nothing. A sweep's validation takes milliseconds.
VALIDATION_DEADLINE_SECONDS: Final = 3.0
# A refusal's message: the problems name field paths and the values given, and a forged review's values can be
# hundreds of KiB; the answer (and the log line kopf writes of it) keeps the start.
MAX_REFUSAL_CHARS: Final = 4096

BUSY_MESSAGE: Final = "the TrainingSweep webhook is busy (too many reviews at once); retry in a few seconds"


def review_bounds(max_request_bytes: int) -> DocumentBounds:
    """The bytes, nesting and elements of one AdmissionReview the webhook reads and parses."""
    return DocumentBounds(
        max_bytes=max_request_bytes,
        max_depth=MAX_REVIEW_DEPTH,
        max_elements=max(1024, max_request_bytes // BYTES_PER_ELEMENT),
    )


def refusal_message(problems: list[str], limit: int = MAX_REFUSAL_CHARS) -> str:
    """The problems as one message, cut at `limit` characters saying how much was left out."""
    message = "; ".join(problems)
    if len(message) <= limit:
        return message
    return f"{message[:limit]}... ({len(message) - limit} more characters)"


class ValidationBusy(Exception):
    """No validation slot was free, or the validation missed its deadline."""


class ValidationPool:
    """Runs validations off the event loop on a few threads of their own: at most `workers + waiting` at once (the
    next is refused at once, not queued), each answered within `deadline_seconds` or refused. A validation past its
    deadline keeps its slot until its thread is done with it, so slow ones cannot pile up behind the refusals."""

    def __init__(
        self,
        workers: int = VALIDATION_WORKERS,
        waiting: int = VALIDATIONS_WAITING,
        deadline_seconds: float = VALIDATION_DEADLINE_SECONDS,
    ) -> None:
        self.capacity = workers + waiting
        self.deadline_seconds = deadline_seconds
        self._slots = threading.BoundedSemaphore(self.capacity)
        self._threads = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="admission")
        self.refused = 0
        self._reported_at = -math.inf

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """fn(*args) on the pool's threads; ValidationBusy when all slots are taken or the deadline passes."""
        if not self._slots.acquire(blocking=False):
            raise ValidationBusy(f"{self.capacity} validations in flight")
        try:
            future: Future[T] = self._threads.submit(fn, *args)
        except BaseException:
            self._slots.release()
            raise
        future.add_done_callback(lambda _: self._slots.release())  # cancelled while waiting, or done running
        try:
            # A timeout cancels the wrapped future: a validation still waiting never runs.
            return await asyncio.wait_for(asyncio.wrap_future(future), self.deadline_seconds)
        except TimeoutError:
            raise ValidationBusy(f"no answer within {self.deadline_seconds:g} s") from None

    def note_refusal(self, every_seconds: float = 60.0) -> bool:
        """Count a refusal; True for the first one in `every_seconds` (the one worth a log line). Event loop only."""
        self.refused += 1
        now = time.monotonic()
        if now - self._reported_at < every_seconds:
            return False
        self._reported_at = now
        return True

    def shutdown(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
