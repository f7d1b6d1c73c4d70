"""The operator's S3 clients: one per (endpoint, region), bounded, and only for allowlisted endpoints.

Endpoints come from sweeps (tenant input): the operator's own default is the platform's choice, every other one
must be in settings.tenancy's allowedEndpointHosts; an endpoint off the list gets a client that refuses every call.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from .settings import Settings

log = logging.getLogger(__name__)


class RefusedEndpoint:
    """The S3 client for an endpoint off the operator's allowlist: every call fails as S3 refuses (AccessDenied),
    so nothing is sent there. Admission refuses such sweeps; this covers the endpoints that reach the operator
    another way (a guard annotation or status.guard written before the guard policy, or with it off): the
    verifier reports the refusal and the guard holds."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    def __getattr__(self, name: str) -> Any:
        from botocore.exceptions import ClientError

        def refuse(*_: Any, **__: Any) -> Any:
            raise ClientError(
                {
                    "Error": {
                        "Code": "AccessDenied",
                        "Message": f"endpoint {self.endpoint} is not in the "
                        "operator's allowedEndpointHosts; nothing was sent to it",
                    }
                },
                name,
            )

        return refuse


class S3ClientCache:
    """One S3 client per (endpoint, region), at most `size` of them, the least recently used dropped first.
    Bounded: endpoints come from sweeps (allowlisted by settings.tenancy, but the list may be wide), and each
    client holds a connection pool. A caller still holding a dropped client keeps using it. With `allowed`,
    an endpoint it refuses gets a RefusedEndpoint instead (never cached)."""

    def __init__(
        self, size: int, build: Callable[[str, str], Any], allowed: Callable[[str], bool] | None = None
    ) -> None:
        self.size = size
        self._build = build
        self._allowed = allowed
        self._clients: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, endpoint: str, region: str) -> Any:
        if self._allowed is not None and not self._allowed(endpoint):
            log.warning("S3 endpoint %s is not allowed (allowedEndpointHosts); refusing to call it", endpoint)
            return RefusedEndpoint(endpoint)
        with self._lock:  # boto3 clients are thread-safe once built; building one is not
            key = (endpoint, region)
            if key in self._clients:
                self._clients.move_to_end(key)
                return self._clients[key]
            while len(self._clients) >= self.size:
                self._clients.popitem(last=False)
            client = self._clients[key] = self._build(endpoint, region)
            return client

    def __len__(self) -> int:
        return len(self._clients)


def operator_s3_clients(settings: Settings) -> S3ClientCache:
    """The clients the operator verifies with: built by the shared factory (s3.py), sized for the verifier."""
    from .s3 import S3ClientConfig, make_s3_client

    def build(endpoint: str, region: str) -> Any:
        return make_s3_client(
            S3ClientConfig(
                endpoint_url=endpoint,
                region=region,
                max_pool_connections=max(16, settings.verify_concurrency),
                parse_timestamps=False,  # the verifier reads no timestamp; parsing them dominates big listings
            )
        )

    return S3ClientCache(
        settings.s3_client_cache_size,
        build,
        # The operator's own default endpoint is the platform's choice; every other one must be allowlisted.
        allowed=lambda e: e == settings.s3_endpoint_url or settings.tenancy.endpoint_allowed(e),
    )
