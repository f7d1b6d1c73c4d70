"""Seed a moto server running in this process straight through its backend: ~0.1 ms an object instead of ~10 ms.

For fixtures and benchmarks that need thousands of objects; what is measured or verified still goes over HTTP.
Only valid while the S3Server (ThreadedMotoServer) runs in the same process (the `s3_server` fixture does).
"""

from __future__ import annotations

from typing import Any


class MotoDirectWriter:
    """The put_object / delete_object / list_objects_v2 calls `sweep_factory.write_sweep` makes, on moto's backend."""

    def __init__(self, account_id: str | None = None, partition: str = "aws"):
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        self._backend = s3_backends[account_id or DEFAULT_ACCOUNT_ID][partition]

    def put_object(self, Bucket: str, Key: str, Body: bytes = b"", **_: Any) -> dict[str, Any]:
        self._backend.put_object(Bucket, Key, bytes(Body))
        return {}

    def delete_object(self, Bucket: str, Key: str, **_: Any) -> dict[str, Any]:
        self._backend.delete_object(Bucket, Key)
        return {}

    def list_objects_v2(self, Bucket: str, Prefix: str = "", **_: Any) -> dict[str, Any]:
        """Every matching key in one page (the factory only uses it to find what to delete)."""
        keys = sorted(k for k in self._backend.get_bucket(Bucket).keys if k.startswith(Prefix))
        return {"Contents": [{"Key": k} for k in keys], "IsTruncated": False}
