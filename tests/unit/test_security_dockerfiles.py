"""Base images are pinned (issue 15): every FROM names an exact release tag (x.y.z) or a digest, never a moving
tag such as `latest`, `3.12-slim` or a bare name; the operator's build and runtime stages share one base."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCKER = Path(__file__).resolve().parents[2] / "docker"
EXACT = re.compile(r"^[\w./-]+:(\d+\.\d+\.\d+)[\w.-]*(@sha256:[0-9a-f]{64})?$")
DIGEST = re.compile(r"^[\w./-]+(:[\w.-]+)?@sha256:[0-9a-f]{64}$")


def bases(path: Path) -> list[str]:
    found = []
    for line in path.read_text().splitlines():
        match = re.match(r"^FROM\s+(\S+)", line, re.IGNORECASE)
        if match:
            found.append(match.group(1))
    return found


@pytest.mark.parametrize("dockerfile", sorted(DOCKER.glob("Dockerfile.*")), ids=lambda p: p.name)
def test_every_base_image_is_an_exact_release_or_a_digest(dockerfile: Path) -> None:
    found = bases(dockerfile)
    assert found, "no FROM"
    for base in found:
        assert "$" not in base, f"{base}: a build argument would let the base float"
        assert EXACT.match(base) or DIGEST.match(base), f"{base} is a moving tag; pin an x.y.z release or a digest"


def test_the_operator_stages_share_one_base() -> None:
    assert len(set(bases(DOCKER / "Dockerfile.operator"))) == 1


@pytest.mark.parametrize("moving", ["python:3.12-slim", "python:latest", "python", "rayproject/ray:nightly-gpu"])
def test_moving_tags_are_recognised(moving: str) -> None:
    assert not (EXACT.match(moving) or DIGEST.match(moving))
