"""Fixtures for every tier. Servers are started here on 127.0.0.1 and stopped; no other address is used."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
KUBERAY_SCHEMAS = REPO.parent / "shared" / "schemas" / "kuberay"


@pytest.fixture(scope="session", autouse=True)
def _sandbox_aws_credentials() -> Iterator[None]:
    """Fake credentials and no EC2 metadata lookups: botocore must never leave loopback."""
    from sweep_sandbox.s3server import SANDBOX_CREDENTIALS

    saved = {k: os.environ.get(k) for k in SANDBOX_CREDENTIALS}
    os.environ.update(SANDBOX_CREDENTIALS)
    for var in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        os.environ.pop(var, None)
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def s3_server() -> Iterator[Any]:
    """A moto S3 server on 127.0.0.1 (integration and e2e tiers only)."""
    from sweep_sandbox.s3server import S3Server

    with S3Server() as server:
        yield server


@pytest.fixture
def s3_client(s3_server: Any) -> Any:
    return s3_server.client()


@pytest.fixture
def s3_bucket(s3_client: Any) -> str:
    """A fresh, empty bucket for one test."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=name)
    return name


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Collecting no test is a failure here, never a silent success (pytest's exit code 5 becomes 1)."""
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
