"""The heads' dashboards as far as the operator uses them: Ray's Jobs API stop and job info, on one loopback port that
every head Service's in-cluster name reaches in the sandbox."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from .rayjob_types import TERMINAL_JOB, JobStatus
from .runners import RunHandle, RunPhase


class JobsApiServer:
    """The heads' dashboards, as far as the operator uses them: Ray's Jobs API stop and job info on one loopback port
    (ray 2.58 `dashboard/modules/job/job_head.py`: `POST /api/jobs/{id}/stop` answers `{"stopped": bool}`, whether
    the job was still running, 404 for an unknown job; `GET /api/jobs/{id}` its JobDetails with `status`, the run's
    own phase, which stays current while KubeRay suspends the RayJob and no longer copies it).
    `find(job_id)` returns the run and its RayJob's jobStatus, or None."""

    def __init__(self, find: Callable[[str], tuple[RunHandle, str] | None]) -> None:
        import http.server

        self.find = find
        self.requests: list[tuple[str, str, float]] = []  # (method, path, wall clock): what reached a head
        self._routes: set[str] = set()  # dashboard URLs (host:port) that reach this server
        self._routes_lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return None

            def _answer(self, code: int, body: Any) -> None:
                data = (json.dumps(body) if not isinstance(body, str) else body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json" if not isinstance(body, str) else "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _job(self) -> tuple[str, tuple[RunHandle, str] | None] | None:
                match = re.fullmatch(r"/api/jobs/([^/]+)(/stop)?", self.path.split("?")[0])
                if match is None:
                    return None
                return match.group(1), outer.find(match.group(1))

            def do_POST(self) -> None:
                outer.requests.append(("POST", self.path, time.time()))
                found = self._job()
                if found is None or not self.path.endswith("/stop"):
                    self._answer(404, "Not Found")
                elif found[1] is None:
                    self._answer(404, f"Job {found[0]} does not exist")
                elif found[1][0].poll().phase.value in TERMINAL_JOB:  # the job's own state, as the supervisor's
                    self._answer(200, {"stopped": False})
                else:
                    found[1][0].stop()  # JobManager.stop_job: the supervisor SIGTERMs the driver, fire and forget
                    self._answer(200, {"stopped": True})

            def do_GET(self) -> None:
                outer.requests.append(("GET", self.path, time.time()))
                found = self._job()
                if found is None or found[1] is None:
                    self._answer(404, "Not Found")
                else:  # the head knows the job as it is now, whatever KubeRay last copied into the RayJob
                    phase = found[1][0].poll().phase
                    status = JobStatus.PENDING.value if phase is RunPhase.STARTING else phase.value
                    self._answer(200, {"submission_id": found[0], "status": status})

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="kuberay-jobs-api", daemon=True)

    @property
    def address(self) -> str:
        """`host:port` of the one loopback server that stands for every head's dashboard."""
        host, port = self._server.server_address[:2]
        return f"{host}:{port}"

    def serve(self, url: str) -> None:
        """`url` (a head Service's `name.namespace.svc.cluster.local:port`, as KubeRay writes status.dashboardURL)
        now reaches this server: the sandbox's cluster DNS and Service routing for the heads."""
        with self._routes_lock:
            self._routes.add(url.removeprefix("http://").rstrip("/"))

    def route(self, url: str) -> str | None:
        """The loopback address a dashboard URL reaches in the sandbox; None for a name no head Service has."""
        with self._routes_lock:
            known = url.strip().removeprefix("http://").rstrip("/") in self._routes
        return self.address if known else None

    def stop_job(self, url: str, job_id: str) -> Any:
        """`ray_jobs.stop_job` as the operator's pod would send it, through the sandbox's routing."""
        from sweep_operator import ray_jobs

        address = self.route(url)
        if address is None:
            return ray_jobs.StopOutcome(asked=False, error="gaierror: the name does not resolve (sandbox)")
        return ray_jobs.stop_job(address, job_id)

    def job_status(self, url: str, job_id: str) -> str | None:
        """`ray_jobs.job_status` through the sandbox's routing (None for a name no head Service has)."""
        from sweep_operator import ray_jobs

        address = self.route(url)
        return ray_jobs.job_status(address, job_id) if address is not None else None

    def start(self) -> JobsApiServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
