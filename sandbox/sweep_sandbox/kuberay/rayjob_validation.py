"""KubeRay's validation of a RayJob (utils/validation.go ValidateRayJobMetadata, ValidateRayJobSpec, ValidateRayJobStatus):
the Event reason and error text of the first rule broken."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sweep_contracts import runtime_env

from .builders import submission_mode
from .rayjob_types import LABEL_CLUSTER, MAX_RAYJOB_NAME_LENGTH

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def validate_rayjob(rayjob: Mapping[str, Any]) -> tuple[str, str] | None:
    """rayjob_controller.go validateRayJob -> utils/validation.go ValidateRayJobMetadata, ValidateRayJobSpec (with
    validateDeletionConfiguration, validateDeletionRules, validateLegacyDeletionPolicies) and ValidateRayJobStatus.
    Returns (Event reason, error text) for the first rule broken, None if valid. ValidateRayClusterSpec's checks of
    the cluster template are not modelled (beyond its presence)."""
    meta, spec, status = rayjob["metadata"], rayjob.get("spec") or {}, rayjob.get("status") or {}
    name = meta.get("name", "")
    if len(name) > MAX_RAYJOB_NAME_LENGTH:
        return "InvalidRayJobMetadata", (
            f"The RayJob metadata is invalid: RayJob name should be no more than {MAX_RAYJOB_NAME_LENGTH} characters"
        )
    if not _DNS1035.match(name) or len(name) > 63:
        return "InvalidRayJobMetadata", (
            "The RayJob metadata is invalid: RayJob name should be a valid DNS1035 "
            "label: [a DNS-1035 label must consist of lower case alphanumeric characters "
            "or '-', start with an alphabetic character, and end with an alphanumeric "
            "character]"
        )
    spec_error = _rayjob_spec_error(spec)
    if spec_error:
        return "InvalidRayJobSpec", spec_error
    if status.get("jobDeploymentStatus") == "Waiting" and submission_mode(spec) != "InteractiveMode":
        return "InvalidRayJobStatus", (
            "The RayJob status is invalid: JobDeploymentStatus cannot be `Waiting` when "
            "SubmissionMode is not InteractiveMode"
        )
    return None


def _rayjob_spec_error(spec: Mapping[str, Any]) -> str | None:
    invalid = "The RayJob spec is invalid: "
    shutdown = bool(spec.get("shutdownAfterJobFinishes"))
    ttl = int(spec.get("ttlSecondsAfterFinished") or 0)
    selector = spec.get("clusterSelector") or {}
    mode = submission_mode(spec)
    backoff = spec.get("backoffLimit")
    if spec.get("suspend") and not shutdown:
        return invalid + "a RayJob with shutdownAfterJobFinishes set to false is not allowed to be suspended"
    if ttl < 0:
        return invalid + "TTLSecondsAfterFinished must be a non-negative integer"
    deletion_error = _deletion_configuration_error(spec)
    if deletion_error:
        return deletion_error
    if spec.get("suspend") and selector:
        return invalid + "the ClusterSelector mode doesn't support the suspend operation"
    if not spec.get("rayClusterSpec") and not selector:
        return invalid + "one of RayClusterSpec or ClusterSelector must be set"
    if selector:
        if not selector.get(LABEL_CLUSTER):
            return "cluster name in ClusterSelector should not be empty"
        if mode == "SidecarMode":
            return "ClusterSelector is not supported in SidecarMode"
        if backoff is not None and int(backoff) > 0:
            return invalid + "BackoffLimit is incompatible with ClusterSelector mode"
    if mode == "InteractiveMode" and backoff is not None and int(backoff) > 0:
        return invalid + "BackoffLimit is incompatible with InteractiveMode"
    if mode == "SidecarMode":
        if spec.get("submitterPodTemplate") is not None:
            return "Currently, SidecarMode doesn't support SubmitterPodTemplate"
        if spec.get("submitterConfig") is not None:
            return "Currently, SidecarMode doesn't support SubmitterConfig"
        head_policy = (
            (((spec.get("rayClusterSpec") or {}).get("headGroupSpec") or {}).get("template") or {}).get("spec") or {}
        ).get("restartPolicy", "")
        if head_policy not in ("", "Never"):
            return "restartPolicy for head Pod should be Never or unset when using SidecarMode"
    # utils/validation.go ValidateRayJobSpec -> utils/dashboardclient/dashboard_httpclient.go UnmarshalRuntimeEnvYAML
    # (v1.7.0): sigs.k8s.io/yaml into map[string]any, so YAML that is not a mapping fails like YAML that does not
    # parse. Read with the contract's decoder (the one codec), under KubeRay's prefix.
    text = spec.get("runtimeEnvYAML") or ""
    try:
        runtime_env.decode(text)
    except ValueError as e:
        return f"failed to unmarshal RuntimeEnvYAML: {text}: {e}"
    for field_name in ("activeDeadlineSeconds", "preRunningDeadlineSeconds"):
        if spec.get(field_name) is not None and int(spec[field_name]) <= 0:
            return invalid + f"{field_name} must be a positive integer"
    if backoff is not None and int(backoff) < 0:
        return invalid + "backoffLimit must be a positive integer"
    return None


_POLICY_ORDER = ("DeleteWorkers", "DeleteCluster", "DeleteSelf")  # validateTTLConsistency: TTLs non-decreasing


def _deletion_configuration_error(spec: Mapping[str, Any]) -> str | None:
    """validation.go validateDeletionConfiguration (feature gate RayJobDeletionPolicy: on by default in v1.7.0)."""
    invalid = "The RayJob spec is invalid: "
    shutdown = bool(spec.get("shutdownAfterJobFinishes"))
    if not shutdown and int(spec.get("ttlSecondsAfterFinished") or 0) > 0:
        return invalid + "a RayJob with shutdownAfterJobFinishes set to false cannot have TTLSecondsAfterFinished"
    strategy = spec.get("deletionStrategy")
    if strategy is None:
        return None
    legacy = strategy.get("onSuccess") is not None or strategy.get("onFailure") is not None
    rules = strategy.get("deletionRules") or []
    if rules and shutdown:
        return invalid + "spec.shutdownAfterJobFinishes and spec.deletionStrategy.deletionRules are mutually exclusive"
    if rules and legacy:
        return invalid + "Cannot use both legacy onSuccess/onFailure fields and deletionRules simultaneously"
    if legacy:
        return _legacy_deletion_error(spec, strategy, shutdown)
    if rules:
        return _deletion_rules_error(spec, rules)
    return invalid + (
        "DeletionStrategy requires either BOTH onSuccess and onFailure, OR the deletionRules field (cannot be empty)"
    )


def _autoscaling(spec: Mapping[str, Any]) -> bool:
    return bool((spec.get("rayClusterSpec") or {}).get("enableInTreeAutoscaling"))


def _legacy_deletion_error(spec: Mapping[str, Any], strategy: Mapping[str, Any], shutdown: bool) -> str | None:
    on_success, on_failure = strategy.get("onSuccess"), strategy.get("onFailure")
    if on_success is None or on_failure is None:
        return (
            "both DeletionStrategy.OnSuccess and DeletionStrategy.OnFailure must be set when using the legacy "
            "deletion policy fields of DeletionStrategy"
        )
    success, failure = on_success.get("policy"), on_failure.get("policy")
    if success is None:
        return "the DeletionPolicyType field of DeletionStrategy.OnSuccess cannot be unset when DeletionStrategy is enabled"
    if failure is None:
        return "the DeletionPolicyType field of DeletionStrategy.OnFailure cannot be unset when DeletionStrategy is enabled"
    if spec.get("clusterSelector"):
        if success in ("DeleteCluster", "DeleteWorkers"):
            return f"the ClusterSelector mode doesn't support DeletionStrategy={success} on success"
        if failure in ("DeleteCluster", "DeleteWorkers"):
            return f"the ClusterSelector mode doesn't support DeletionStrategy={failure} on failure"
    if "DeleteWorkers" in (success, failure) and _autoscaling(spec):
        return "DeletionStrategy=DeleteWorkers currently does not support RayCluster with autoscaling enabled"
    if shutdown and "DeleteNone" in (success, failure):
        return (
            "The RayJob spec is invalid: shutdownAfterJobFinshes is set to 'true' while deletion policy is 'DeleteNone'"
        )
    return None


def _deletion_rules_error(spec: Mapping[str, Any], rules: list[Mapping[str, Any]]) -> str | None:
    """validateDeletionRules: every error, joined with newlines (errors.Join)."""
    errors: list[str] = []
    by_condition: dict[tuple[str, str], dict[str, int]] = {}
    for i, rule in enumerate(rules):
        condition, policy = rule.get("condition") or {}, rule.get("policy", "")
        has_job, has_deployment = "jobStatus" in condition, "jobDeploymentStatus" in condition
        if has_job and has_deployment:
            errors.append(f"deletionRules[{i}]: cannot set both JobStatus and JobDeploymentStatus at the same time")
            continue
        if not has_job and not has_deployment:
            errors.append(f"deletionRules[{i}]: exactly one of JobStatus and JobDeploymentStatus must be set")
            continue
        ttl = int(condition.get("ttlSeconds") or 0)
        if ttl < 0:
            errors.append(f"deletionRules[{i}]: TTLSeconds must be non-negative")
            continue
        if spec.get("clusterSelector") and policy in ("DeleteCluster", "DeleteWorkers"):
            errors.append(
                f"deletionRules[{i}]: DeletionPolicyType '{policy}' not supported when ClusterSelector is set"
            )
            continue
        if _autoscaling(spec) and policy == "DeleteWorkers":
            errors.append(
                f"deletionRules[{i}]: DeletionPolicyType 'DeleteWorkers' not supported with autoscaling enabled"
            )
            continue
        kind = (
            ("JobStatus", condition["jobStatus"])
            if has_job
            else ("JobDeploymentStatus", condition["jobDeploymentStatus"])
        )
        policies = by_condition.setdefault(kind, {})
        if policy in policies:
            errors.append(
                f"deletionRules[{i}]: duplicate rule for DeletionPolicyType '{policy}' and {kind[0]} '{kind[1]}'"
            )
            continue
        policies[policy] = ttl
    for (kind, value), policies in by_condition.items():
        previous: tuple[str, int] | None = None
        for policy in _POLICY_ORDER:
            if policy not in policies:
                continue
            if previous is not None and policies[policy] < previous[1]:
                errors.append(
                    f"for {kind} '{value}': {policy} TTL ({policies[policy]}) must be >= {previous[0]} TTL "
                    f"({previous[1]})"
                )
            previous = (policy, policies[policy])
    return "\n".join(errors) or None
