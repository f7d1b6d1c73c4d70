"""The S3 client factory the verifier is given (R22, R11): bounded botocore retries, timeouts, endpoint, no sockets."""

from __future__ import annotations

import pytest

from sweep_operator.s3 import S3ClientConfig, make_s3_client


def test_client_carries_bounded_retries_and_timeouts() -> None:
    client = make_s3_client(
        S3ClientConfig(
            endpoint_url="http://127.0.0.1:9000",
            region="eu-west-1",
            retry_mode="adaptive",
            max_attempts=3,
            connect_timeout_seconds=2,
            read_timeout_seconds=7,
            max_pool_connections=12,
        )
    )
    config = client.meta.config
    assert config.retries == {"mode": "adaptive", "total_max_attempts": 3}
    assert (config.connect_timeout, config.read_timeout, config.max_pool_connections) == (2, 7, 12)
    assert client.meta.endpoint_url == "http://127.0.0.1:9000"
    assert client.meta.region_name == "eu-west-1"


def test_overrides_replace_config_fields() -> None:
    client = make_s3_client(S3ClientConfig(endpoint_url="http://127.0.0.1:9000"), max_attempts=2)
    assert client.meta.config.retries["total_max_attempts"] == 2


def test_raw_timestamps_apply_to_that_client_only() -> None:
    raw = make_s3_client(S3ClientConfig(endpoint_url="http://127.0.0.1:9000", parse_timestamps=False))
    parsed = make_s3_client(S3ClientConfig(endpoint_url="http://127.0.0.1:9000"))
    assert raw._endpoint._response_parser_factory._defaults == {"timestamp_parser": str}
    assert parsed._endpoint._response_parser_factory._defaults == {}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"retry_mode": "legacy"}, "retry_mode: got 'legacy'; allowed: standard, adaptive"),
        ({"max_attempts": 0}, "max_attempts: got 0"),
        ({"max_attempts": 50}, "max_attempts: got 50"),
        ({"read_timeout_seconds": 0}, "read_timeout_seconds: got 0"),
        ({"connect_timeout_seconds": -1}, "connect_timeout_seconds: got -1"),
        ({"max_pool_connections": 0}, "max_pool_connections: got 0"),
        ({"addressing_style": "dns"}, "addressing_style: got 'dns'"),
        ({"endpoint_url": "127.0.0.1:9000"}, "endpoint_url: got '127.0.0.1:9000'; must start with http:// or https://"),
    ],
)
def test_bad_settings_name_the_field(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        S3ClientConfig(**kwargs)
