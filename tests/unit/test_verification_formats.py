"""The documents the verifier trusts (R22): Ray 2.58's snapshot, our manifests, `_sweep/result.json`."""

from __future__ import annotations

import json

import pytest

from sweep_operator.verification import FormatError, best_checkpoint_uri, parse_manifest, parse_snapshot
from tests.support.sweep_factory import REAL_RAY_SNAPSHOT, manifest_document, ray_snapshot


def _bytes(doc: object) -> bytes:
    return json.dumps(doc).encode()


def test_real_ray_snapshot_names_the_kept_checkpoints_and_the_latest() -> None:
    """The fixture is Ray 2.58.0's own output (num_to_keep=2 after 3 reports): epoch 0 was pruned. R22."""
    snapshot = parse_snapshot(REAL_RAY_SNAPSHOT.read_bytes())
    assert snapshot.committed == ("checkpoint_epoch-000001", "checkpoint_epoch-000002")
    assert snapshot.latest == "checkpoint_epoch-000002"
    assert snapshot.ray_version == "2.58.0"


def test_factory_snapshot_has_exactly_the_real_snapshot_fields() -> None:
    """The synthetic snapshots tests rely on must not drift from what Ray writes (same keys, same value types)."""
    real = json.loads(REAL_RAY_SNAPSHOT.read_text())
    synthetic = ray_snapshot(
        ["checkpoint_epoch-000001", "checkpoint_epoch-000002"], metrics={"checkpoint_epoch-000002": {"val_loss": 0.3}}
    )
    assert synthetic.keys() == real.keys()
    for key in real:
        assert type(synthetic[key]) is type(real[key]), key
    assert synthetic["checkpoint_results"][0].keys() == real["checkpoint_results"][0].keys()
    assert synthetic["latest_checkpoint_result"].keys() == real["latest_checkpoint_result"].keys()


def test_ray_itself_loads_the_factory_snapshot_and_the_fixture() -> None:
    """Ray's own pydantic model (`_CheckpointManagerState`) accepts both documents: the format is Ray's, not a guess."""
    pytest.importorskip("ray")
    from ray.train.v2._internal.execution.checkpoint.checkpoint_manager import _CheckpointManagerState

    real = _CheckpointManagerState.model_validate(json.loads(REAL_RAY_SNAPSHOT.read_text()))
    synthetic = _CheckpointManagerState.model_validate(ray_snapshot(["checkpoint_epoch-000000"]))
    assert [r.checkpoint_dir_name for r in real.checkpoint_results] == list(
        parse_snapshot(REAL_RAY_SNAPSHOT.read_bytes()).committed
    )
    assert synthetic.latest_checkpoint_result is not None
    assert synthetic.latest_checkpoint_result.checkpoint_dir_name == "checkpoint_epoch-000000"


def test_snapshot_latest_checkpoint_is_committed_even_when_results_omit_it() -> None:
    doc = ray_snapshot(["checkpoint_epoch-000001"], latest="checkpoint_epoch-000004")
    assert parse_snapshot(_bytes(doc)).committed == ("checkpoint_epoch-000001", "checkpoint_epoch-000004")


