"""Operator settings: one object, read once at startup, passed explicitly; every default lives here.

Each field names the environment variable that sets it (the Helm chart's ConfigMap provides them);
nothing reads `os.environ` at import time.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from pydantic.alias_generators import to_camel

from sweep_contracts.api import MAX_NUM_SAMPLES


class SettingsError(ValueError):
    """A setting has a value the operator cannot use; the message names the variable or key."""


# The path kopf serves the TrainingSweep validating webhook on (the handler id); the chart's
# ValidatingWebhookConfiguration points here.
WEBHOOK_PATH = "/validate-trainingsweep"


def _env(name: str) -> dict[str, str]:
    return {"env": name}


@dataclass(frozen=True)
class OperatorLimits:
    """Operator-wide caps (R21). A sweep over a per-sweep cap is Invalid; over the namespace budget, Queued."""

    max_workers_per_sweep: int = field(default=16, metadata=_env("SWEEP_MAX_WORKERS_PER_SWEEP"))
    max_gpus_per_sweep: int = field(default=16, metadata=_env("SWEEP_MAX_GPUS_PER_SWEEP"))
    max_gpus_per_namespace: int = field(default=32, metadata=_env("SWEEP_MAX_GPUS_PER_NAMESPACE"))
    max_active_seconds: int = field(default=3 * 24 * 3600, metadata=_env("SWEEP_MAX_ACTIVE_SECONDS"))
    default_active_seconds: int = field(default=6 * 3600, metadata=_env("SWEEP_DEFAULT_ACTIVE_SECONDS"))
    # Longest spec.deletion.verificationTimeoutSeconds a sweep may ask for: one slow bucket holds a verification
    # thread at most this long.
    max_verification_timeout_seconds: int = field(default=1800, metadata=_env("SWEEP_MAX_VERIFICATION_TIMEOUT_SECONDS"))
    # Most trials one sweep may ask for (tune.numSamples times the grid's points): Tune's driver holds every trial in
    # memory and in its experiment state; at most the CRD's own maximum of tune.numSamples.
    max_trials_per_sweep: int = field(default=10_000, metadata=_env("SWEEP_MAX_TRIALS_PER_SWEEP"))

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SettingsError(f"{to_camel(f.name)} ({f.metadata['env']}): got {value!r}; must be an integer >= 1")
        if self.max_trials_per_sweep > MAX_NUM_SAMPLES:
            raise SettingsError(
                f"maxTrialsPerSweep (SWEEP_MAX_TRIALS_PER_SWEEP): got {self.max_trials_per_sweep}; must be at most "
                f"{MAX_NUM_SAMPLES}, the CRD's maximum of tune.numSamples"
            )
        if self.default_active_seconds > self.max_active_seconds:
            raise SettingsError(
                f"defaultActiveSeconds ({self.default_active_seconds}) must not exceed "
                f"maxActiveSeconds ({self.max_active_seconds})"
            )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str = "limits") -> OperatorLimits:
        """From camelCase keys (a `--limits` YAML file or a values block); unknown keys are errors."""
        known = {to_camel(f.name): f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise SettingsError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}")
        return cls(**{known[k]: v for k, v in data.items()})


_SERVICE_ACCOUNT_ENTRY = re.compile(r"^(\*|[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)/[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_LOCAL_QUEUE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_HOST_ENTRY = re.compile(r"^(\*\.)?[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?(:\d{1,5})?$")


@dataclass(frozen=True)
class TenancyPolicy:
    """Who may aim a sweep where: the service accounts its pods may run as, the S3 endpoints the
    operator may call for it with its own credentials. Empty lists allow anything (the single-team default)."""

    # `namespace/name` or `*/name` entries: spec.storage.serviceAccountName must match one for the sweep's namespace.
    allowed_service_accounts: tuple[str, ...] = field(default=(), metadata=_env("SWEEP_ALLOWED_SERVICE_ACCOUNTS"))
    # `host`, `host:port` or `*.suffix` entries: spec.storage.endpointUrl's host must match one.
    allowed_endpoint_hosts: tuple[str, ...] = field(default=(), metadata=_env("SWEEP_ALLOWED_ENDPOINT_HOSTS"))

    def __post_init__(self) -> None:
        for entry in self.allowed_service_accounts:
            if not _SERVICE_ACCOUNT_ENTRY.match(entry):
                raise SettingsError(
                    f"allowedServiceAccounts (SWEEP_ALLOWED_SERVICE_ACCOUNTS): got {entry!r}; "
                    "entries are namespace/name or */name"
                )
        for entry in self.allowed_endpoint_hosts:
            if not _HOST_ENTRY.match(entry):
                raise SettingsError(
                    f"allowedEndpointHosts (SWEEP_ALLOWED_ENDPOINT_HOSTS): got {entry!r}; "
                    "entries are host, host:port or *.domain (lowercase)"
                )

    def service_accounts_for(self, namespace: str) -> list[str]:
        """The names allowed in `namespace` (empty: any, when no allowlist is set)."""
        names = []
        for entry in self.allowed_service_accounts:
            scope, _, name = entry.partition("/")
            if scope in ("*", namespace):
                names.append(name)
        return sorted(set(names))

    def service_account_allowed(self, namespace: str, name: str) -> bool:
        return not self.allowed_service_accounts or name in self.service_accounts_for(namespace)

    def endpoint_allowed(self, url: str) -> bool:
        """An empty endpoint (AWS S3 itself) is always allowed; otherwise its host (or host:port) must match."""
        if not url or not self.allowed_endpoint_hosts:
            return True
        parts = urlsplit(url)
        try:
            host, port = (parts.hostname or "").lower(), parts.port
        except ValueError:
            return False
        candidates = {host} | ({f"{host}:{port}"} if port else set())
        # An entry without a port allows the host on any port; `*.` matches subdomains only (not the domain).
        for entry in self.allowed_endpoint_hosts:
            if entry.startswith("*."):
                if any(fnmatch.fnmatchcase(c, entry) for c in candidates):
                    return True
            elif entry in candidates:
                return True
        return False


@dataclass(frozen=True)
class Settings:
    """Everything the operator reads at startup."""

    limits: OperatorLimits = field(default_factory=OperatorLimits)
    tenancy: TenancyPolicy = field(default_factory=TenancyPolicy)
    # Namespaces to watch, comma-separated; empty: the whole cluster.
    namespaces: tuple[str, ...] = field(default=(), metadata=_env("SWEEP_WATCH_NAMESPACES"))
    # S3 defaults for sweeps that leave storage.region / storage.endpointUrl empty (and for the verifier).
    s3_region: str = field(default="", metadata=_env("SWEEP_S3_REGION"))
    s3_endpoint_url: str = field(default="", metadata=_env("SWEEP_S3_ENDPOINT_URL"))
    # How often a Running sweep's _sweep/status.json is read.
    status_poll_seconds: float = field(default=15.0, metadata=_env("SWEEP_STATUS_POLL_SECONDS"))
    # The longest wait between reads of a status.json that has not changed: the poll doubles from
    # status_poll_seconds after each read that found it unchanged, up to this; a change or a RayJob event resets it.
    status_poll_max_seconds: float = field(default=120.0, metadata=_env("SWEEP_STATUS_POLL_MAX_SECONDS"))
    # A change of a running sweep's progress alone (trial counts, best trial) is written into its status at most this
    # often; a phase, condition or stop is written at once, with the latest progress.
    progress_mirror_seconds: float = field(default=120.0, metadata=_env("SWEEP_PROGRESS_MIRROR_SECONDS"))
    # How often RayJob state, deadlines and drift are re-checked.
    reconcile_seconds: float = field(default=10.0, metadata=_env("SWEEP_RECONCILE_SECONDS"))
    # The longest the operator waits for a graceful stop (Ray's Jobs API stop, the driver's last reports) before it
    # deletes a RayJob whose job still runs; a sweep's own deadlines.gracefulStopSeconds applies below it.
    max_graceful_stop_seconds: float = field(default=900.0, metadata=_env("SWEEP_MAX_GRACEFUL_STOP_SECONDS"))
    # The operator container's memory limit in bytes: the chart sets it from the pod's resources.limits.memory (the
    # downward API). The memory budget for tenants' data (memory_budget.py) is sized from it; 0: unknown, the chart's
    # default limit (512 MiB) is assumed.
    memory_limit_bytes: int = field(default=0, metadata=_env("SWEEP_MEMORY_LIMIT_BYTES"))
    # Concurrent S3 listings in one verification.
    verify_concurrency: int = field(default=8, metadata=_env("SWEEP_VERIFY_CONCURRENCY"))
    # The checkpoint guard's verifications running at once, on a pool of their own (bounds the S3 connections and
    # threads a slow bucket holds; the webhook never waits on it).
    verification_workers: int = field(default=8, metadata=_env("SWEEP_VERIFICATION_WORKERS"))
    # S3 clients kept (least recently used dropped first), one per (endpoint, region) pair.
    s3_client_cache_size: int = field(default=32, metadata=_env("SWEEP_S3_CLIENT_CACHE_SIZE"))
    # Minimum retention (days) below which bucket lifecycle rules raise verification warnings.
    min_retention_days: int = field(default=30, metadata=_env("SWEEP_MIN_RETENTION_DAYS"))
    # RayJob ttlSecondsAfterFinished: KubeRay deletes the RayCluster this long after the job ends (the guard holds it).
    ttl_seconds_after_finished: int = field(default=300, metadata=_env("SWEEP_TTL_SECONDS_AFTER_FINISHED"))
    # kopf peering object for HA (several replicas, one active); empty: standalone.
    peering_name: str = field(default="", metadata=_env("SWEEP_PEERING_NAME"))
    # Prometheus metrics port (0: off) and kopf liveness port.
    metrics_port: int = field(default=9090, metadata=_env("SWEEP_METRICS_PORT"))
    liveness_port: int = field(default=8080, metadata=_env("SWEEP_LIVENESS_PORT"))
    # kopf's admission webhook server (0: off); TLS cert/key (tls.crt, tls.key) mounted from a Secret.
    webhook_port: int = field(default=0, metadata=_env("SWEEP_WEBHOOK_PORT"))
    webhook_cert_dir: str = field(default="/etc/sweep-operator/webhook-tls", metadata=_env("SWEEP_WEBHOOK_CERT_DIR"))
    # How often the mounted certificate files are re-read; a renewed pair is served without a restart.
    webhook_cert_check_seconds: float = field(default=10.0, metadata=_env("SWEEP_WEBHOOK_CERT_CHECK_SECONDS"))
    # The largest admission request the webhook reads (413 past it, before parsing); webhook_bounds.py says why 256 KiB.
    webhook_max_request_bytes: int = field(default=256 * 1024, metadata=_env("SWEEP_WEBHOOK_MAX_REQUEST_BYTES"))
    # GPU-hour budgets, measured from the GPU pods of each namespace's sweeps over a rolling window:
    # the default for every namespace (0: none), `namespace=hours` entries overriding it (0: none there), the window.
    namespace_gpu_hours: float = field(default=0.0, metadata=_env("SWEEP_NAMESPACE_GPU_HOURS"))
    namespace_gpu_hour_budgets: tuple[str, ...] = field(default=(), metadata=_env("SWEEP_NAMESPACE_GPU_HOUR_BUDGETS"))
    gpu_hours_window_seconds: int = field(default=7 * 24 * 3600, metadata=_env("SWEEP_GPU_HOURS_WINDOW_SECONDS"))
    # Seconds between rewrites of a running sweep's status.usage totals (a pod starting or ending is written at once).
    usage_refresh_seconds: float = field(default=60.0, metadata=_env("SWEEP_USAGE_REFRESH_SECONDS"))
    # Kueue mode (docs/kueue.md): the LocalQueue a sweep without spec.queueName is queued in, for every namespace
    # (empty: none) and per namespace as `namespace=queue` entries (an entry with no queue turns it off there).
    kueue_default_queue: str = field(default="", metadata=_env("SWEEP_KUEUE_DEFAULT_QUEUE"))
    kueue_namespace_queues: tuple[str, ...] = field(default=(), metadata=_env("SWEEP_KUEUE_NAMESPACE_QUEUES"))
    # The operator's own namespace (the chart's release namespace): where its webhook certificate Secret lives.
    operator_namespace: str = field(default="", metadata=_env("SWEEP_OPERATOR_NAMESPACE"))
    # webhook.certProvider=operator: the Secret the replicas share the CA and serving pair in; the operator
    # renews it, writes the pair into webhook_cert_dir and injects the CA into webhook_configurations
    # (`ValidatingWebhookConfiguration/<name>` entries). Empty: the files are mounted (cert-manager or your own).
    webhook_cert_secret: str = field(default="", metadata=_env("SWEEP_WEBHOOK_CERT_SECRET"))
    webhook_service: str = field(default="", metadata=_env("SWEEP_WEBHOOK_SERVICE"))
    webhook_configurations: tuple[str, ...] = field(default=(), metadata=_env("SWEEP_WEBHOOK_CONFIGURATIONS"))
    webhook_cert_validity_days: int = field(default=365, metadata=_env("SWEEP_WEBHOOK_CERT_VALIDITY_DAYS"))
    webhook_cert_renew_before_days: int = field(default=30, metadata=_env("SWEEP_WEBHOOK_CERT_RENEW_BEFORE_DAYS"))
    webhook_cert_sync_seconds: float = field(default=300.0, metadata=_env("SWEEP_WEBHOOK_CERT_SYNC_SECONDS"))
    # KubeRay's ServiceAccount as `namespace/name` (the chart's kuberay values): checked at startup, because the
    # guard policy trusts exactly that identity. Empty: not checked.
    kuberay_service_account: str = field(default="", metadata=_env("SWEEP_KUBERAY_SERVICE_ACCOUNT"))

    def __post_init__(self) -> None:
        if (
            isinstance(self.memory_limit_bytes, bool)
            or not isinstance(self.memory_limit_bytes, int)
            or not (self.memory_limit_bytes == 0 or self.memory_limit_bytes >= 64 * 1024 * 1024)
        ):
            raise SettingsError(
                f"memoryLimitBytes (SWEEP_MEMORY_LIMIT_BYTES): got {self.memory_limit_bytes!r}; must be the pod's "
                "memory limit in bytes, at least 64 MiB (67108864), or 0 when unknown"
            )
        if (
            isinstance(self.webhook_max_request_bytes, bool)
            or not isinstance(self.webhook_max_request_bytes, int)
            or not 16 * 1024 <= self.webhook_max_request_bytes <= 3 * 1024 * 1024
        ):
            raise SettingsError(
                f"webhookMaxRequestBytes (SWEEP_WEBHOOK_MAX_REQUEST_BYTES): got {self.webhook_max_request_bytes!r}; "
                "must be an integer from 16384 (16 KiB) to 3145728 (3 MiB: two copies of the largest object etcd stores)"
            )
        for name in ("status_poll_max_seconds", "progress_mirror_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                env = next(f.metadata["env"] for f in dataclasses.fields(self) if f.name == name)
                raise SettingsError(f"{to_camel(name)} ({env}): got {value!r}; must be a number of seconds >= 0")
        for name in ("verification_workers", "s3_client_cache_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                env = next(f.metadata["env"] for f in dataclasses.fields(self) if f.name == name)
                raise SettingsError(f"{to_camel(name)} ({env}): got {value!r}; must be an integer >= 1")
        self.namespace_gpu_hour_budget("")  # every entry parses, or the operator does not start
        self.kueue_queue_for("")
        if (
            isinstance(self.gpu_hours_window_seconds, bool)
            or not isinstance(self.gpu_hours_window_seconds, int)
            or self.gpu_hours_window_seconds < 1
        ):
            raise SettingsError(
                f"gpuHoursWindowSeconds (SWEEP_GPU_HOURS_WINDOW_SECONDS): got "
                f"{self.gpu_hours_window_seconds!r}; must be an integer >= 1"
            )
        self._check_webhook_certificate_and_kuberay()
        if not self.namespace_gpu_hours >= 0:
            raise SettingsError(
                f"namespaceGpuHours (SWEEP_NAMESPACE_GPU_HOURS): got {self.namespace_gpu_hours!r}; "
                "must be >= 0 (0: no namespace budget)"
            )

    def _check_webhook_certificate_and_kuberay(self) -> None:
        if self.webhook_cert_secret and not (self.operator_namespace and self.webhook_service):
            raise SettingsError(
                "webhookCertSecret (SWEEP_WEBHOOK_CERT_SECRET) needs SWEEP_OPERATOR_NAMESPACE and SWEEP_WEBHOOK_SERVICE "
                "(the certificate names the Service)"
            )
        if not 0 < self.webhook_cert_renew_before_days < self.webhook_cert_validity_days:
            raise SettingsError(
                f"webhookCertRenewBeforeDays (SWEEP_WEBHOOK_CERT_RENEW_BEFORE_DAYS): got "
                f"{self.webhook_cert_renew_before_days!r}; must be >= 1 and below SWEEP_WEBHOOK_CERT_VALIDITY_DAYS "
                f"({self.webhook_cert_validity_days!r})"
            )
        if not self.webhook_cert_sync_seconds > 0:
            raise SettingsError(
                f"webhookCertSyncSeconds (SWEEP_WEBHOOK_CERT_SYNC_SECONDS): got {self.webhook_cert_sync_seconds!r}; "
                "must be > 0"
            )
        for entry in self.webhook_configurations:
            kind, _, name = entry.rpartition("/")
            if kind not in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration") or not name:
                raise SettingsError(
                    f"webhookConfigurations (SWEEP_WEBHOOK_CONFIGURATIONS): got {entry!r}; entries are "
                    "ValidatingWebhookConfiguration/<name> or MutatingWebhookConfiguration/<name>"
                )
        if self.kuberay_service_account and not _SERVICE_ACCOUNT_ENTRY.match(self.kuberay_service_account):
            raise SettingsError(
                f"kuberayServiceAccount (SWEEP_KUBERAY_SERVICE_ACCOUNT): got {self.kuberay_service_account!r}; "
                "expected namespace/name, as kuberay.namespace and kuberay.serviceAccountName"
            )
        if self.kuberay_service_account.startswith("*/"):
            raise SettingsError(
                f"kuberayServiceAccount (SWEEP_KUBERAY_SERVICE_ACCOUNT): got {self.kuberay_service_account!r}; "
                "name the namespace KubeRay runs in"
            )

    def namespace_gpu_hour_budget(self, namespace: str) -> float | None:
        """GPU-hours `namespace` may use per gpu_hours_window_seconds; None: no budget there."""
        hours = self.namespace_gpu_hours
        for entry in self.namespace_gpu_hour_budgets:
            name, sep, raw = entry.partition("=")
            try:
                value = float(raw) if sep and name.strip() else -1.0
            except ValueError:
                value = -1.0
            if not value >= 0:
                raise SettingsError(
                    f"namespaceGpuHourBudgets (SWEEP_NAMESPACE_GPU_HOUR_BUDGETS): got {entry!r}; "
                    "entries are namespace=hours with hours >= 0"
                )
            if name.strip() == namespace:
                hours = value
        return hours if hours > 0 else None

    def kueue_queue_for(self, namespace: str) -> str:
        """The LocalQueue for a sweep in `namespace` that names none ("": Kueue mode is off there)."""
        return kueue_queue_for(self.kueue_default_queue, self.kueue_namespace_queues, namespace)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Settings from environment variables (absent ones keep their defaults)."""
        limits = _from_env(OperatorLimits, env)
        tenancy = _from_env(TenancyPolicy, env)
        return _from_env(cls, env, limits=limits, tenancy=tenancy)


