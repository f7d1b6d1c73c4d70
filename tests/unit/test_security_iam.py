"""The IAM policies in docs/iam/ (issue 15): valid JSON, every resource scoped, no wildcard beyond the namespace
prefix; and an evaluation of the per-namespace runner policies for requests from one namespace against keys of
its own and of another namespace."""

from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_chart import render_values

IAM = Path(__file__).resolve().parents[2] / "docs" / "iam"
BUCKET = "arn:aws:s3:::my-checkpoint-bucket"
TAG = "${aws:PrincipalTag/kubernetes-namespace}"
NAMESPACED = {"runner-policy-namespace.json": "team-a", "runner-policy-abac.json": TAG}
POLICY_FILES = sorted(p.name for p in IAM.glob("*.json"))


def statements(name: str) -> list[dict[str, Any]]:
    doc = json.loads((IAM / name).read_text())
    assert doc["Version"] == "2012-10-17"
    found = doc["Statement"]
    for statement in found:
        for key in ("Action", "Resource"):
            if isinstance(statement.get(key), str):
                statement[key] = [statement[key]]
    return found


def test_docs_iam_holds_the_policies_docs_iam_md_names() -> None:
    linked = set(re.findall(r"\(iam/([\w.-]+\.json)\)", (IAM.parent / "iam.md").read_text()))
    assert linked == set(POLICY_FILES)
    assert set(NAMESPACED) <= set(POLICY_FILES)


@pytest.mark.parametrize("name", POLICY_FILES)
def test_every_policy_is_valid_json_with_enumerated_actions(name: str) -> None:
    for statement in statements(name):
        assert statement["Effect"] == "Allow" and statement["Sid"]
        assert not any("*" in action for action in statement["Action"]), (name, statement)


@pytest.mark.parametrize("name", sorted(NAMESPACED))
def test_namespaced_runner_policies_reach_only_the_namespace_prefix(name: str) -> None:
    namespace = NAMESPACED[name]
    prefix = f"sweeps/{namespace}/"
    for statement in statements(name):
        for resource in statement["Resource"]:
            if resource == BUCKET:  # bucket-level actions: listings, which the prefix condition bounds
                assert set(statement["Action"]) <= {"s3:ListBucket", "s3:ListBucketMultipartUploads"}
                assert statement["Condition"] == {"StringLikeIfExists": {"s3:prefix": [prefix + "*"]}}
            else:
                assert resource == f"{BUCKET}/{prefix}*", resource
                # the only wildcard is the trailing one, after the namespace's own '/'
                assert resource.replace(TAG, "").count("*") == 1 and resource.endswith("/*")


def test_the_abac_policy_keys_on_the_pod_identity_namespace_tag_and_its_trust_allows_tagging() -> None:
    text = (IAM / "runner-policy-abac.json").read_text()
    assert "sweeps/${aws:PrincipalTag/kubernetes-namespace}/*" in text
    (trust,) = statements("runner-trust-policy-pod-identity.json")
    assert trust["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert set(trust["Action"]) == {"sts:AssumeRole", "sts:TagSession"}
    assert trust["Condition"]["StringEquals"]["aws:RequestTag/kubernetes-service-account"] == "sweep-runner"


def test_the_per_namespace_trust_names_the_account_the_chart_renders_for_that_namespace() -> None:
    (trust,) = statements("runner-trust-policy-namespace.json")
    (subject,) = [v for k, v in trust["Condition"]["StringEquals"].items() if k.endswith(":sub")]
    role = "arn:aws:iam::123456789012:role/sweep-runner-team-a"
    docs = render_values(
        {"runner": {"serviceAccount": {"create": True, "perNamespace": {"team-a": {"roleArn": role}}}}}
    )
    (account,) = [d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == "sweep-runner"]
    assert subject == f"system:serviceaccount:{account['metadata']['namespace']}:{account['metadata']['name']}"
    assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"] == role


# --- evaluation ------------------------------------------------------------------------------------


def _like(pattern: str, value: str) -> bool:
    """IAM's StringLike and Resource matching: `*` any run (also across '/'), `?` one character, case-sensitive."""
    return fnmatch.fnmatchcase(value, pattern.replace("[", "[[]"))


def _resolve(text: str, tags: dict[str, str]) -> str | None:
    """Policy variables (IAM User Guide, "IAM policy elements: Variables"); an absent key leaves the element unmatched."""
    missing = False

    def sub(match: re.Match[str]) -> str:
        nonlocal missing
        key = match.group(1)
        if not key.startswith("aws:PrincipalTag/") or key.split("/", 1)[1] not in tags:
            missing = True
            return ""
        return tags[key.split("/", 1)[1]]

    resolved = re.sub(r"\$\{([^}]+)\}", sub, text)
    return None if missing else resolved


def allowed(name: str, action: str, resource: str, tags: dict[str, str], prefix: str | None = None) -> bool:
    for statement in statements(name):
        if action not in statement["Action"]:
            continue
        if not any((r := _resolve(res, tags)) is not None and _like(r, resource) for res in statement["Resource"]):
            continue
        conditions = statement.get("Condition", {})
        ok = True
        for operator, clauses in conditions.items():
            assert operator == "StringLikeIfExists", operator  # the only one these policies use
            for key, patterns in clauses.items():
                assert key == "s3:prefix"
                if prefix is not None:  # IfExists: an absent key passes
                    ok &= any((p := _resolve(pat, tags)) is not None and _like(p, prefix) for pat in patterns)
        if ok:
            return True
    return False


TEAM_A = {"kubernetes-namespace": "team-a", "kubernetes-service-account": "sweep-runner"}


@pytest.mark.parametrize("name", sorted(NAMESPACED))
def test_a_namespace_reaches_its_own_runs_and_not_another_namespaces(name: str) -> None:
    own = f"{BUCKET}/sweeps/team-a/digits-r1/train/t1/checkpoint_epoch-000002/model.pt"
    for action in ("s3:GetObject", "s3:PutObject", "s3:DeleteObject"):
        assert allowed(name, action, own, TEAM_A), action
        for other in ("sweeps/team-b/digits-r1/model.pt", "sweeps/team-a-evil/x", "sweeps/x", "other/team-a/x"):
            assert not allowed(name, action, f"{BUCKET}/{other}", TEAM_A), (action, other)
    assert allowed(name, "s3:ListBucket", BUCKET, TEAM_A, prefix="sweeps/team-a/digits-r1/")
    assert not allowed(name, "s3:ListBucket", BUCKET, TEAM_A, prefix="sweeps/team-b/")
    assert not allowed(name, "s3:ListBucket", BUCKET, TEAM_A, prefix="sweeps/")


def test_the_abac_policy_follows_the_callers_tag_and_grants_nothing_without_it() -> None:
    team_b = {**TEAM_A, "kubernetes-namespace": "team-b"}
    key = f"{BUCKET}/sweeps/team-b/digits-r1/model.pt"
    assert allowed("runner-policy-abac.json", "s3:PutObject", key, team_b)
    assert not allowed("runner-policy-abac.json", "s3:PutObject", key, TEAM_A)
    assert not allowed("runner-policy-abac.json", "s3:PutObject", key, {})


def test_the_shared_runner_policy_is_what_lets_one_team_delete_anothers_checkpoints() -> None:
    """Why the namespaced policies exist: the single-team policy reaches every namespace's runs."""
    assert allowed("runner-policy.json", "s3:DeleteObject", f"{BUCKET}/sweeps/team-b/digits-r1/model.pt", TEAM_A)
