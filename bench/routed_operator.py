"""`python -m sweep_operator` for bench/noisy_neighbours.py, with the Ray heads' in-cluster names routed to loopback.

    BENCH_HEAD_ROUTES='{"team-a": "127.0.0.1:41000"}' python bench/routed_operator.py --kubeconfig K

A head's dashboard URL is `<service>.<namespace>.svc.<domain>:<port>` (KubeRay's FetchHeadServiceURL), which only a
cluster's DNS resolves. Here each namespace's heads reach the loopback address the JSON map gives it, as the cluster's
DNS and Service would route them; a namespace not in the map keeps its name, which does not resolve. Everything else
is the operator as it ships: its own client (deadline, byte caps), its own checks of the head Service.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.parse
from collections.abc import Mapping

ROUTES_ENV = "BENCH_HEAD_ROUTES"


def routed_url(url: str, routes: Mapping[str, str]) -> str:
    """`url` with its in-cluster host:port replaced by its namespace's loopback address, when the map has one."""
    parts = urllib.parse.urlsplit(url)
    labels = (parts.hostname or "").split(".")
    if len(labels) < 3 or labels[2] != "svc" or labels[1] not in routes:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=routes[labels[1]]))


def install(routes: Mapping[str, str]) -> None:
    """Every Jobs API request of the operator goes through `ray_jobs._request`: route its URL there."""
    from sweep_operator import ray_jobs

    real = ray_jobs._request

    def request(method: str, url: str, timeout_s: float, max_bytes: int) -> tuple[int, bytes]:
        return real(method, routed_url(url, routes), timeout_s, max_bytes)

    ray_jobs._request = request


def main() -> int:
    install(json.loads(os.environ.get(ROUTES_ENV) or "{}"))
    from sweep_operator.__main__ import main as operator_main

    return operator_main()


if __name__ == "__main__":
    sys.exit(main())
