"""Loopback ports for tests: one for a server that takes its port as a setting (kopf's admission server, the operator
process's listeners), and one that refuses every connection. Servers that can bind port 0 themselves do that."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

from sweep_sandbox.chart_admission import free_port

__all__ = ["free_port", "refused_port"]


@contextmanager
def refused_port() -> Iterator[int]:
    """A port nothing answers on while the block runs: bound and never listening, so connections are refused and no
    other server (another xdist worker's) can take it meanwhile."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])
