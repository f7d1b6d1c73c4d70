"""Doubles for the controller's injected collaborators: the verifier's result, the verifier, the clock.

A result has the surface verdicts.VerificationOutcome and the status writer read from verification.VerificationResult
(verified, checked, bytes, problems, reason, to_status); S3 is tests.support.fake_s3.FakeS3, Kubernetes
tests.support.fake_kube.FakeKube.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

T0 = 1_796_000_000.0  # 2026-11-30T00:53:20Z


@dataclass
class Finding:
    """One verification problem (verification.Problem's fields)."""

    kind: str
    key: str = "k"
    detail: str = "d"

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "key": self.key, "detail": self.detail}


@dataclass
class FakeResult:
    verified: bool
    problems: tuple[Finding, ...] = ()
    checked: int = 3
    bytes: int = 1000

    @property
    def reason(self) -> str:
        return "" if self.verified or not self.problems else ", ".join(f"{p.kind}: {p.key}" for p in self.problems)

    def to_status(self) -> dict[str, Any]:
        return {
            "verified": self.verified,
            "checked": self.checked,
            "bytes": self.bytes,
            "problems": [p.to_dict() for p in self.problems],
            "verifiedAt": "2026-12-02T12:00:00Z",
        }


@dataclass
class FakeVerifier:
    """verification.verify_sweep_checkpoints' signature; records each run root it is asked to verify."""

    verified: bool = True
    calls: list[str] = field(default_factory=list)
    findings: list[Finding] | None = None  # what an unverified result reports (default: a missing file)
    result: FakeResult | None = None  # when set, returned as it is

    def __call__(self, client: Any, root: str, **_: Any) -> FakeResult:
        self.calls.append(root)
        if self.result is not None:
            return self.result
        if self.verified:
            return FakeResult(True)
        findings = self.findings or [
            Finding("missing-file", "train/t1/checkpoint_epoch-000002/model.pt", "listed in the manifest, absent")
        ]
        return FakeResult(False, tuple(findings))


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