def test_snapshot_with_no_checkpoint_commits_nothing() -> None:
    snapshot = parse_snapshot(_bytes(ray_snapshot([])))
    assert snapshot.committed == ()
    assert snapshot.latest is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"[]", "must be a JSON object"),
        (_bytes({"ray_version": "2.58.0"}), "checkpoint_results"),
        (_bytes({"checkpoint_results": [{"metrics": {}}]}), "checkpoint_results[0].checkpoint_dir_name"),
        (_bytes({"checkpoint_results": [{"checkpoint_dir_name": "../escape"}]}), "no '/'"),
        (_bytes({"checkpoint_results": [], "latest_checkpoint_result": "checkpoint_x"}), "latest_checkpoint_result"),
        (b"\xff\xfe", "not valid JSON"),
    ],
)
def test_malformed_snapshot_is_rejected_naming_the_field(data: bytes, message: str) -> None:
    """A snapshot the verifier cannot read must never count as 'nothing committed' (fail closed, R22)."""
    with pytest.raises(FormatError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        parse_snapshot(data)


def test_manifest_round_trip() -> None:
    doc = manifest_document({"model.pt": b"abc", "optim/state.pt": b""}, rank=0, epoch=3)
    manifest = parse_manifest(_bytes(doc))
    assert [(f.path, f.size) for f in manifest.files] == [("model.pt", 3), ("optim/state.pt", 0)]
    assert manifest.rank == 0 and manifest.epoch == 3
    assert manifest.files[0].sha256 == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_manifest_sha256_is_compared_lowercase() -> None:
    doc = {"files": [{"path": "a", "size": 1, "sha256": "AB" * 32}]}
    assert parse_manifest(_bytes(doc)).files[0].sha256 == "ab" * 32


GOOD_SHA = "0" * 64


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"files": []}, "non-empty list"),
        ({}, "files: got None"),
        ({"files": ["model.pt"]}, r"files\[0\]: got 'model.pt'"),
        ({"files": [{"path": "/abs", "size": 1, "sha256": GOOD_SHA}]}, "relative"),
        ({"files": [{"path": "a/../../b", "size": 1, "sha256": GOOD_SHA}]}, r"'\.\.' segments"),
        ({"files": [{"path": "a", "size": -1, "sha256": GOOD_SHA}]}, r"size: got -1"),
        ({"files": [{"path": "a", "size": True, "sha256": GOOD_SHA}]}, r"size: got True"),
        ({"files": [{"path": "a", "size": 1, "sha256": "xyz"}]}, "64 hexadecimal"),
        ({"files": [{"path": "a", "size": 1, "sha256": GOOD_SHA}], "rank": "0"}, "rank: got '0'"),
    ],
)
def test_malformed_manifest_is_rejected_naming_the_field(doc: dict, message: str) -> None:
    with pytest.raises(FormatError, match=message):
        parse_manifest(_bytes(doc))


def test_per_rank_manifest_must_agree_with_its_file_name() -> None:
    """R10: sharded saves write one manifest per rank; a rank-3 file claiming rank 1 is a broken save."""
    doc = manifest_document({"shard.bin": b"x"}, rank=1)
    with pytest.raises(FormatError, match=r"_manifest\.rank-0003\.json says rank 3"):
        parse_manifest(_bytes(doc), "_manifest.rank-0003.json")
    assert parse_manifest(_bytes(doc), "_manifest.rank-0001.json").rank == 1


def test_per_rank_manifest_must_record_its_world_size_R10() -> None:
    """R10: without the world size a missing highest rank could never be noticed; a rank beyond it is a broken save."""
    doc = manifest_document({"shard.bin": b"x"}, rank=1, world_size=2)
    assert parse_manifest(_bytes(doc), "_manifest.rank-0001.json").world_size == 2
    del doc["worldSize"]
    with pytest.raises(FormatError, match="worldSize: missing"):
        parse_manifest(_bytes(doc), "_manifest.rank-0001.json")
    assert parse_manifest(_bytes(doc), "_manifest.json").world_size is None  # a rank-0 save names every file itself
    with pytest.raises(FormatError, match="rank: 3 is not below worldSize 2"):
        parse_manifest(_bytes({**doc, "rank": 3, "worldSize": 2}), "_manifest.rank-0003.json")
    with pytest.raises(FormatError, match="worldSize: got 0"):
        parse_manifest(_bytes({**doc, "worldSize": 0}), "_manifest.json")


def test_the_manifest_schema_imports_without_kopf_kubernetes_or_boto3() -> None:
    """One schema for writer and verifier: the training image imports it with nothing but the standard library."""
    import subprocess
    import sys

    code = (
        "import sys; import sweep_contracts.checkpoint_manifest, training_entrypoints.checkpointing\n"
        "bad = [m for m in ('kopf', 'kubernetes', 'boto3', 'botocore', 'pydantic') if m in sys.modules]\n"
        "print(bad)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "[]", done.stderr


def test_result_best_checkpoint_uri() -> None:
    uri = "s3://bucket/sweeps/ns/s-r1/train/t1/checkpoint_epoch-000002"
    assert best_checkpoint_uri(_bytes({"bestTrial": {"id": "t1", "checkpointUri": uri}})) == uri
    assert best_checkpoint_uri(_bytes({"bestTrial": None})) is None
    assert best_checkpoint_uri(_bytes({"bestTrial": {"id": "t1", "checkpointUri": None}})) is None
    assert best_checkpoint_uri(_bytes({"trials": {}})) is None
    with pytest.raises(FormatError, match=r"bestTrial\.checkpointUri"):
        best_checkpoint_uri(_bytes({"bestTrial": {"checkpointUri": 3}}))
    with pytest.raises(FormatError, match="not valid JSON"):
        best_checkpoint_uri(b"")
