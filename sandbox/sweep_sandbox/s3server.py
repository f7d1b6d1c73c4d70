"""An S3-compatible server (moto) on 127.0.0.1, for the sandbox and the tests. Needs the `sandbox` extra."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

# Credentials moto accepts; set wherever a client talks to the sandbox server so that botocore never
# falls back to the EC2 metadata endpoint (no network exists besides loopback).
SANDBOX_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "sandbox",
    "AWS_SECRET_ACCESS_KEY": "sandbox-secret",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@dataclass
class S3Server:
    """A running moto server; `endpoint_url` is http://127.0.0.1:<port>."""

    host: str = "127.0.0.1"
    port: int = 0
    _server: Any = field(default=None, repr=False)

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> S3Server:
        from moto.server import ThreadedMotoServer

        os.environ.setdefault("MOTO_ALLOW_NONEXISTENT_REGION", "true")
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
        self._server = ThreadedMotoServer(ip_address=self.host, port=self.port, verbose=False)
        self._server.start()
        self.host, self.port = self._server.get_host_and_port()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def client(self, **kwargs: Any) -> Any:
        """A boto3 S3 client for this server (sandbox credentials)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=SANDBOX_CREDENTIALS["AWS_REGION"],
            aws_access_key_id=SANDBOX_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=SANDBOX_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            **kwargs,
        )

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
