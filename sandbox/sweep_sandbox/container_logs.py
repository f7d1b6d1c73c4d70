"""What each container printed: the kubelet's side of `pods/log`, written by whoever plays a kubelet (the KubeRay
stand-in for the submitter's pod) and served by the API emulator."""

from __future__ import annotations

import threading
from collections.abc import Callable

LogSource = Callable[[], bytes]


class ContainerLogs:
    """What each container printed, by (namespace, pod, container): a callable read at each request (the output
    grows while the container runs). A container nobody registered printed nothing. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sources: dict[tuple[str, str, str], LogSource] = {}

    def register(self, namespace: str, pod: str, container: str, source: LogSource) -> None:
        with self._lock:
            self._sources[(namespace, pod, container)] = source

    def read(self, namespace: str, pod: str, container: str) -> bytes:
        with self._lock:
            source = self._sources.get((namespace, pod, container))
        return source() if source is not None else b""
