"""Unit tests touch no network: any socket connection is a test failure (kopf's "must not be called" habit)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest


class NetworkUsedInUnitTest(AssertionError):
    pass


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def refuse(self: socket.socket, address: object, *args: object) -> None:
        raise NetworkUsedInUnitTest(f"unit test tried to connect to {address!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    yield
