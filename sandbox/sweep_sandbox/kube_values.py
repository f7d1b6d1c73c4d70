"""Values as Kubernetes spells them, which the API emulator and the controllers it stands in for both write: RFC 3339
times, the suffix of a generated name, the labels the Job controller puts on a Job's pods."""

from __future__ import annotations

import datetime
import secrets

from sweep_contracts.timestamps import parse_time, rfc3339

# kube's utilrand alphabet: no vowels (no words), no 0/1/3 (no confusion with o/l/e).
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"

# batch/v1 labels (k8s.io/api/batch/v1 types.go): the Job's name and uid on its pods, the uid in its selector
JOB_NAME_LABELS = ("job-name", "batch.kubernetes.io/job-name")
JOB_CONTROLLER_UID_LABELS = ("controller-uid", "batch.kubernetes.io/controller-uid")


def random_suffix(length: int = 5) -> str:
    """What Kubernetes appends to a generateName (and KubeRay to a RayCluster name)."""
    return "".join(secrets.choice(_NAME_ALPHABET) for _ in range(length))


def now_rfc3339() -> str:
    return rfc3339()


def parse_rfc3339(value: str) -> datetime.datetime:
    parsed = parse_time(value)
    if parsed is None:
        raise ValueError("an empty time")
    return parsed
