"""The operator's requests to a Ray head (`ray_jobs`): a redirect is not followed, and the head's answer is not
relayed. A tenant's image serves the head's :8265, so what it answers must not steer the operator elsewhere."""

from __future__ import annotations

import http.server
import threading
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
