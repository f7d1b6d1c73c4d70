"""Ray's Jobs API on a RayJob's head (the dashboard, port 8265): the graceful stop, as KubeRay's `StopJob` asks it.

Bounded stdlib HTTP (`http.client`); no kopf, no Kubernetes client. KubeRay v1.7.0's client
(`ray-operator/controllers/ray/utils/dashboardclient/dashboard_httpclient.go`) is the model.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sweep_contracts.runtime_env import MAX_RUNTIME_ENV_CHARS

TIMEOUT_S = 5.0  # one request, from the connect to the reply's last byte: the head is the tenant's code
MAX_STOP_REPLY_BYTES = 4 * 1024  # `{"stopped": true}`
# A job's details (JobDetails) echo the runtime env it was submitted with, which the operator reads up to
# MAX_RUNTIME_ENV_CHARS (its own renderings are a few KiB); nothing else in them is large.
MAX_JOB_REPLY_BYTES = MAX_RUNTIME_ENV_CHARS + 64 * 1024
MAX_HEADER_BYTES = 16 * 1024  # the status line and headers of one reply
JOB_PATH = "/api/jobs/"  # dashboard_httpclient.go JobPath
TERMINAL_JOB_STATUSES = frozenset({"STOPPED", "SUCCEEDED", "FAILED"})  # rayv1.IsJobTerminal
_HOST_PORT = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]{1,5})?")  # a DNS name or IPv4, a port


@dataclass(frozen=True)
class StopOutcome:
    """What the head said: `asked` when the stop reached a live job (or it had already ended), else `error`."""

    asked: bool
    already_ended: bool = False
    error: str = ""


def dashboard_base(dashboard_url: str) -> str:
    """`status.dashboardURL` is `host:port` without a scheme (KubeRay prefixes `http://` before InitClient, and
    speaks nothing else to a head). Only a host and port are taken: a path, query, fragment or user part (which would
    aim the operator's requests at another URL than the head's Jobs API), or another scheme, is a ValueError."""
    url = dashboard_url.strip().rstrip("/")
    rest = url.removeprefix("http://")
    if not _HOST_PORT.fullmatch(rest):
        raise ValueError(f"dashboard URL {dashboard_url!r} is not host:port")
    return f"http://{rest}"


class HeadCallFailed(Exception):
    """A request to a head that failed in a way the operator words itself: nothing of the head's answer is in it."""


