"""The progress documents' ETag cache (bounded_reads.UnchangedDocuments): bounded by bytes, least recently read
dropped first, a large body or one without an ETag never kept, so a stale body is never answered for a newer one."""

from __future__ import annotations

import pytest

from sweep_operator.bounded_reads import UnchangedDocuments


def test_a_kept_body_is_answered_with_its_etag_and_a_new_one_replaces_it() -> None:
    docs = UnchangedDocuments(max_bytes=100, max_entry_bytes=50)
    docs.keep("a", '"e1"', b"x" * 10)
    assert docs.get("a") == ('"e1"', b"x" * 10)
    docs.keep("a", '"e2"', b"y" * 20)
    assert docs.get("a") == ('"e2"', b"y" * 20) and docs.size_bytes == 20


def test_the_least_recently_read_body_goes_first_when_the_bytes_run_out() -> None:
    docs = UnchangedDocuments(max_bytes=100, max_entry_bytes=50)
    for key in ("a", "b", "c"):
        docs.keep(key, f'"{key}"', b"." * 40)
    assert docs.get("a") is None  # 120 bytes: the first kept went
    assert docs.get("b") is not None  # read: now the most recent
    docs.keep("d", '"d"', b"." * 40)
    assert docs.get("c") is None and docs.get("b") is not None and docs.get("d") is not None
    assert docs.size_bytes == 80


@pytest.mark.parametrize(("etag", "size"), [(None, 10), ("", 10), ('"big"', 51)])
def test_no_etag_or_a_body_over_the_entry_bound_forgets_what_was_kept(etag: str | None, size: int) -> None:
    docs = UnchangedDocuments(max_bytes=100, max_entry_bytes=50)
    docs.keep("a", '"old"', b"old")
    docs.keep("a", etag, b"n" * size)
    assert docs.get("a") is None and docs.size_bytes == 0


def test_forget_and_bad_bounds() -> None:
    docs = UnchangedDocuments(max_bytes=100, max_entry_bytes=50)
    docs.keep("a", '"e"', b"abc")
    docs.forget("a")
    docs.forget("never-kept")
    assert docs.get("a") is None and docs.size_bytes == 0
    with pytest.raises(ValueError, match="max_entry_bytes"):
        UnchangedDocuments(max_bytes=10, max_entry_bytes=11)


def test_reused_threads_serve_calls_in_turn_and_never_queue_behind_a_busy_one() -> None:
    """bounded_reads.ReusedThreads: a finished thread takes the next call; a call while every thread is busy (an
    abandoned read's thread still waiting on its endpoint) gets a new thread at once instead of waiting."""
    import threading

    from sweep_operator.bounded_reads import ReusedThreads
    from tests.support.waiting import wait_for

    threads = ReusedThreads("test", idle_s=30.0)
    names: list[int] = []
    done = threading.Event()
    threads.run(lambda: (names.append(threading.get_ident()), done.set()))
    assert done.wait(5)
    wait_for(lambda: threads.idle == 1, 5, what="the thread back to idle")
    again = threading.Event()
    threads.run(lambda: (names.append(threading.get_ident()), again.set()))
    assert again.wait(5) and names[0] == names[1]  # the same thread served both

    wait_for(lambda: threads.idle == 1, 5, what="the thread back to idle")
    release, started, other = threading.Event(), threading.Event(), threading.Event()
    threads.run(lambda: (started.set(), release.wait(10)))
    assert started.wait(5) and threads.idle == 0
    threads.run(other.set)  # no idle thread: a new one, not a queue behind the held one
    assert other.wait(5)
    release.set()
    wait_for(lambda: threads.idle == 2, 5, what="both threads idle")


def test_an_idle_thread_ends_after_its_wait() -> None:
    import threading

    from sweep_operator.bounded_reads import ReusedThreads
    from tests.support.waiting import wait_for

    threads = ReusedThreads("test-idle-end", idle_s=0.2)
    ran = threading.Event()
    threads.run(ran.set)
    assert ran.wait(5)
    wait_for(
        lambda: threads.idle == 0 and not any(t.name == "test-idle-end" for t in threading.enumerate()), 5, what="ended"
    )
