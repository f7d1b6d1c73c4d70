"""A loopback proxy in front of an S3 server (moto) that refuses chosen IAM actions as S3 does for a role without them.

    with DenyingS3Proxy(moto.endpoint_url, deny={"s3:DeleteObject"}) as proxy:
        ...  # point AWS_ENDPOINT_URL / endpoint_url at proxy.endpoint_url

`deny_paths` (a regular expression) narrows the refusals to the request paths it matches, as a policy statement's
`Resource` (`arn:aws:s3:::bucket/prefix*`) narrows a Deny.

Every other request is forwarded unchanged. Requests are mapped to the action IAM evaluates for them as in
https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazons3.html (HEAD and GET of an object:
s3:GetObject; every multipart step: s3:PutObject; a bucket listing or HEAD: s3:ListBucket; a batch delete:
s3:DeleteObject), and a refusal is S3's own answer: 403 with an AccessDenied error document (no body for HEAD).
Path-style addressing only (what botocore and pyarrow use against a loopback endpoint).
"""

from __future__ import annotations

import http.client
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_DENIED = """<?xml version="1.0" encoding="UTF-8"?>
<Error><Code>AccessDenied</Code><Message>Access Denied</Message><RequestId>deny-{n}</RequestId><HostId>proxy</HostId></Error>"""
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


def s3_action(method: str, path: str, query: dict[str, list[str]]) -> str:
    """The IAM action S3 authorises a path-style request against."""
    _, _, key = path.lstrip("/").partition("/")
    if not key:  # the bucket itself
        if method == "POST" and "delete" in query:
            return "s3:DeleteObject"
        if method == "GET" and "versioning" in query:
            return "s3:GetBucketVersioning"
        if method == "GET" and "lifecycle" in query:
            return "s3:GetLifecycleConfiguration"
        if method == "GET" and "location" in query:
            return "s3:GetBucketLocation"
        if method == "GET" and "uploads" in query:
            return "s3:ListBucketMultipartUploads"
        if method in ("GET", "HEAD"):
            return "s3:ListBucket"
        if method == "PUT":
            return "s3:CreateBucket"
        if method == "DELETE":
            return "s3:DeleteBucket"
        return f"s3:{method}Bucket"
    if method in ("GET", "HEAD"):
        return "s3:ListMultipartUploadParts" if "uploadId" in query and method == "GET" else "s3:GetObject"
    if method in ("PUT", "POST"):
        return "s3:PutObject"
    if method == "DELETE":
        return "s3:AbortMultipartUpload" if "uploadId" in query else "s3:DeleteObject"
    return f"s3:{method}Object"


class DenyingS3Proxy:
    def __init__(self, upstream: str, deny: set[str] | frozenset[str] = frozenset(), deny_paths: str = ""):
        parsed = urllib.parse.urlsplit(upstream)
        self._upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.deny = set(deny)
        self.deny_paths = re.compile(deny_paths) if deny_paths else None
        self.denied: list[tuple[str, str]] = []  # (action, path) of every refused request
        self.forwarded: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def endpoint_url(self) -> str:
        assert self._server is not None, "start() first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> DenyingS3Proxy:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    data = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return data
                        data += self.rfile.read(size)
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _answer(self) -> None:
                body = self._body()
                split = urllib.parse.urlsplit(self.path)
                action = s3_action(self.command, split.path, urllib.parse.parse_qs(split.query, keep_blank_values=True))
                if action in outer.deny and (
                    outer.deny_paths is None or outer.deny_paths.search(urllib.parse.unquote(split.path))
                ):
                    with outer._lock:
                        outer.denied.append((action, split.path))
                        n = len(outer.denied)
                    payload = _DENIED.format(n=n).encode()
                    self.send_response(403)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", "0" if self.command == "HEAD" else str(len(payload)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(payload)
                    return
                with outer._lock:
                    outer.forwarded.append((action, split.path))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                if "Transfer-Encoding" in self.headers:
                    headers["Content-Length"] = str(len(body))
                upstream = http.client.HTTPConnection(*outer._upstream, timeout=30)
                try:
                    upstream.request(self.command, self.path, body=body or None, headers=headers)
                    response = upstream.getresponse()
                    data = response.read()
                    self.send_response(response.status)
                    for name, value in response.getheaders():
                        if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                            self.send_header(name, value)
                    length = response.getheader("Content-Length") if self.command == "HEAD" else None
                    self.send_header("Content-Length", length or str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                finally:
                    upstream.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _answer

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="s3-deny-proxy", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> DenyingS3Proxy:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
