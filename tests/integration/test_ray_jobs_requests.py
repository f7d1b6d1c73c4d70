"""The operator's requests to a Ray head (`ray_jobs`): a redirect is not followed, and the head's answer is not
relayed. A tenant's image serves the head's :8265, so what it answers must not steer the operator elsewhere."""

from __future__ import annotations

import http.server
import threading
import time
import tracemalloc
from collections.abc import Iterator
from typing import ClassVar

import pytest

from sweep_operator import ray_jobs

pytestmark = pytest.mark.integration


class Recorder(http.server.BaseHTTPRequestHandler):
    hits: ClassVar[list[tuple[str, str]]] = []
    redirect_to: ClassVar[str] = ""

    def _answer(self) -> None:
        type(self).hits.append((self.command, self.path))
        if self.redirect_to:
            self.send_response(302)
            self.send_header("Location", self.redirect_to)
            self.end_headers()
            return
        body = b"secret of another service"
        self.send_response(500)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


def serve(handler: type[Recorder]) -> tuple[http.server.ThreadingHTTPServer, str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def heads() -> Iterator[tuple[type[Recorder], str, type[Recorder], str]]:
    target = type("Target", (Recorder,), {"hits": [], "redirect_to": ""})
    target_server, target_url = serve(target)
    head = type("Head", (Recorder,), {"hits": [], "redirect_to": f"http://{target_url}/internal/admin?x=1"})
    head_server, head_url = serve(head)
    try:
        yield head, head_url, target, target_url
    finally:
        for server in (head_server, target_server):
            server.shutdown()
            server.server_close()


def test_a_redirect_from_the_head_is_not_followed(heads: tuple[type[Recorder], str, type[Recorder], str]) -> None:
    head, head_url, target, _ = heads
    outcome = ray_jobs.stop_job(head_url, "raysubmit_1", timeout_s=5)
    assert not outcome.asked and outcome.error == "stop answered HTTP 302", outcome
    assert head.hits == [("POST", "/api/jobs/raysubmit_1/stop")]
    assert ray_jobs.job_status(head_url, "raysubmit_1", timeout_s=5) is None
    assert target.hits == [], "the operator followed the head's redirect"


def test_what_the_head_answers_is_not_relayed(heads: tuple[type[Recorder], str, type[Recorder], str]) -> None:
    _, _, target, target_url = heads
    outcome = ray_jobs.stop_job(target_url, "raysubmit_1", timeout_s=5)
    assert outcome.error == "stop answered HTTP 500" and "secret" not in outcome.error
    assert target.hits == [("POST", "/api/jobs/raysubmit_1/stop")]


# --- every request is bounded: one deadline from the connect to the last byte, a cap on what is read ---------------

TRICKLE_EVERY_S = 1.0  # a hostile head answers one byte a second: a per-read socket timeout never fires
DEADLINE_S = 2.0
MARGIN_S = 1.5  # the call returns within the deadline and this (a loaded machine's scheduling, the close)
HUGE_BYTES = 64 * 1024 * 1024
FLOOD_BLOCK = b"x" * (1024 * 1024)  # made once, before the test measures its memory (the server is in-process)


class Hostile(http.server.BaseHTTPRequestHandler):
    """A head whose answer is a trickle (of the status line, or of a JSON body after prompt headers) or a flood."""

    behaviour: ClassVar[str] = ""

    def _send(self, data: bytes) -> bool:
        try:
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:  # the operator hung up: what a bounded client does
            return False
        return True

    def _trickle(self, data: bytes) -> None:
        for i in range(len(data)):
            if not self._send(data[i : i + 1]):
                return
            time.sleep(TRICKLE_EVERY_S)

    def _answer(self) -> None:
        body = b'{"stopped": true, "status": "STOPPED"}'
        head = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n"
        if self.behaviour == "trickled status line":
            self._trickle(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        elif self.behaviour == "trickled body":
            if self._send(head + b"Content-Length: %d\r\n\r\n" % len(body)):
                self._trickle(body)
        else:  # a flood: 64 MiB of one JSON string, announced or not (then the close ends it)
            announced = b"Content-Length: %d\r\n" % (HUGE_BYTES + 2) if self.behaviour == "announced flood" else b""
            if not self._send(head + announced + b'\r\n"'):
                return
            for _ in range(HUGE_BYTES // len(FLOOD_BLOCK)):
                if not self._send(FLOOD_BLOCK):
                    return
            self._send(b'"')

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hostile_head(request: pytest.FixtureRequest) -> Iterator[tuple[type[Hostile], str]]:
    handler = type("HostileHead", (Hostile,), {"behaviour": request.param})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield handler, f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("hostile_head", ["trickled status line", "trickled body"], indirect=True)
def test_a_trickling_head_is_cut_off_at_the_deadline_of_the_whole_request(
    hostile_head: tuple[type[Hostile], str],
) -> None:
    """A socket timeout is per read (urllib's, and urllib3's `Timeout(total=...)` too, past the connect): a head
    answering one byte a second held the operator's stop worker for as long as it liked."""
    _, url = hostile_head
    started = time.monotonic()
    outcome = ray_jobs.stop_job(url, "raysubmit_1", timeout_s=DEADLINE_S)
    stop_took = time.monotonic() - started
    assert not outcome.asked and outcome.error == f"the head did not answer within {DEADLINE_S:g} s", outcome
    assert stop_took < DEADLINE_S + MARGIN_S, f"the stop took {stop_took:.1f} s"
    started = time.monotonic()
    assert ray_jobs.job_status(url, "raysubmit_1", timeout_s=DEADLINE_S) is None
    status_took = time.monotonic() - started
    assert status_took < DEADLINE_S + MARGIN_S, f"the status request took {status_took:.1f} s"


@pytest.mark.parametrize("hostile_head", ["announced flood", "unannounced flood"], indirect=True)
def test_a_flooding_head_is_read_up_to_the_cap_only(
    hostile_head: tuple[type[Hostile], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 400 MiB reply took the operator from 22 to 822 MiB. The reply is read up to the cap of what the operator
    needs (plus one read of 8 KiB and the headers' allowance), announced or not, and the call says so."""
    _, url = hostile_head
    received: list[int] = []
    count = ray_jobs._BoundedSocket._count

    def counted(sock: ray_jobs._BoundedSocket, n: int) -> int:
        received.append(n)
        return count(sock, n)

    monkeypatch.setattr(ray_jobs._BoundedSocket, "_count", counted)
    tracemalloc.start()
    try:
        started = time.monotonic()
        outcome = ray_jobs.stop_job(url, "raysubmit_1", timeout_s=DEADLINE_S)
        assert time.monotonic() - started < DEADLINE_S + MARGIN_S
        assert not outcome.asked and outcome.error == "the head's reply is over 4 KiB", outcome
        assert sum(received) <= ray_jobs.MAX_STOP_REPLY_BYTES + ray_jobs.MAX_HEADER_BYTES + 8192
        received.clear()
        tracemalloc.reset_peak()
        assert ray_jobs.job_status(url, "raysubmit_1", timeout_s=DEADLINE_S) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sum(received) <= ray_jobs.MAX_JOB_REPLY_BYTES + ray_jobs.MAX_HEADER_BYTES + 8192
    assert peak < 3 * ray_jobs.MAX_JOB_REPLY_BYTES, f"{peak / 2**20:.1f} MiB held for one status request"
