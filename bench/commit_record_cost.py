"""Benchmark: what a commit record costs per checkpoint, against the checkpoint's own upload (the yardstick).

    .venv/bin/python bench/commit_record_cost.py [--files 10 1000 --file-size 65536 --repeat 5]

A moto S3 server runs on 127.0.0.1 in a child process (client and server do not share one GIL). For each file count,
a checkpoint directory is uploaded as Ray's `ray.train.report` does (`pyarrow.fs.copy_files` into the Train run dir),
Ray's snapshot is written, then the record is written as our Train callback does after Ray committed it (the snapshot
read, one listing of the checkpoint, one PUT). Prints one JSON object: per file count, the upload and the record
(median of --repeat), their ratio, the requests the record made and the record's size.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests.support.* (Ray's snapshot document)

BUCKET = "bench-commit-record"


def serve() -> int:
    """Child process: start moto, print its endpoint, serve until stdin closes."""
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    from sweep_sandbox.s3server import S3Server

    with S3Server() as server:
        server.client().create_bucket(Bucket=BUCKET)
        print(json.dumps({"endpoint": server.endpoint_url}), flush=True)
        sys.stdin.read()
    return 0


class CountingClient:
    """A boto3 client that counts the requests made through it."""

    def __init__(self, client: Any):
        self._client = client
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return attr(*args, **kwargs)

        return call


def measure(endpoint: str, files: int, file_size: int, repeat: int) -> dict[str, Any]:
    import boto3
    import pyarrow.fs as pafs

    from tests.support.sweep_factory import ray_snapshot
    from training_entrypoints.commit_records import S3Store, record_checkpoint

    s3fs = pafs.S3FileSystem(endpoint_override=endpoint, region="us-east-1", scheme="http")
    raw = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    uploads: list[float] = []
    records: list[float] = []
    requests: list[str] = []
    record_bytes = 0
    with tempfile.TemporaryDirectory() as local:
        for i in range(files):
            sub = Path(local, f"shard-{i % 8}")
            sub.mkdir(exist_ok=True)
            (sub / f"part-{i:05d}.bin").write_bytes(os.urandom(file_size))
        for attempt in range(repeat):
            trial = f"sweeps/bench/run-{files}/train/t{attempt}"
            name = "checkpoint_2026-12-07_00-00-00.000000"
            started = time.perf_counter()
            pafs.copy_files(local, f"{BUCKET}/{trial}/{name}", destination_filesystem=s3fs)
            uploads.append(time.perf_counter() - started)
            raw.put_object(
                Bucket=BUCKET, Key=f"{trial}/checkpoint_manager_snapshot.json", Body=json.dumps(ray_snapshot([name]))
            )
            client = CountingClient(raw)
            store = S3Store(client=client)
            started = time.perf_counter()
            outcome = record_checkpoint(f"s3://{BUCKET}/{trial}/{name}", store)
            records.append(time.perf_counter() - started)
            assert outcome.written, outcome
            requests = client.calls
            record_bytes = raw.head_object(Bucket=BUCKET, Key=f"{trial}/{name}/_commit_record.json")["ContentLength"]
    upload, record = statistics.median(uploads), statistics.median(records)
    return {
        "files": files,
        "fileBytes": file_size,
        "uploadSeconds": round(upload, 4),
        "recordSeconds": round(record, 4),
        "recordOverUpload": round(record / upload, 4),
        "recordRequests": {name: requests.count(name) for name in sorted(set(requests))},
        "recordBytes": record_bytes,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, nargs="+", default=[10, 1000])
    parser.add_argument("--file-size", type=int, default=64 * 1024)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    from sweep_sandbox.s3server import SANDBOX_CREDENTIALS

    os.environ.update(SANDBOX_CREDENTIALS)  # the loopback server's fake credentials, for pyarrow and boto3 alike
    if args.serve:
        return serve()
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # moto logs a closed buffer at shutdown
        text=True,
        cwd=REPO,
    )
    try:
        assert child.stdout is not None
        endpoint = json.loads(child.stdout.readline())["endpoint"]
        rows = [measure(endpoint, n, args.file_size, args.repeat) for n in args.files]
    finally:
        if child.stdin is not None:
            child.stdin.close()
        child.wait(timeout=30)
    print(json.dumps({"benchmark": "commit_record_cost", "repeat": args.repeat, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
