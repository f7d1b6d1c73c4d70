"""A tenant's S3 endpoint (spec.storage.endpointUrl) that trickles its answers holds the operator's reads of a run's
status and result documents at most one deadline each: botocore's timeouts bound each socket read, so an answer
of a byte every half second kept the worker for as long as it trickled. Here a real HTTP server on 127.0.0.1 plays
the endpoint, through the operator's own boto3 client (reads.run_documents, bounded_reads.DeadlineReads)."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from sweep_operator.bounded_reads import DeadlineReads, ReadDeadlineExceeded
from sweep_operator.memory_budget import RUN_RECORD_BOUNDS
from sweep_operator.reconcile.guard import GuardTarget
from sweep_operator.reconcile.reads import run_documents
from sweep_operator.s3 import S3ClientConfig, make_s3_client
from sweep_operator.verification.listing import read_document
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

DEADLINE_S = 1.0
MARGIN_S = 3.0  # a thread start and a request on a loaded machine
BODY = b'{"trials": {"total": 1}}' + b" " * 4000


class TricklingEndpoint(http.server.BaseHTTPRequestHandler):
    """GET answers a byte every 0.2 s: of the body after headers at once ("body"), or of the headers ("headers"),
    until `release` is set; then the rest at once."""

    mode: ClassVar[str] = "body"
    release: ClassVar[threading.Event]
    requests: ClassVar[list[str]]

    def do_GET(self) -> None:
        type(self).requests.append(self.path)
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(BODY)}\r\nContent-Type: application/json\r\n\r\n".encode()
        trickled, rest = (BODY, b"") if self.mode == "body" else (head, BODY)
        try:
            if self.mode == "body":
                self.wfile.write(head)
            for i, byte in enumerate(trickled):
                if self.release.is_set():
                    self.wfile.write(trickled[i:])
                    break
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.2)
            self.wfile.write(rest)
        except OSError:  # the reader hung up
            return

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(params=["body", "headers"])
def endpoint(request: pytest.FixtureRequest) -> Iterator[tuple[type[TricklingEndpoint], str]]:
    handler = type(
        "Endpoint", (TricklingEndpoint,), {"mode": request.param, "release": threading.Event(), "requests": []}
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield handler, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        handler.release.set()
        server.shutdown()
        server.server_close()


def client_for(url: str) -> Any:
    return make_s3_client(S3ClientConfig(endpoint_url=url, region="us-east-1", max_attempts=1))


def test_a_trickling_endpoint_costs_a_status_read_one_deadline_and_the_guard_holds(
    endpoint: tuple[type[TricklingEndpoint], str],
) -> None:
    handler, url = endpoint
    reads = DeadlineReads(deadline_s=DEADLINE_S, max_late=2)
    target = GuardTarget(run_root="s3://runs/sweeps/team-a/slow-abc123", endpoint_url=url)
    client = client_for(url)  # a client's creation is not the reads' time (seconds on a loaded machine)
    started = time.monotonic()
    status, result, readable = run_documents(client, target, RUN_RECORD_BOUNDS, reads)
    took = time.monotonic() - started
    assert (status, result, readable) == (None, None, False)  # unreadable, not absent: the guard holds
    assert took < 2 * DEADLINE_S + MARGIN_S, f"two reads took {took:.1f} s"
    assert len(handler.requests) == 2 and handler.requests[0].endswith("/_sweep/status.json")
    if handler.mode == "body":  # its socket is shut down at the deadline: the abandoned read ends at once
        wait_for(lambda: reads.late("team-a") == 0, MARGIN_S, what="the abandoned reads ended")
    else:  # still waiting for headers: left behind, at most two of them for this namespace
        assert reads.late("team-a") == 2
        refused_at = time.monotonic()
        with pytest.raises(ReadDeadlineExceeded, match="2 earlier reads from its endpoint are still unanswered"):
            reads.read("team-a", lambda: {}, lambda response: b"", "s3://runs/x")
        assert time.monotonic() - refused_at < 0.5 and len(handler.requests) == 2  # refused without a request
        assert reads.read("team-b", lambda: {"Body": None}, lambda response: b"{}", "s3://other/y") == b"{}"
        handler.release.set()
        wait_for(lambda: reads.late("team-a") == 0, MARGIN_S * 3, what="the late reads ended")
    handler.release.set()
    status, _, readable = run_documents(client_for(url), target, RUN_RECORD_BOUNDS, reads)
    assert readable and status == {"trials": {"total": 1}}


@pytest.mark.parametrize("endpoint", ["body"], indirect=True)
def test_without_the_deadline_one_read_lasts_as_long_as_the_endpoint_trickles(
    endpoint: tuple[type[TricklingEndpoint], str],
) -> None:
    """The yardstick: botocore's own timeouts (a read timeout per socket read) do not end the read."""
    handler, url = endpoint
    finished = threading.Event()

    def read() -> None:
        client = client_for(url)
        read_document(client.get_object(Bucket="runs", Key="k"), "k", RUN_RECORD_BOUNDS.max_bytes)
        finished.set()

    threading.Thread(target=read, daemon=True).start()
    assert not finished.wait(DEADLINE_S + MARGIN_S)
    handler.release.set()
    assert finished.wait(MARGIN_S)
