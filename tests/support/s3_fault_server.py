"""A loopback HTTP server that answers every S3 request with one error (503 SlowDown, 500, 403...) or never answers.

with FaultyS3Server(503, "SlowDown") as server:
    client = make_s3_client(S3ClientConfig(endpoint_url=server.endpoint_url, max_attempts=2))
    ...
    assert server.requests == 2   # botocore retried once, then gave up
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_ERROR_XML = """<?xml version="1.0" encoding="UTF-8"?>
<Error><Code>{code}</Code><Message>{message}</Message><RequestId>fault-{n}</RequestId></Error>"""


class FaultyS3Server:
    """`status`/`code`: the error every request gets; `hang=True`: hold every request until `stop()`."""

    def __init__(self, status: int = 503, code: str = "SlowDown", message: str = "injected fault", hang: bool = False):
        self.status = status
        self.code = code
        self.message = message
        self.hang = hang
        self.requests = 0
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint_url(self) -> str:
        assert self._server is not None, "start() first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FaultyS3Server:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                with outer._lock:
                    outer.requests += 1
                    n = outer.requests
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                if outer.hang:
                    outer._release.wait()
                    return
                body = _ERROR_XML.format(code=outer.code, message=outer.message, n=n).encode()
                self.send_response(outer.status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _answer

            def log_message(self, format: str, *args: Any) -> None:  # quiet test output
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="faulty-s3", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FaultyS3Server:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
