"""Ray's Jobs API on a RayJob's head (the dashboard, port 8265): the graceful stop, as KubeRay's `StopJob` asks it.

Stdlib HTTP with bounded timeouts; no kopf, no Kubernetes client. KubeRay v1.7.0's client
(`ray-operator/controllers/ray/utils/dashboardclient/dashboard_httpclient.go`) is the model.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TIMEOUT_S = 5.0
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
    """`status.dashboardURL` is `host:port` without a scheme (KubeRay prefixes `http://` before InitClient). Only a
    host and port are taken: a path, query, fragment or user part (which would aim the operator's requests at another
    URL than the head's Jobs API) is a ValueError."""
    url = dashboard_url.strip().rstrip("/")
    scheme, _, rest = url.rpartition("://") if url.startswith(("http://", "https://")) else ("http", "", url)
    if not _HOST_PORT.fullmatch(rest):
        raise ValueError(f"dashboard URL {dashboard_url!r} is not host:port")
    return f"{scheme}://{rest}"


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """The head's answer is taken as it is: a redirect (which a tenant's image serving :8265 could send anywhere,
    turning the stop into a request elsewhere) is an HTTPError, not followed."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def job_of(rayjob: Mapping[str, Any]) -> tuple[str, str] | None:
    """(dashboard URL, job id) of a RayJob whose Ray job was submitted; None before KubeRay recorded both."""
    status = rayjob.get("status") or {}
    url, job_id = status.get("dashboardURL"), status.get("jobId")
    if isinstance(url, str) and url and isinstance(job_id, str) and job_id:
        return url, job_id
    return None


def _request(method: str, url: str, timeout_s: float) -> tuple[int, bytes]:
    request = urllib.request.Request(url, method=method, headers={"Content-Type": "application/json"})
    try:
        with _OPENER.open(request, timeout=timeout_s) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read() or b""


def stop_job(dashboard_url: str, job_id: str, *, timeout_s: float = TIMEOUT_S) -> StopOutcome:
    """`POST /api/jobs/<id>/stop` (Ray's job_head.py `stop_job`): Ray's supervisor SIGTERMs the driver and SIGKILLs
    it after the job's `RAY_JOB_STOP_WAIT_TIME_S`. Like KubeRay's StopJob, `stopped: false` is fine when the job is
    already terminal (`GET /api/jobs/<id>`). Never raises: an unreachable head is an outcome with its reason."""
    try:
        base = dashboard_base(dashboard_url) + JOB_PATH + urllib.parse.quote(job_id, safe="")
        code, body = _request("POST", base + "/stop", timeout_s)
        if code == 404:
            return StopOutcome(asked=False, error=f"job {job_id} does not exist on the cluster")
        if code // 100 != 2:
            return StopOutcome(asked=False, error=f"stop answered HTTP {code}")  # the body: not the operator's to relay
        if json.loads(body or b"{}").get("stopped") is True:
            return StopOutcome(asked=True)
        code, body = _request("GET", base, timeout_s)
        status = json.loads(body or b"{}").get("status") if code // 100 == 2 else None
        if status in TERMINAL_JOB_STATUSES:
            return StopOutcome(asked=True, already_ended=True)
        return StopOutcome(asked=False, error=f"the stop was not taken and the job is {status or 'unknown'}")
    except (OSError, ValueError) as exc:  # URLError, timeouts and refused connections are OSErrors
        return StopOutcome(asked=False, error=f"{type(exc).__name__}: {exc}")


def job_status(dashboard_url: str, job_id: str, *, timeout_s: float = TIMEOUT_S) -> str | None:
    """The job's status as its head has it (`GET /api/jobs/<id>`, JobDetails.status: PENDING, RUNNING, STOPPED,
    SUCCEEDED, FAILED); None when the head cannot say. While KubeRay suspends a RayJob it no longer polls the job, so
    the RayJob's jobStatus goes stale: the head is where a stop is seen to have ended."""
    try:
        url = dashboard_base(dashboard_url) + JOB_PATH + urllib.parse.quote(job_id, safe="")
        code, body = _request("GET", url, timeout_s)
        status = json.loads(body or b"{}").get("status") if code // 100 == 2 else None
    except (OSError, ValueError):
        return None
    return status if isinstance(status, str) else None
