"""A real MLflow tracking server on 127.0.0.1 (`mlflow server`, SQLite backend, artifacts on disk) for the sandbox
and the tests: started when a sweep asks for tracking, stopped with the sandbox. It can be stopped and started
again on the same port and database, as a server that went down and came back."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 15.0
PORT_ATTEMPTS = 3  # a port found free may be taken before the server binds it


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class MlflowServer:
    """`python -m mlflow server` in its own process group, its state under `state_dir`."""

    def __init__(self, state_dir: Path, port: int | None = None):
        self.state_dir = Path(state_dir)
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        assert self.port is not None, "not started"
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.state_dir / "mlflow-server.log"

    def _command(self, port: int) -> list[str]:
        return [
            sys.executable, "-m", "mlflow", "server",
            "--backend-store-uri", f"sqlite:///{(self.state_dir / 'mlflow.db').resolve()}",
            "--default-artifact-root", str((self.state_dir / "mlflow-artifacts").resolve()),
            "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        ]  # fmt: skip

    def start(self, timeout: float = START_TIMEOUT_S) -> MlflowServer:
        """Start (again, on the same port, once it has had one) and wait until /health answers."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        # The job runner (huey) serves MLflow's GenAI jobs only; a tracking server needs none.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        for attempt in range(PORT_ATTEMPTS):
            port = self.port or _free_port()
            with self.log_path.open("ab") as out:
                self.process = subprocess.Popen(
                    self._command(port), stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
                )
            if self._wait_healthy(port, timeout):
                self.port = port
                log.info("MLflow tracking server at http://127.0.0.1:%d", port)
                return self
            self.stop()
            if self.port is not None or attempt == PORT_ATTEMPTS - 1:
                break
        tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
        raise RuntimeError(f"the MLflow tracking server did not start; its log ends:\n{tail}")

    def _wait_healthy(self, port: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                return False
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply,
            ):
                if reply.status == 200:
                    return True
            time.sleep(0.3)
        return False

    def stop(self) -> None:
        """Stop the server and its workers (its process group); never raises."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            try:
                process.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def __enter__(self) -> MlflowServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
