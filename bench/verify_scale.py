"""Benchmark: verifying a ~10k-object sweep run vs the floor (a bare paginated listing) vs a naive HEAD per file.

    .venv/bin/python bench/verify_scale.py [--trials 64 --checkpoints 3 --files 50 --repeat 3 --deep]

A moto S3 server runs on 127.0.0.1 in a child process (so client and server do not share one GIL), seeded
in-process through moto's backend; every timed request goes over HTTP. Prints one JSON object: the
timings (best of --repeat), and the ratios verifier/listing (target <= 1.3) and head/verifier (target >= 20).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests.support.* (the synthetic sweep factory)

BUCKET = "bench-verify"
PREFIX = "sweeps/bench/digits-rbench1"


def serve(args: argparse.Namespace) -> int:
    """Child process: start moto, seed the sweep, print where it is, serve until stdin closes."""
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request would dominate the timings
    from sweep_sandbox.s3server import S3Server
    from tests.support.moto_direct import MotoDirectWriter
    from tests.support.sweep_factory import write_sweep

    with S3Server() as server:
        server.client().create_bucket(Bucket=BUCKET)
        started = time.perf_counter()
        sweep = write_sweep(
            MotoDirectWriter(),
            BUCKET,
            PREFIX,
            trials=args.trials,
            checkpoints=args.checkpoints,
            files=args.files,
            file_size=args.file_size,
            tune_files=args.tune_files,
        )
        files = [sweep.checkpoint_prefix(t, c) + p for (t, c), contents in sweep.files.items() for p in contents]
        print(
            json.dumps(
                {
                    "endpoint": server.endpoint_url,
                    "root": sweep.root_uri,
                    "objects": sweep.objects_written,
                    "files": files,
                    "committed": sweep.committed_count,
                    "seedSeconds": time.perf_counter() - started,
                }
            ),
            flush=True,
        )
        sys.stdin.read()  # until the parent closes our stdin
    return 0


def best_of(repeat: int, fn: Callable[[], Any]) -> tuple[float, list[float], Any]:
    times = []
    value = None
    for _ in range(repeat):
        started = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - started)
    return min(times), times, value


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from sweep_sandbox.s3server import SANDBOX_CREDENTIALS

    for key, value in SANDBOX_CREDENTIALS.items():
        os.environ.setdefault(key, value)
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", *sys.argv[1:]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        info = json.loads(child.stdout.readline())
        from sweep_contracts import s3_layout
        from sweep_contracts.s3_layout import S3Uri
        from sweep_operator.s3 import S3ClientConfig, make_s3_client
        from sweep_operator.verification import iter_listing, verify_sweep_checkpoints

        # One client for all three measurements, configured as the CLI and operator configure the verifier's.
        client = make_s3_client(
            S3ClientConfig(
                endpoint_url=info["endpoint"], max_pool_connections=max(10, args.concurrency), parse_timestamps=False
            )
        )
        root = S3Uri.parse(info["root"])

        def verifier() -> Any:
            result = verify_sweep_checkpoints(client, root, concurrency=args.concurrency)
            assert result.verified, result.reason
            return result

        def listing() -> int:
            count = 0
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=root.bucket, Prefix=root.prefix):
                count += len(page.get("Contents", []))
            return count

        files: list[str] = info["files"]

        def head_each(keys: list[str]) -> Callable[[], int]:
            def run() -> int:
                for key in keys:
                    client.head_object(Bucket=root.bucket, Key=key)
                return len(keys)

            return run

        def head_each_concurrently(keys: list[str]) -> Callable[[], int]:
            def run() -> int:
                with ThreadPoolExecutor(args.concurrency) as pool:
                    list(pool.map(lambda k: client.head_object(Bucket=root.bucket, Key=k), keys))
                return len(keys)

            return run

        def required_reads() -> int:
            """Only the small objects any verifier must read (snapshots, manifests, result.json), concurrently."""
            keys = [
                root.prefix + rel
                for rel, _, _ in iter_listing(client, root.bucket, root.prefix)
                if rel == s3_layout.RESULT_KEY
                or rel.endswith("/" + s3_layout.SNAPSHOT_FILE)
                or s3_layout.is_manifest_name(rel.rsplit("/", 1)[-1])
            ]
            started = time.perf_counter()
            with ThreadPoolExecutor(args.concurrency) as pool:
                list(pool.map(lambda k: client.get_object(Bucket=root.bucket, Key=k)["Body"].read(), keys))
            reads_s.append(time.perf_counter() - started)
            return len(keys)

        reads_s: list[float] = []
        listing()  # warm the connection pool and moto's code paths once
        # Interleaved, best of --repeat: load from other processes on the machine hits both alike.
        verify_all: list[float] = []
        list_all: list[float] = []
        for _ in range(args.repeat):
            t, _, listed = best_of(1, listing)
            list_all.append(t)
            t, _, result = best_of(1, verifier)
            verify_all.append(t)
        read_count = required_reads()
        verify_s, list_s = min(verify_all), min(list_all)
        sample = files if args.head_sample <= 0 else files[: args.head_sample]
        head_s, _, _ = best_of(1, head_each(sample))
        head_par_s, _, _ = best_of(1, head_each_concurrently(sample))
        scale = len(files) / len(sample)  # 1.0 unless --head-sample asked for extrapolation
        out: dict[str, Any] = {
            "objects": info["objects"],
            "objectsListed": listed,
            "filesInManifests": len(files),
            "committedCheckpoints": info["committed"],
            "concurrency": args.concurrency,
            "repeat": args.repeat,
            "seconds": {
                "verifier": round(verify_s, 3),
                "listing": round(list_s, 3),
                "headPerFile": round(head_s * scale, 3),
                "headPerFileConcurrent": round(head_par_s * scale, 3),
            },
            "allRuns": {"verifier": [round(t, 3) for t in verify_all], "listing": [round(t, 3) for t in list_all]},
            "headFilesTimed": len(sample),
            "verifierRequests": {"checked": result.checked, "objectsListed": result.objects_listed},
            "requiredReads": {"objects": read_count, "seconds": round(reads_s[0], 3)},
            # What this server allows at best: a verifier must list every key once and read the small objects
            # (a single-process moto serves them one at a time), and can never beat head/listing.
            "bounds": {
                "verifierOverListingAtLeast": round((list_s + reads_s[0]) / list_s, 3),
                "headPerFileOverVerifierAtMost": round(head_s * scale / list_s, 1),
            },
            "ratios": {
                "verifierOverListing": round(verify_s / list_s, 3),
                "headPerFileOverVerifier": round(head_s * scale / verify_s, 1),
                "headConcurrentOverVerifier": round(head_par_s * scale / verify_s, 1),
            },
            "targets": {"verifierOverListing": "<= 1.3", "headPerFileOverVerifier": ">= 20"},
            "medianSeconds": {
                "verifier": round(statistics.median(verify_all), 3),
                "listing": round(statistics.median(list_all), 3),
            },
        }
        if args.deep:
            deep_s, _, _ = best_of(
                1, lambda: verify_sweep_checkpoints(client, root, concurrency=args.concurrency, deep=True)
            )
            out["seconds"]["verifierDeep"] = round(deep_s, 3)
        return out
    finally:
        if child.stdin:
            child.stdin.close()
        child.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--checkpoints", type=int, default=3)
    parser.add_argument("--files", type=int, default=50)
    parser.add_argument("--file-size", type=int, default=64)
    parser.add_argument(
        "--tune-files", type=int, default=64, help="Tune experiment files under tune/ (listed by the floor too)"
    )
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--head-sample", type=int, default=0, help="HEAD only this many files and extrapolate (0: all)")
    parser.add_argument("--deep", action="store_true", help="also time a deep (sha256) verification")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve(args)
    print(json.dumps(measure(args), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
