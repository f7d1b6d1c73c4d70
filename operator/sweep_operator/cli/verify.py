"""`sweepctl verify URI`: are a run's checkpoints safely in S3? Exit 0 verified, 1 not verified, 2 usage error (a URI
that is not a run root lists the run roots under it).

Prints a table (trial, checkpoint, files, bytes, status) or, with --json, the result with a top-level `verified`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from typing import Any, TextIO

from sweep_contracts import s3_layout
from sweep_contracts.s3_layout import S3Uri

from .common import EXIT_FAILED, EXIT_OK, UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    from sweep_contracts.api import DEFAULT_VERIFICATION_TIMEOUT_SECONDS

    from ..settings import Settings

    defaults = Settings()
    p = subparsers.add_parser(
        "verify",
        help="verify a sweep run's checkpoints in S3 (exit 0 verified, 1 not verified, 2 usage error)",
        description="Verify that every checkpoint Ray committed for a sweep run is complete in S3.",
    )
    p.add_argument(
        "uri",
        metavar="URI",
        help="run root: s3://bucket/prefix/<namespace>/<sweep>-<runId> (a storage.uri lists the run roots under it)",
    )
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
    from ..s3 import S3ClientConfig, make_s3_client

    local = None if s3_layout.is_s3_uri(args.uri) else _local_run_root(args.uri)
    try:
        root = local.root if local else S3Uri.parse(args.uri)
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
    if local is not None:
        return _report(args, local, root, lambda key: local.display(key))
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

    return _report(args, client, root, lambda key: f"s3://{root.bucket}/{key}" if key else f"s3://{root.bucket}")


def _local_run_root(value: str) -> Any:
    """The reader of a local run root (`run-local --storage DIR` writes `DIR/<namespace>/<sweep>-<runId>`)."""
    from pathlib import Path

    from .local_run_root import LocalRunRootReader

    directory = Path(value).expanduser()
    if not directory.is_dir():
        raise UsageError(
            f"{value!r} is neither an s3:// URI nor a directory (a run root: s3://bucket/prefix/<namespace>/"
            "<sweep>-<runId>, or the local directory run-local --storage wrote it to)"
        )
    return LocalRunRootReader(directory)


def _report(args: argparse.Namespace, client: Any, root: S3Uri, where: Callable[[str], str]) -> int:
    from ..verification import verify_sweep_checkpoints
    from ..verification.findings import (
        LIFECYCLE_EXPIRATION,
        LIFECYCLE_NONCURRENT_EXPIRATION,
        LIFECYCLE_TRANSITION,
        RETENTION_UNKNOWN,
        VERSIONING_DISABLED,
    )

    local = root.bucket == ""
    not_a_run_root = run_root_problem(client, root)
    if not_a_run_root:
        raise UsageError(not_a_run_root.replace(str(root), where(root.key)) if local else not_a_run_root)

    result = verify_sweep_checkpoints(
        client,
        root,
        deep=args.deep,
        concurrency=args.concurrency,
        timeout_seconds=args.timeout,
        min_retention_days=0 if local else args.min_retention_days,
    )
    if local:  # a directory has no versioning or lifecycle rules to warn about
        bucket_only = {
            VERSIONING_DISABLED,
            LIFECYCLE_EXPIRATION,
            LIFECYCLE_TRANSITION,
            LIFECYCLE_NONCURRENT_EXPIRATION,
            RETENTION_UNKNOWN,
        }
        result = dataclasses.replace(result, warnings=tuple(w for w in result.warnings if w.kind not in bucket_only))
    checks = checks_run(result.deep, local)
    if args.json:
        doc = result.to_dict()
        doc["checks"] = checks
        if local:
            doc["root"] = where(root.key)
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_report(result, sys.stdout, where=where, root=where(root.key) if local else None, checks=checks)
    return EXIT_OK if result.verified else EXIT_FAILED


def checks_run(deep: bool, local: bool) -> str:
    """Which checks a verification ran, as the verdict line says it."""
    if deep:
        return "deep (sha256)"
    if local:
        # run-local's commit records fingerprint files by sha256, which only --deep reads back.
        return "sizes, and ETags where a commit record lists them (sha256 with --deep)"
    return "sizes"


# A run root holds at least one of these (s3_layout): the driver writes _sweep/ first, Ray tune/ and train/.
_RUN_ROOT_DIRS = frozenset({s3_layout.SWEEP_META_DIR, s3_layout.TUNE_EXPERIMENT_NAME, s3_layout.TRAIN_DIR})
# `<storage.uri>/<namespace>/<sweep>-<runId>`: a storage prefix is two levels above its run roots; one more
# level covers a prefix given a level too high. The listings are bounded so a huge bucket cannot stall an error.
_SEARCH_DEPTH = 3
_MAX_LISTINGS = 200


def _child_dirs(client: Any, bucket: str, prefix: str) -> tuple[set[str], bool]:
    """(names of the `dir/`s directly under `prefix`, whether anything at all is there): one delimited listing."""
    dirs: set[str] = set()
    anything = False
    kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "Delimiter": "/"}
    while True:
        page = client.list_objects_v2(**kwargs)
        anything = anything or bool(page.get("Contents") or page.get("CommonPrefixes"))
        dirs.update(p["Prefix"][len(prefix) :].rstrip("/") for p in page.get("CommonPrefixes", []))
        token = page.get("NextContinuationToken")
        if not page.get("IsTruncated") or not token:
            return dirs - {""}, anything
        kwargs["ContinuationToken"] = token


def _run_roots_under(client: Any, root: S3Uri) -> tuple[list[str], bool]:
    """The run roots within `_SEARCH_DEPTH` levels below `root` (breadth first), and whether the search was cut
    short by `_MAX_LISTINGS`."""
    found: list[str] = []
    level = [root]
    listings = 0
    for _ in range(_SEARCH_DEPTH):
        below: list[S3Uri] = []
        for parent in level:
            for name in sorted(_child_dirs(client, parent.bucket, parent.prefix)[0]):
                below.append(parent.join(name))
            listings += 1
            if listings >= _MAX_LISTINGS:
                return found, True
        level = []
        for candidate in below:
            if listings >= _MAX_LISTINGS:
                return found, True
            dirs, _ = _child_dirs(client, candidate.bucket, candidate.prefix)
            listings += 1
            if dirs & _RUN_ROOT_DIRS:
                found.append(str(candidate))
            else:
                level.append(candidate)
    return found, False


def run_root_problem(client: Any, root: S3Uri) -> str | None:
    """Why `root` is not a run root (naming the run roots under it), or None when it is one, is empty (the
    verifier reports an empty root as not verified) or cannot be listed (the verifier reports the S3 error)."""
    try:
        dirs, anything = _child_dirs(client, root.bucket, root.prefix)
        if not anything or dirs & _RUN_ROOT_DIRS:
            return None
        roots, cut_short = _run_roots_under(client, root)
    except Exception:  # any S3 error is left to the verifier, which fails closed and names it
        return None
    expected = ", ".join(f"{d}/" for d in sorted(_RUN_ROOT_DIRS))
    lines = [
        f"{root} is not a run root: expected s3://bucket/prefix/<namespace>/<sweep>-<runId> "
        f"(the storage.uri, then the namespace and the run directory), holding {expected}"
    ]
    if roots:
        lines.append(f"run roots under {root}:" if not cut_short else f"run roots under {root} (the first found):")
        lines += [f"  {r}" for r in roots]
    else:
        lines.append(f"no run root within {_SEARCH_DEPTH} levels under {root}")
    return "\n".join(lines)


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # unreachable


def print_report(
    result: Any,
    out: TextIO,
    *,
    where: Callable[[str], str] | None = None,
    root: str | None = None,
    checks: str | None = None,
) -> None:
    """The human form: a table of checkpoints, then problems, warnings and a one-line verdict. `where` names a key
    as the user knows it (an s3:// URI, or a local path); `root` and `checks` replace the run root and the checks
    the verdict names."""
    rows = [("TRIAL", "CHECKPOINT", "FILES", "BYTES", "STATUS", "LEVEL")]
    rows += [(c.trial, c.name, str(c.files), str(c.bytes), c.status, c.level or "-") for c in result.checkpoints]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    if len(rows) > 1:
        for row in rows:
            out.write(
                "  ".join(
                    cell.ljust(w) if i < 2 or i >= 4 else cell.rjust(w)
                    for i, (cell, w) in enumerate(zip(row, widths, strict=True))
                ).rstrip()
            )
            out.write("\n")
        out.write("\n")
    bucket = result.root.split("/")[2]
    if where is None:
        where = lambda key: f"s3://{bucket}/{key}" if key else f"s3://{bucket}"  # noqa: E731 -- one expression
    shown_root = root or result.root
    for title, findings in (("problems", result.problems), ("warnings", result.warnings)):
        if findings:
            out.write(f"{title}:\n")
            for f in findings:
                out.write(f"  {f.kind}: {where(f.key)}: {f.detail}\n")
    mode = checks or ("deep (sha256)" if result.deep else "sizes")
    if result.verified:
        out.write(
            f"VERIFIED {shown_root}: {result.checked} checkpoint(s), {result.files} file(s), "
            f"{_human_bytes(result.bytes)} checked by {mode} in {result.duration_seconds:.2f} s; {result.summary}\n"
        )
    else:
        out.write(
            f"NOT VERIFIED {shown_root}: {len(result.problems)} problem(s) "
            f"({result.checked} committed checkpoint(s) checked by {mode} in {result.duration_seconds:.2f} s)\n"
        )
