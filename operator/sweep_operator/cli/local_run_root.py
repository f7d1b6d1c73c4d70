"""A local run root (what `run-local --storage DIR` writes) served read-only through the S3 calls the verifier makes,
so `sweepctl verify DIR` runs the same checks as on S3.

The run root's absolute path is the key under an empty bucket name: `bucket/key` then reads as the path itself,
which is how Ray and the driver record local checkpoint paths (the verifier compares those with the run root).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from sweep_contracts.s3_layout import S3Uri

_MD5_CHUNK = 1 << 20


def _client_error(code: str, message: str, operation: str) -> Exception:
    from botocore.exceptions import ClientError

    status = 404 if code in ("NoSuchKey", "NoSuchLifecycleConfiguration") else 400
    return ClientError(
        {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}}, operation
    )


class LocalRunRootReader:
    """`list_objects_v2`, `get_object`, `get_bucket_versioning` and `get_bucket_lifecycle_configuration` over the
    files under one directory. ETags are what S3 gives an object uploaded in one part (the MD5 of its bytes); no
    call writes anything, and no key outside the directory is served."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory.resolve()
        self._md5: dict[tuple[str, int, int], str] = {}

    @property
    def root(self) -> S3Uri:
        return S3Uri("", self.directory.as_posix().lstrip("/"))

    def display(self, key: str) -> str:
        """The local path of a key (findings name files as the user knows them)."""
        return "/" + key.lstrip("/")

    def _path(self, key: str) -> Path | None:
        path = Path("/" + key)
        if path != self.directory and self.directory not in path.parents:
            return None
        return path

    def _check_bucket(self, bucket: str, operation: str) -> None:
        if bucket != "":
            raise _client_error("NoSuchBucket", f"bucket {bucket!r}: only the local run root is served", operation)

    def _etag(self, path: Path, stat: os.stat_result) -> str:
        cache_key = (path.as_posix(), stat.st_size, stat.st_mtime_ns)
        if cache_key not in self._md5:
            digest = hashlib.md5(usedforsecurity=False)
            with path.open("rb") as handle:
                while chunk := handle.read(_MD5_CHUNK):
                    digest.update(chunk)
            self._md5[cache_key] = digest.hexdigest()
        return f'"{self._md5[cache_key]}"'

    def _keys(self) -> list[str]:
        keys = []
        for folder, dirs, files in os.walk(self.directory):
            dirs[:] = [d for d in dirs if not Path(folder, d).is_symlink()]  # nothing outside the run root
            keys += [Path(folder, name).as_posix().lstrip("/") for name in files if Path(folder, name).is_file()]
        return sorted(keys)

    # The parameters are boto3's names, in its spelling.
    def list_objects_v2(
        self,
        *,
        Bucket: str,
        Prefix: str = "",
        Delimiter: str = "",
        MaxKeys: int = 1000,
        ContinuationToken: str = "",
        **_: Any,
    ) -> dict[str, Any]:
        self._check_bucket(Bucket, "ListObjectsV2")
        contents: list[dict[str, Any]] = []
        prefixes: list[str] = []
        truncated = False
        last = ""
        for key in self._keys():
            if not key.startswith(Prefix) or (ContinuationToken and key <= ContinuationToken):
                continue
            rest = key[len(Prefix) :]
            if Delimiter and Delimiter in rest:
                common = Prefix + rest.split(Delimiter, 1)[0] + Delimiter
                if prefixes and prefixes[-1] == common:
                    continue
                entry: Any = common
            else:
                path = Path("/" + key)
                stat = path.stat()
                entry = {"Key": key, "Size": stat.st_size, "ETag": self._etag(path, stat)}
            if len(contents) + len(prefixes) >= MaxKeys:
                truncated = True
                break
            if isinstance(entry, str):
                prefixes.append(entry)
                last = entry + "\uffff"  # past every key under this common prefix
            else:
                contents.append(entry)
                last = key
        page: dict[str, Any] = {"KeyCount": len(contents) + len(prefixes), "IsTruncated": truncated}
        if contents:
            page["Contents"] = contents
        if prefixes:
            page["CommonPrefixes"] = [{"Prefix": p} for p in prefixes]
        if truncated:
            page["NextContinuationToken"] = last
        return page

    def get_object(self, *, Bucket: str, Key: str, **_: Any) -> dict[str, Any]:
        from botocore.response import StreamingBody

        self._check_bucket(Bucket, "GetObject")
        path = self._path(Key)
        if path is None or not path.is_file():
            raise _client_error("NoSuchKey", f"{self.display(Key)} does not exist", "GetObject")
        size = path.stat().st_size
        return {"Body": StreamingBody(path.open("rb"), size), "ContentLength": size}

    def get_bucket_versioning(self, *, Bucket: str, **_: Any) -> dict[str, Any]:
        self._check_bucket(Bucket, "GetBucketVersioning")
        return {}

    def get_bucket_lifecycle_configuration(self, *, Bucket: str, **_: Any) -> dict[str, Any]:
        self._check_bucket(Bucket, "GetBucketLifecycleConfiguration")
        raise _client_error("NoSuchLifecycleConfiguration", "a local directory has no lifecycle rules", "Lifecycle")
