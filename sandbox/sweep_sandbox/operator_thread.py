"""Run the operator in-process, in a thread with its own event loop (the sandbox and the integration tests)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

import kopf

from sweep_operator.handlers import OperatorWiring, build_controller, operate
from sweep_operator.reconcile.controller import SweepController
from sweep_operator.settings import Settings

log = logging.getLogger(__name__)


class OperatorThread:
    """The kopf operator against the Kubernetes API at `url`, started and stopped on demand.

    with OperatorThread(settings, server.url) as op:
        ...   # op.controller is the live controller (metrics, ledger)
    """

    def __init__(
        self,
        settings: Settings,
        url: str,
        *,
        controller: SweepController | None = None,
        s3_client_for: Callable[[str, str], Any] | None = None,
        token: str | None = None,
        ca_file: str | None = None,
    ) -> None:
        from sweep_operator.kube import CONNECTION_POOL_SIZE, api_client_for_url

        self.settings = settings
        self.url = url
        self.token = token  # the operator's identity in the emulator (its ServiceAccount's user); None: the admin
        self.ca_file = ca_file  # an https emulator's certificate
        if ca_file is not None:
            from kubernetes import client as k8s

            configuration = k8s.Configuration(host=url)
            configuration.ssl_ca_cert = ca_file
            configuration.connection_pool_maxsize = CONNECTION_POOL_SIZE
            client = k8s.ApiClient(configuration)
        else:
            client = api_client_for_url(url)
        if token:
            client.set_default_header("Authorization", f"Bearer {token}")
        self.controller = controller or build_controller(settings, client)
        if s3_client_for is not None:
            self.controller.s3_client_for = s3_client_for
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self.failure: BaseException | None = None
        self.wiring: OperatorWiring | None = None  # while it runs (tests read its echo filter)

    def _login(self, **_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(
            server=self.url,
            ca_path=self.ca_file,
            insecure=self.ca_file is None,
            default_namespace="default",
            token=self.token,
        )

    def _run(self) -> None:
        wiring = self.wiring = OperatorWiring(self.settings, self.controller, self._login)
        try:
            asyncio.run(operate(wiring, stop_flag=self._stop, ready_flag=self._ready))
        except BaseException as exc:  # surfaced by start()/stop()
            self.failure = exc
            log.exception("operator stopped with an error")
            self._ready.set()

    def start(self, timeout: float = 30.0) -> OperatorThread:
        self._thread = threading.Thread(target=self._run, name="sweep-operator", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("the operator did not become ready in time")
        if self.failure is not None:
            raise RuntimeError("the operator failed to start") from self.failure
        return self

    def stop(self, timeout: float = 30.0) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError("the operator did not stop in time")
        self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> OperatorThread:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
