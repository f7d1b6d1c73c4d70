"""The paramSpace grammar and the S3 layout module (the entrypoint/verifier contract)."""

from __future__ import annotations

import pytest

from sweep_contracts import s3_layout
from sweep_contracts.paramspace import Distribution, distributions, grid_size, parse_distribution
from sweep_contracts.s3_layout import RunLayout, S3Uri


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (6, None),
        ("adam", None),
        (True, None),
        ({"choice": [64, 128]}, Distribution("choice", (64, 128))),
        ({"grid": [1, 3]}, Distribution("grid", (1, 3))),
        ({"uniform": [0.0, 0.5]}, Distribution("uniform", (0.0, 0.5))),
        ({"loguniform": [1e-4, 1e-1]}, Distribution("loguniform", (1e-4, 1e-1))),
        ({"randint": [0, 10]}, Distribution("randint", (0, 10))),
        ({"quniform": [16, 256, 16]}, Distribution("quniform", (16, 256, 16))),
        ({"choice": [[64], [64, 64]]}, Distribution("choice", ([64], [64, 64]))),
    ],
)
def test_grammar_accepts(value: object, expected: Distribution | None) -> None:
    assert parse_distribution(value) == expected


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ({"uniform": [1, 1]}, "low must be < high"),
        ({"uniform": [0, "1"]}, "finite numbers"),
        ({"uniform": [0, 1, 2]}, "[low, high]"),
        ({"loguniform": [-1, 1]}, "> 0"),
        ({"randint": [5, 5]}, "exclusive"),
        ({"grid": "abc"}, "non-empty list"),
        ({"choice": [{"a": 1}]}, "constants"),
        ({"choice": [1], "grid": [2]}, "exactly one key"),
        (float("nan"), "finite"),
        ({"uniform": [0, float("inf")]}, "finite"),
    ],
)
def test_grammar_refuses_with_what_is_allowed(value: object, text: str) -> None:
    with pytest.raises(ValueError, match=None) as caught:
        parse_distribution(value)
    assert text in str(caught.value)


def test_grid_size_and_distributions() -> None:
    space = {"x": {"grid": [1, 2, 3]}, "y": {"grid": ["a", "b"]}, "lr": {"uniform": [0, 1]}, "epochs": 3}
    assert grid_size(space) == 6
    assert sorted(distributions(space)) == ["lr", "x", "y"]


def test_run_root_layout_matches_design() -> None:
    """R16: each run has its own prefix `<uri>/<namespace>/<sweep>-<runId>`."""
    root = s3_layout.run_root("s3://bucket/sweeps/", "ml", "digits", "k3j9x2")
    assert root == "s3://bucket/sweeps/ml/digits-k3j9x2"
    layout = RunLayout(root)
    assert layout.tune_storage_path == root and layout.tune_dir == f"{root}/tune"
    assert layout.train_storage_path == f"{root}/train"
    assert layout.snapshot_path("t1") == f"{root}/train/t1/checkpoint_manager_snapshot.json"
    assert layout.checkpoint_dir("t1", s3_layout.checkpoint_dir_name(3)) == f"{root}/train/t1/checkpoint_epoch-000003"
    assert layout.status_path == f"{root}/_sweep/status.json"
    assert layout.result_path == f"{root}/_sweep/result.json"


def test_layout_works_for_local_directories() -> None:
    layout = RunLayout(s3_layout.run_root("/tmp/runs", "default", "scalar", "a1"))
    assert layout.trial_dir("t") == "/tmp/runs/default/scalar-a1/train/t"


def test_manifest_names() -> None:
    assert s3_layout.rank_manifest_name(3) == "_manifest.rank-0003.json"
    assert s3_layout.is_manifest_name("_manifest.json")
    assert s3_layout.is_manifest_name("_manifest.rank-0012.json")
    assert not s3_layout.is_manifest_name("_manifest.rank-x.json")


@pytest.mark.parametrize(
    ("uri", "bucket", "key"),
    [("s3://bucket", "bucket", ""), ("s3://bucket/a/b/", "bucket", "a/b"), ("s3://my.bucket-1/x", "my.bucket-1", "x")],
)
def test_s3_uri_parse(uri: str, bucket: str, key: str) -> None:
    parsed = S3Uri.parse(uri)
    assert (parsed.bucket, parsed.key) == (bucket, key)
    assert S3Uri.parse(str(parsed)) == parsed
    assert parsed.join("train", "t1").key == "/".join(p for p in (key, "train", "t1") if p)


@pytest.mark.parametrize(
    ("uri", "text"),
    [
        ("bucket/prefix", "not an s3:// URI"),
        ("s3:///prefix", "no bucket"),
        ("s3://Bucket/p", "not a valid S3 bucket name"),
        ("s3://ab/p", "3-63 characters"),
        ("s3://192.168.1.1/p", "IP address"),
        ("s3://a..b/p", "'..'"),
        ("s3://bucket/a//b", "empty path segment"),
    ],
)
def test_s3_uri_refuses(uri: str, text: str) -> None:
    with pytest.raises(ValueError) as caught:
        S3Uri.parse(uri)
    assert text in str(caught.value)
