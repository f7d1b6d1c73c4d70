"""A progress document its driver did not rewrite is not downloaded again: the operator's read asks with the ETag of
the body it last read (`If-None-Match`), S3 answers 304 without a body, and the kept body is parsed again; a rewrite
is read in full, and a vanished document is absent, not answered from the cache. Against the moto S3 server on
127.0.0.1 through the operator's own boto3 client (reads.read_document_body); moto's GetObject answers 304 as S3
does (moto/s3/responses.py, S3Response._key_response_get)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sweep_operator.bounded_reads import DeadlineReads, UnchangedDocuments
from sweep_operator.memory_budget import RUN_RECORD_BOUNDS
from sweep_operator.reconcile.reads import read_document_body
from sweep_operator.s3 import S3ClientConfig, make_s3_client

pytestmark = pytest.mark.integration


class Answers:
    """Whether each GetObject the client made was conditional, and the HTTP status of its answer (botocore's
    before-call and after-call events)."""

    def __init__(self, client: Any) -> None:
        self.conditional: list[bool] = []
        self.seen: list[int] = []
        client.meta.events.register("before-call.s3.GetObject", self._asked)
        client.meta.events.register("after-call.s3.GetObject", self._record)

    def _asked(self, params: dict[str, Any], **_: Any) -> None:
        self.conditional.append("If-None-Match" in (params.get("headers") or {}))

    def _record(self, http_response: Any, **_: Any) -> None:
        self.seen.append(http_response.status_code)


def test_an_unchanged_progress_document_is_answered_304_and_a_rewrite_is_read(s3_server: Any, s3_bucket: str) -> None:
    client = make_s3_client(S3ClientConfig(endpoint_url=s3_server.endpoint_url, region="us-east-1", max_attempts=1))
    answers = Answers(client)
    location = f"s3://{s3_bucket}/sweeps/team-a/s-abc/_sweep/status.json"
    key = location.split(f"{s3_bucket}/", 1)[1]
    client.put_object(Bucket=s3_bucket, Key=key, Body=json.dumps({"trials": {"total": 1}}).encode())
    unchanged, reads = UnchangedDocuments(), DeadlineReads()

    def read() -> Any:
        body = read_document_body(client, location, RUN_RECORD_BOUNDS, reads, "team-a", unchanged=unchanged)
        return json.loads(body)

    assert read() == {"trials": {"total": 1}}
    assert read() == {"trials": {"total": 1}}
    assert answers.conditional == [False, True]
    assert answers.seen == [200, 304]  # the second was not downloaded

    client.put_object(Bucket=s3_bucket, Key=key, Body=json.dumps({"trials": {"total": 2}}).encode())
    assert read() == {"trials": {"total": 2}}
    assert answers.seen[-1] == 200 and answers.conditional[-1] is True

    client.delete_object(Bucket=s3_bucket, Key=key)
    with pytest.raises(Exception) as gone:
        read()
    assert "NoSuchKey" in str(gone.value)
    assert unchanged.get(("", location)) is None  # forgotten: the next read asks without a condition
    with pytest.raises(Exception, match="NoSuchKey"):
        read()
    assert answers.conditional[-1] is False


def test_without_the_cache_every_read_downloads_the_body(s3_server: Any, s3_bucket: str) -> None:
    """The yardstick: the guard's reads (and the operator before the cache) always download."""
    client = make_s3_client(S3ClientConfig(endpoint_url=s3_server.endpoint_url, region="us-east-1", max_attempts=1))
    answers = Answers(client)
    location = f"s3://{s3_bucket}/sweeps/team-a/s-abc/_sweep/status.json"
    client.put_object(Bucket=s3_bucket, Key=location.split(f"{s3_bucket}/", 1)[1], Body=b"{}")
    for _ in range(2):
        read_document_body(client, location, RUN_RECORD_BOUNDS, DeadlineReads(), "team-a")
    assert answers.seen == [200, 200] and answers.conditional == [False, False]
