"""Small JSON reads and writes under a run root, an `s3://` URI or a local directory, through pyarrow.

`pyarrow.fs.FileSystem.from_uri` honours `AWS_ENDPOINT_URL(_S3)` like Ray itself; the `S3FileSystem()`
constructor does not, so an explicit endpoint (a process that lacks the variables) builds one with `endpoint_override`.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

import pyarrow.fs as pafs

from sweep_contracts import s3_layout


def filesystem(
    location: str, endpoint_url: str | None = None, region: str | None = None
) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) for an `s3://` URI or a local path; S3 filesystems are reused per bucket."""
    if not s3_layout.is_s3_uri(location):
        return pafs.LocalFileSystem(), os.path.abspath(location)
    path = s3_layout.strip_scheme(location)
    return _s3_filesystem(path.split("/", 1)[0], endpoint_url or None, region or os.environ.get("AWS_REGION")), path


@functools.lru_cache(maxsize=16)
def _s3_filesystem(bucket: str, endpoint_url: str | None, region: str | None) -> pafs.FileSystem:
    # Building one resolves the bucket's region with a request: once per bucket, not once per status write.
    if endpoint_url:
        return pafs.S3FileSystem(endpoint_override=endpoint_url, region=region or "us-east-1")
    return pafs.FileSystem.from_uri(f"{s3_layout.S3_SCHEME}{bucket}")[0]


def write_json(location: str, document: Any, *, endpoint_url: str | None = None) -> None:
    """Write `document` as JSON at `location` (a single PUT on S3; write-then-rename on a local disk)."""
    fs, path = filesystem(location, endpoint_url)
    data = json.dumps(document, indent=1, sort_keys=True, default=str).encode()
    if isinstance(fs, pafs.LocalFileSystem):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return
    with fs.open_output_stream(path) as stream:
        stream.write(data)


def read_json(location: str, *, endpoint_url: str | None = None) -> Any | None:
    """The JSON document at `location`, or None when there is none (yet)."""
    fs, path = filesystem(location, endpoint_url)
    try:
        with fs.open_input_stream(path) as stream:
            return json.loads(stream.read())
    except FileNotFoundError:
        return None


def exists(location: str, *, endpoint_url: str | None = None) -> bool:
    fs, path = filesystem(location, endpoint_url)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def to_uri(fs_path: str, run_root: str) -> str:
    """A path as Ray reports it (scheme stripped, R18) back to a full location under `run_root`'s scheme."""
    if s3_layout.is_s3_uri(run_root) and not s3_layout.is_s3_uri(fs_path):
        return f"{s3_layout.S3_SCHEME}{fs_path.lstrip('/')}"
    return fs_path
