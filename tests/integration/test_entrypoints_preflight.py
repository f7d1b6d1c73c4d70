"""The driver's pre-flight against S3 over HTTP (moto behind a proxy that refuses chosen IAM actions, as S3 does for
a role without them): a run root the job cannot use fails in seconds, naming the S3 action, before Ray starts."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sweep_contracts import constants
from sweep_contracts.runspec import build_run_spec
from sweep_contracts.s3_layout import RunLayout
from sweep_operator.validation import parse_sweep
from tests.support.factories import changed, cpu_sweep
from tests.support.s3_deny_proxy import DenyingS3Proxy
from training_entrypoints import preflight, sweep

pytestmark = pytest.mark.integration

FAST_S = 10.0


@pytest.fixture
def proxy(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[DenyingS3Proxy]:
    """The job's S3 endpoint is the proxy: pyarrow (Ray's and the driver's filesystem) reads AWS_ENDPOINT_URL."""
    with DenyingS3Proxy(s3_server.endpoint_url) as running:
        monkeypatch.setenv("AWS_ENDPOINT_URL", running.endpoint_url)
        yield running


def keys(s3_client: Any, bucket: str, prefix: str = "") -> list[str]:
    return [o["Key"] for o in s3_client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]


def test_a_run_root_the_job_may_use_passes_and_keeps_no_probe(
    proxy: DenyingS3Proxy, s3_client: Any, s3_bucket: str
) -> None:
    root = f"s3://{s3_bucket}/sweeps/ns/digits-r1"
    preflight.check_run_root(root, token="ok")
    actions = {action for action, _ in proxy.forwarded}
    assert {"s3:PutObject", "s3:GetObject", "s3:ListBucket", "s3:DeleteObject"} <= actions
    assert not [k for k in keys(s3_client, s3_bucket) if "preflight-" in k]


@pytest.mark.parametrize("action", ["s3:PutObject", "s3:GetObject", "s3:ListBucket", "s3:DeleteObject"])
def test_a_missing_permission_fails_in_seconds_naming_the_s3_action_R20(
    proxy: DenyingS3Proxy, s3_bucket: str, action: str
) -> None:
    proxy.deny = {action}
    started = time.monotonic()
    with pytest.raises(preflight.PreflightError) as raised:
        preflight.check_run_root(f"s3://{s3_bucket}/sweeps/ns/digits-r1", token="denied")
    assert time.monotonic() - started < FAST_S
    failure = raised.value.failure
    assert failure.action == action
    assert failure.location == f"s3://{s3_bucket}/sweeps/ns/digits-r1/_sweep/preflight-denied.json"
    assert action in str(raised.value) and "ACCESS_DENIED" in failure.detail.upper().replace(" ", "_")
    assert proxy.denied and {a for a, _ in proxy.denied} == {action}


def driver_env(bucket: str) -> dict[str, str]:
    doc = changed(cpu_sweep("denied"), {"spec.storage": {"uri": f"s3://{bucket}/sweeps", "region": "us-east-1"}})
    return {
        constants.ENV_RUN_SPEC: build_run_spec(parse_sweep(doc), "r1").to_json(),
        constants.ENV_DEADLINE_AT: str(int(time.time()) + 900),
    }


def test_the_driver_refuses_before_ray_starts_and_records_why_in_status_json(
    proxy: DenyingS3Proxy, s3_client: Any, s3_bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """s3:DeleteObject denied: the driver exits 1 within seconds, Ray never started, and the operator reads the
    action from `_sweep/status.json` (the role may write)."""
    import ray

    proxy.deny = {"s3:DeleteObject"}
    started = time.monotonic()
    assert sweep.main(driver_env(s3_bucket)) == sweep.EXIT_FAILED
    assert time.monotonic() - started < FAST_S and not ray.is_initialized()
    assert "s3:DeleteObject" in capsys.readouterr().err
    layout = RunLayout(f"s3://{s3_bucket}/sweeps/default/denied-r1")
    key = layout.status_path.removeprefix(f"s3://{s3_bucket}/")
    status = json.loads(s3_client.get_object(Bucket=s3_bucket, Key=key)["Body"].read())
    assert status["phase"] == "Failed" and status["preflight"]["action"] == "s3:DeleteObject"
    assert status["preflight"]["ok"] is False and "s3:DeleteObject" in status["message"]


def test_without_write_access_the_driver_still_fails_fast_and_says_it_could_not_record(
    proxy: DenyingS3Proxy, s3_client: Any, s3_bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    proxy.deny = {"s3:PutObject"}
    assert sweep.main(driver_env(s3_bucket)) == sweep.EXIT_FAILED
    err = capsys.readouterr().err
    assert "s3:PutObject" in err and "not recorded (no write access)" in err
    assert keys(s3_client, s3_bucket) == []


def test_the_gpu_check_is_skipped_on_a_cpu_sweep_and_judges_visible_gpus() -> None:
    """The CPU path of the GPU pre-flight (the GPU path needs a GPU worker): nothing to check without GPUs."""
    spec = build_run_spec(parse_sweep(cpu_sweep("cpu")), "r1")
    preflight.check_gpu_workers(spec)  # returns at once: no Ray needed
    assert preflight.gpu_problems(0, 0, False, 0) is None
    assert "torch.cuda.is_available() is False" in (preflight.gpu_problems(1, 1, False, 0) or "")
    assert preflight.gpu_problems(0, 2, True, 1) == "rank 0: torch sees 1 GPU(s), the worker asked for 2"
    assert preflight.gpu_problems(0, 1, True, 1) is None