def kueue_queue_for(default: str, namespace_queues: tuple[str, ...], namespace: str) -> str:
    """SWEEP_KUEUE_DEFAULT_QUEUE, overridden by a `namespace=queue` entry of SWEEP_KUEUE_NAMESPACE_QUEUES."""
    queue = default
    for entry in (default, *(e.partition("=")[2] for e in namespace_queues)):
        if entry and not _LOCAL_QUEUE_NAME.match(entry):
            raise SettingsError(
                f"kueue queue name {entry!r} (SWEEP_KUEUE_DEFAULT_QUEUE / SWEEP_KUEUE_NAMESPACE_QUEUES): "
                "a LocalQueue name is a lowercase RFC 1123 subdomain"
            )
    for entry in namespace_queues:
        name, sep, value = entry.partition("=")
        if not sep or not name.strip():
            raise SettingsError(
                f"kueueNamespaceQueues (SWEEP_KUEUE_NAMESPACE_QUEUES): got {entry!r}; entries are namespace=queue"
            )
        if name.strip() == namespace:
            queue = value.strip()
    return queue


def _convert(raw: str, default: Any, name: str) -> Any:
    try:
        if isinstance(default, tuple):
            return tuple(p.strip() for p in raw.split(",") if p.strip())
        if isinstance(default, bool):
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError
            return raw.lower() in ("true", "1")
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
        return raw
    except ValueError:
        raise SettingsError(f"{name}: got {raw!r}; expected {type(default).__name__}") from None


def _from_env(cls: Any, env: Mapping[str, str], **given: Any) -> Any:
    kwargs = dict(given)
    for f in dataclasses.fields(cls):
        name = f.metadata.get("env")
        if name and name in env:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[operator]  # mypy cannot narrow a field's factory from MISSING
            kwargs[f.name] = _convert(env[name], default, name)
    return cls(**kwargs)
