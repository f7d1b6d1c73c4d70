"""An in-memory stand-in for the boto3 S3 client calls the verifier and the sweep factory make (unit tier, no sockets).

Errors are real `botocore.exceptions.ClientError`s, so code under test handles them exactly as with boto3;
`fail` injects one per operation and key prefix, `gate` blocks calls until a test releases them.
"""

from __future__ import annotations

import hashlib
import io
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError


def client_error(code: str, status: int, message: str = "", operation: str = "Operation") -> ClientError:
    """A ClientError shaped like botocore's (Error.Code/Message, ResponseMetadata.HTTPStatusCode)."""
    return ClientError(
        {
            "Error": {"Code": code, "Message": message or code},
            "ResponseMetadata": {"HTTPStatusCode": status, "RetryAttempts": 0},
        },
        operation,
    )


class FakeBody:
    """The parts of botocore's StreamingBody the verifier uses."""

    def __init__(self, data: bytes):
        self._stream = io.BytesIO(data)

    def read(self, amt: int | None = None) -> bytes:
        return self._stream.read(amt)

    def iter_chunks(self, chunk_size: int = 1024) -> Any:
        while chunk := self._stream.read(chunk_size):
            yield chunk

    def close(self) -> None:
        self._stream.close()


@dataclass
class FakeS3:
    """One or more buckets of {key: bytes}; records every call as (operation, kwargs)."""

    buckets: dict[str, dict[str, bytes]] = field(default_factory=dict)
    versioning: dict[str, str] = field(default_factory=dict)  # bucket -> "Enabled" | "Suspended"
    lifecycle: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # bucket -> Rules
    page_size: int = 1000
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    # (operation, key prefix) -> exception raised instead of answering
    failures: dict[tuple[str, str], BaseException] = field(default_factory=dict)
    gate: threading.Event | None = None  # when set, every read call waits for it
    on_call: Callable[[str], None] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    in_flight: int = 0
    max_in_flight: int = 0

    def create_bucket(self, Bucket: str, **_: Any) -> dict[str, Any]:
        self.buckets.setdefault(Bucket, {})
        return {}

    def fail(self, operation: str, key_prefix: str, error: BaseException) -> None:
        """Make `operation` (e.g. "get_object") raise `error` for keys (or listing prefixes) under `key_prefix`."""
        self.failures[(operation, key_prefix)] = error

    # ------------------------------------------------------------------------------- plumbing

    def _enter(self, operation: str, bucket: str, key: str, kwargs: dict[str, Any]) -> dict[str, bytes]:
        with self._lock:
            self.calls.append((operation, kwargs))
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.on_call:
                self.on_call(operation)
            if self.gate is not None:
                self.gate.wait()
            for (op, prefix), error in self.failures.items():
                if op == operation and key.startswith(prefix):
                    raise error
            if bucket not in self.buckets:
                raise client_error("NoSuchBucket", 404, "The specified bucket does not exist", operation)
            return self.buckets[bucket]
        except BaseException:
            self._leave()
            raise

    def _leave(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def operations(self) -> list[str]:
        return [op for op, _ in self.calls]

    # ------------------------------------------------------------------------------- S3 API

    def put_object(self, Bucket: str, Key: str, Body: bytes = b"", **_: Any) -> dict[str, Any]:
        objects = self._enter("put_object", Bucket, Key, {"Bucket": Bucket, "Key": Key})
        try:
            objects[Key] = bytes(Body)
            return {}
        finally:
            self._leave()

    def delete_object(self, Bucket: str, Key: str, **_: Any) -> dict[str, Any]:
        objects = self._enter("delete_object", Bucket, Key, {"Bucket": Bucket, "Key": Key})
        try:
            objects.pop(Key, None)
            return {}
        finally:
            self._leave()

    def get_object(self, Bucket: str, Key: str, **_: Any) -> dict[str, Any]:
        objects = self._enter("get_object", Bucket, Key, {"Bucket": Bucket, "Key": Key})
        try:
            if Key not in objects:
                raise client_error("NoSuchKey", 404, "The specified key does not exist.", "GetObject")
            return {"Body": FakeBody(objects[Key]), "ContentLength": len(objects[Key])}
        finally:
            self._leave()

    def list_objects_v2(
        self,
        Bucket: str,
        Prefix: str = "",
        Delimiter: str = "",
        MaxKeys: int = 1000,
        ContinuationToken: str = "",
        **_: Any,
    ) -> dict[str, Any]:
        kwargs = {
            "Bucket": Bucket,
            "Prefix": Prefix,
            "Delimiter": Delimiter,
            "MaxKeys": MaxKeys,
            "ContinuationToken": ContinuationToken,
        }
        objects = self._enter("list_objects_v2", Bucket, Prefix, kwargs)
        try:
            entries: dict[str, int | None] = {}  # name -> size (None: a common prefix)
            for key in sorted(objects):
                if not key.startswith(Prefix):
                    continue
                rest = key[len(Prefix) :]
                if Delimiter and Delimiter in rest:
                    entries[Prefix + rest.split(Delimiter)[0] + Delimiter] = None
                else:
                    entries[key] = len(objects[key])
            # S3 lists every object with its ETag: the quoted MD5 of a single-part upload's content.
            names = sorted(n for n in entries if n > ContinuationToken)
            limit = min(MaxKeys, self.page_size)
            page, rest_names = names[:limit], names[limit:]
            response: dict[str, Any] = {
                "Contents": [
                    {
                        "Key": n,
                        "Size": entries[n],
                        "ETag": f'"{hashlib.md5(objects[n], usedforsecurity=False).hexdigest()}"',
                    }
                    for n in page
                    if entries[n] is not None
                ],
                "CommonPrefixes": [{"Prefix": n} for n in page if entries[n] is None],
                "IsTruncated": bool(rest_names),
                "KeyCount": len(page),
            }
            if rest_names:
                response["NextContinuationToken"] = page[-1]
            return response
        finally:
            self._leave()

    def get_bucket_versioning(self, Bucket: str, **_: Any) -> dict[str, Any]:
        self._enter("get_bucket_versioning", Bucket, "", {"Bucket": Bucket})
        self._leave()
        status = self.versioning.get(Bucket)
        return {"Status": status} if status else {}

    def get_bucket_lifecycle_configuration(self, Bucket: str, **_: Any) -> dict[str, Any]:
        self._enter("get_bucket_lifecycle_configuration", Bucket, "", {"Bucket": Bucket})
        self._leave()
        if Bucket not in self.lifecycle:
            raise client_error(
                "NoSuchLifecycleConfiguration",
                404,
                "The lifecycle configuration does not exist",
                "GetBucketLifecycleConfiguration",
            )
        return {"Rules": self.lifecycle[Bucket]}
