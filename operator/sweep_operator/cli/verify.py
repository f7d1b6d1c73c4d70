"""`sweepctl verify URI`: are a run's checkpoints safely in S3? Exit 0 verified, 1 not verified, 2 usage error.

Prints a table (trial, checkpoint, files, bytes, status) or, with --json, the result with a top-level `verified`.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from .common import EXIT_FAILED, EXIT_OK, UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    from sweep_contracts.api import DEFAULT_VERIFICATION_TIMEOUT_SECONDS

    from ..settings import Settings

    defaults = Settings()
    p = subparsers.add_parser(
        "verify",
        help="verify a sweep run's checkpoints in S3 (exit 0 verified, 1 not verified, 2 usage error)",
        description="Verify that every checkpoint Ray committed for a sweep run is complete in S3 (R22).",
    )
    p.add_argument("uri", metavar="URI", help="run root: s3://bucket/prefix/<namespace>/<sweep>-<runId>")
    p.add_argument(
        "--endpoint-url", default="", metavar="URL", help="S3-compatible endpoint (default: AWS_ENDPOINT_URL_S3 / AWS)"
    )
    p.add_argument("--region", default="", metavar="R", help="S3 region (default: AWS_REGION / AWS_DEFAULT_REGION)")
    p.add_argument("--deep", action="store_true", help="also download every file and compare sha256 with the manifest")
    p.add_argument("--json", action="store_true", help="print the result as JSON (top-level boolean 'verified')")
    p.add_argument(
        "--timeout",
        type=float,
        default=float(DEFAULT_VERIFICATION_TIMEOUT_SECONDS),
        metavar="SECONDS",
        help="give up (not verified) after this long",
    )
    p.add_argument(
        "--concurrency", type=int, default=defaults.verify_concurrency, metavar="N", help="parallel S3 requests"
    )
    p.add_argument(
        "--max-attempts", type=int, default=5, metavar="N", help="attempts per S3 request (botocore retries)"
    )
    p.add_argument(
        "--min-retention-days",
        type=int,
        default=defaults.min_retention_days,
        metavar="DAYS",
        help="warn about lifecycle rules shorter than this",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sweep_contracts.s3_layout import S3Uri

    from ..s3 import S3ClientConfig, make_s3_client
    from ..verification import verify_sweep_checkpoints

    try:
        root = S3Uri.parse(args.uri)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not root.key:
        raise UsageError(
            f"{args.uri!r} names a bucket, not a run root (s3://bucket/prefix/<namespace>/<sweep>-<runId>)"
        )
    if not args.timeout > 0:
        raise UsageError(f"--timeout: got {args.timeout:g}; must be > 0 seconds")
    if args.concurrency < 1:
        raise UsageError(f"--concurrency: got {args.concurrency}; must be >= 1")
    if args.min_retention_days < 0:
        raise UsageError(f"--min-retention-days: got {args.min_retention_days}; must be >= 0")
    if not 1 <= args.max_attempts <= 20:
        raise UsageError(f"--max-attempts: got {args.max_attempts}; must be from 1 to 20")
    if args.endpoint_url and not args.endpoint_url.startswith(("http://", "https://")):
        raise UsageError(f"--endpoint-url: got {args.endpoint_url!r}; must start with http:// or https://")
    config = S3ClientConfig(
        endpoint_url=args.endpoint_url,
        region=args.region,
        max_attempts=args.max_attempts,
        max_pool_connections=max(10, args.concurrency),
        parse_timestamps=False,
    )
    try:
        client = make_s3_client(config)
    except Exception as exc:  # botocore refuses some configurations (e.g. an invalid region name) before any request
        raise UsageError(f"cannot build an S3 client: {exc}") from None

    result = verify_sweep_checkpoints(
        client,
        root,
        deep=args.deep,
        concurrency=args.concurrency,
        timeout_seconds=args.timeout,
        min_retention_days=args.min_retention_days,
    )
    if args.json:
        json.dump(result.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_report(result, sys.stdout)
    return EXIT_OK if result.verified else EXIT_FAILED


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # unreachable


def print_report(result: Any, out: TextIO) -> None:
    """The human form: a table of checkpoints, then problems, warnings and a one-line verdict."""
    rows = [("TRIAL", "CHECKPOINT", "FILES", "BYTES", "STATUS")]
    rows += [(c.trial, c.name, str(c.files), str(c.bytes), c.status) for c in result.checkpoints]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    if len(rows) > 1:
        for row in rows:
            out.write(
                "  ".join(
                    cell.ljust(w) if i < 2 or i == 4 else cell.rjust(w)
                    for i, (cell, w) in enumerate(zip(row, widths, strict=True))
                ).rstrip()
            )
            out.write("\n")
        out.write("\n")
    bucket = result.root.split("/")[2]
    for title, findings in (("problems", result.problems), ("warnings", result.warnings)):
        if findings:
            out.write(f"{title}:\n")
            for f in findings:
                where = f"s3://{bucket}/{f.key}" if f.key else f"s3://{bucket}"
                out.write(f"  {f.kind}: {where}: {f.detail}\n")
    mode = "deep (sha256)" if result.deep else "sizes"
    if result.verified:
        out.write(
            f"VERIFIED {result.root}: {result.checked} checkpoint(s), {result.files} file(s), "
            f"{_human_bytes(result.bytes)} checked by {mode} in {result.duration_seconds:.2f} s\n"
        )
    else:
        out.write(
            f"NOT VERIFIED {result.root}: {len(result.problems)} problem(s) "
            f"({result.checked} committed checkpoint(s) checked by {mode} in {result.duration_seconds:.2f} s)\n"
        )