class _Deadline:
    """One wall-clock deadline for a whole request (monotonic): connect, request, status line, headers, body."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.at = seconds, time.monotonic() + seconds

    def left(self) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            raise HeadCallFailed(self.missed())
        return left

    def missed(self) -> str:
        return f"the head did not answer within {self.seconds:g} s"


class _BoundedSocket(socket.socket):
    """Every send and receive waits at most until the request's deadline, and the bytes received are counted
    against the reply's budget. A socket timeout alone is per read: a head answering one byte a second would hold
    the caller for ever, and one sending without end would fill its memory."""

    deadline: _Deadline
    budget: int
    received: int = 0

    def _arm(self) -> None:
        self.settimeout(self.deadline.left())

    def _count(self, n: int) -> int:
        self.received += n
        if self.received > self.budget:
            raise HeadCallFailed(f"the head's reply is over {self.budget // 1024} KiB")
        return n

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        self._arm()
        return self._count(super().recv_into(buffer, nbytes, flags))

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        self._arm()
        data = super().recv(bufsize, flags)
        self._count(len(data))
        return data

    def sendall(self, data: Any, flags: int = 0) -> None:
        self._arm()
        super().sendall(data, flags)


class _HeadConnection(http.client.HTTPConnection):
    """`http.client`'s connection on a `_BoundedSocket` (what `socket.create_connection` does, under the deadline).
    http.client follows no redirect: a 3xx (which a tenant's image serving :8265 could aim anywhere) is an answer."""

    def __init__(self, host: str, port: int, deadline: _Deadline, budget: int) -> None:
        super().__init__(host, port, timeout=deadline.seconds)
        self.deadline, self.budget = deadline, budget

    def connect(self) -> None:
        error: OSError | None = None
        for family, kind, proto, _, address in socket.getaddrinfo(self.host, self.port, 0, socket.SOCK_STREAM):
            sock = _BoundedSocket(family, kind, proto)
            sock.deadline, sock.budget = self.deadline, self.budget
            try:
                sock.settimeout(self.deadline.left())
                sock.connect(address)
            except OSError as exc:
                sock.close()
                error = exc
                continue
            except BaseException:
                sock.close()
                raise
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock = sock
            return
        raise error or OSError(f"{self.host} has no address")


def job_of(rayjob: Mapping[str, Any]) -> tuple[str, str] | None:
    """(dashboard URL, job id) of a RayJob whose Ray job was submitted; None before KubeRay recorded both."""
    status = rayjob.get("status") or {}
    url, job_id = status.get("dashboardURL"), status.get("jobId")
    if isinstance(url, str) and url and isinstance(job_id, str) and job_id:
        return url, job_id
    return None


def _request(method: str, url: str, timeout_s: float, max_bytes: int) -> tuple[int, bytes]:
    """(HTTP status, body) of one request, within `timeout_s` in all and reading at most `max_bytes` of body (plus
    MAX_HEADER_BYTES of status line and headers). A refusal's body (not 2xx) is not read: it is the head's text,
    which the operator never relays. HeadCallFailed past the deadline or the cap, or for an answer that is not HTTP."""
    parts = urllib.parse.urlsplit(url)
    deadline = _Deadline(timeout_s)
    connection = _HeadConnection(parts.hostname or "", parts.port or 80, deadline, max_bytes + MAX_HEADER_BYTES)
    try:
        connection.request(method, parts.path, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status // 100 != 2:
            return int(response.status), b""
        announced = response.getheader("Content-Length") or ""
        if announced.isdigit() and int(announced) > max_bytes:
            raise HeadCallFailed(f"the head's reply is over {max_bytes // 1024} KiB")
        body = bytearray()
        while chunk := response.read(min(8192, max_bytes + 1 - len(body))):
            body += chunk
            if len(body) > max_bytes:
                raise HeadCallFailed(f"the head's reply is over {max_bytes // 1024} KiB")
        return int(response.status), bytes(body)
    except TimeoutError:
        raise HeadCallFailed(deadline.missed()) from None
    except http.client.HTTPException as exc:  # its text may quote the head's answer (a status line, a header)
        raise HeadCallFailed(f"the head's answer is not valid HTTP ({type(exc).__name__})") from None
    finally:
        connection.close()


def _json_of(body: bytes) -> Mapping[str, Any]:
    """The reply's JSON object; an empty mapping for anything else (a list, a scalar, nesting too deep)."""
    try:
        document = json.loads(body or b"{}")
    except RecursionError:
        return {}
    return document if isinstance(document, Mapping) else {}


def _failure(exc: Exception) -> str:
    if isinstance(exc, HeadCallFailed):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"  # OSErrors (refused, unreachable, no address) and a refused URL


def stop_job(dashboard_url: str, job_id: str, *, timeout_s: float = TIMEOUT_S) -> StopOutcome:
    """`POST /api/jobs/<id>/stop` (Ray's job_head.py `stop_job`): Ray's supervisor SIGTERMs the driver and SIGKILLs
    it after the job's `RAY_JOB_STOP_WAIT_TIME_S`. Like KubeRay's StopJob, `stopped: false` is fine when the job is
    already terminal (`GET /api/jobs/<id>`). Never raises: an unreachable, slow or flooding head is an outcome with
    its reason; each request has its own `timeout_s`, from the connect to the last byte."""
    try:
        base = dashboard_base(dashboard_url) + JOB_PATH + urllib.parse.quote(job_id, safe="")
        code, body = _request("POST", base + "/stop", timeout_s, MAX_STOP_REPLY_BYTES)
        if code == 404:
            return StopOutcome(asked=False, error=f"job {job_id} does not exist on the cluster")
        if code // 100 != 2:
            return StopOutcome(asked=False, error=f"stop answered HTTP {code}")  # the body: not the operator's to relay
        if _json_of(body).get("stopped") is True:
            return StopOutcome(asked=True)
        code, body = _request("GET", base, timeout_s, MAX_JOB_REPLY_BYTES)
        status = _json_of(body).get("status") if code // 100 == 2 else None
        if status in TERMINAL_JOB_STATUSES:
            return StopOutcome(asked=True, already_ended=True)
        shown = status if isinstance(status, str) and status.isalpha() and len(status) <= 16 else "unknown"
        return StopOutcome(asked=False, error=f"the stop was not taken and the job is {shown}")
    except (HeadCallFailed, OSError, ValueError) as exc:
        return StopOutcome(asked=False, error=_failure(exc))


def job_status(dashboard_url: str, job_id: str, *, timeout_s: float = TIMEOUT_S) -> str | None:
    """The job's status as its head has it (`GET /api/jobs/<id>`, JobDetails.status: PENDING, RUNNING, STOPPED,
    SUCCEEDED, FAILED); None when the head cannot say (unreachable, slower than `timeout_s`, a reply over
    MAX_JOB_REPLY_BYTES). While KubeRay suspends a RayJob it no longer polls the job, so the RayJob's jobStatus goes
    stale: the head is where a stop is seen to have ended."""
    try:
        url = dashboard_base(dashboard_url) + JOB_PATH + urllib.parse.quote(job_id, safe="")
        code, body = _request("GET", url, timeout_s, MAX_JOB_REPLY_BYTES)
        status = _json_of(body).get("status") if code // 100 == 2 else None
    except (HeadCallFailed, OSError, ValueError):
        return None
    return status if isinstance(status, str) else None
