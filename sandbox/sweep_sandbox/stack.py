"""The whole product on 127.0.0.1: Kubernetes API emulator, S3 (moto), the operator, and KubeRay running jobs for real.

    with Sandbox(state_dir) as sandbox:      # writes state_dir/kubeconfig and state_dir/env
        ...                                  # kubectl --kubeconfig state_dir/kubeconfig apply -f sweep.yaml

Everything it starts it stops: servers, the operator, the stand-in, and each job's local Ray.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweep_contracts import constants
from sweep_contracts.s3_layout import S3Uri
from sweep_operator.settings import Settings

from .s3server import SANDBOX_CREDENTIALS, S3Server

log = logging.getLogger(__name__)

SANDBOX_BUCKET = "sweeps-sandbox"
# KubeRay deletes a finished job's RayCluster after this long; the guard verifies before it goes.
SANDBOX_TTL_SECONDS = 30


SANDBOX_CLUSTER_QUEUE = "sandbox-cq"
SANDBOX_LOCAL_QUEUE = "sandbox"
# What the sandbox's ClusterQueue holds: enough for the CPU demo and a couple of (emulated) GPU sweeps.
SANDBOX_QUOTA = {"cpu": 64, "memory": "256Gi", constants.GPU_RESOURCE: 8}


def start_kueue(server: Any, local_queue: str = SANDBOX_LOCAL_QUEUE, namespaces: tuple[str, ...] = ("default",)) -> Any:
    """The Kueue stand-in with a ResourceFlavor, a ClusterQueue of SANDBOX_QUOTA and `local_queue` in each namespace
    (the objects docs/kueue.md shows a platform team creating)."""
    from . import kueue

    standin = kueue.KueueStandIn(server.api_client(), server=server).start()
    try:
        standin.apply_queues(
            kueue.resource_flavor(),
            kueue.cluster_queue(SANDBOX_CLUSTER_QUEUE, SANDBOX_QUOTA),
            *(kueue.local_queue(ns, local_queue, SANDBOX_CLUSTER_QUEUE) for ns in namespaces),
        )
    except BaseException:
        standin.stop()
        raise
    return standin


def write_env_file(path: Path, environment: Mapping[str, str], bin_dir: Path | None = None) -> None:
    """`source path` gives a shell the sandbox's environment, and this interpreter's bin folder first on PATH: the
    `kubectl` there is the one the emulator is tested with, and only there does `kubectl sweep` find kubectl-sweep."""
    # absolute(), not resolve(): a venv's python links out of the venv, and the venv's bin is the folder wanted.
    folder = bin_dir or Path(sys.executable).parent.absolute()
    lines = [f"export {key}={shlex.quote(value)}\n" for key, value in environment.items()]
    lines.append(f'export PATH={shlex.quote(str(folder))}:"$PATH"\n')
    # Whole or not at all: the file's existence says the sandbox is up to whoever waits for it (a script, a test).
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text("".join(lines))
    os.replace(partial, path)


@dataclass
class Sandbox:
    state_dir: Path
    bucket: str = SANDBOX_BUCKET
    settings: Settings | None = None
    s3: S3Server | None = field(default=None, init=False)
    server: Any = field(default=None, init=False)
    standin: Any = field(default=None, init=False)
    operator: Any = field(default=None, init=False)
    runner: Any = field(default=None, init=False)
    # Kueue mode (docs/kueue.md): a Kueue stand-in with SANDBOX_CLUSTER_QUEUE / SANDBOX_LOCAL_QUEUE, the operator's
    # default queue set to it
    kueue: bool = False
    kueue_standin: Any = field(default=None, init=False)
    # Issue 25: the chart's guard policy and webhooks, enforced by the emulator against per-user tokens (the
    # kubeconfig's contexts: operator, kuberay, tenant, guard-admin); the operator serves its webhooks
    admission: bool = True
    identities: dict[str, Any] = field(default_factory=dict, init=False)
    # Operator settings over the sandbox's defaults (`sweepctl sandbox up --namespace-gpu-hours ...`): the platform
    # team's budgets, as the chart's values set them
    overrides: dict[str, Any] = field(default_factory=dict)
    # Scripted jobs instead of local Ray (`--scripted-jobs SECONDS`): each job succeeds after this many seconds,
    # its GPU pods emulated, so GPU sweeps and their budgets run on a laptop in seconds
    scripted_seconds: float | None = None
    # A user's own code (`--code DIR`): first on the PYTHONPATH of every job the KubeRay stand-in runs on local Ray
    code_dirs: tuple[Path, ...] = ()
    # A real MLflow tracking server (sweep_sandbox.mlflow_server), started by the first sweep that asks for tracking
    mlflow: Any = field(default=None, init=False)

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def env_file(self) -> Path:
        return self.state_dir / "env"

    def environment(self) -> dict[str, str]:
        """What a shell needs to talk to the sandbox (also written to state_dir/env)."""
        assert self.s3 is not None
        return {
            "KUBECONFIG": str(self.kubeconfig.resolve()),
            "AWS_ENDPOINT_URL": self.s3.endpoint_url,
            "AWS_ACCESS_KEY_ID": SANDBOX_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "AWS_SECRET_ACCESS_KEY": SANDBOX_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            "AWS_REGION": SANDBOX_CREDENTIALS["AWS_REGION"],
            "SWEEP_SANDBOX_BUCKET": self.bucket,
        }

    def start(self) -> Sandbox:
        from .emulator import EmulatorServer, build_emulator
        from .kuberay import KubeRayStandIn
        from .operator_thread import OperatorThread
        from .realrunner import LocalRayRunner

        self.state_dir.mkdir(parents=True, exist_ok=True)
        # The operator, the stand-in and every local Ray job use these; nothing may reach for real AWS.
        os.environ.update(SANDBOX_CREDENTIALS)
        try:
            self.s3 = S3Server().start()
            self.s3.client().create_bucket(Bucket=self.bucket)
            os.environ["AWS_ENDPOINT_URL_S3"] = self.s3.endpoint_url
            # kubectl sends its tokens over TLS only; a create in a namespace nobody made is NotFound, as in a cluster
            self.server = EmulatorServer(build_emulator(auto_create_namespaces=False), tls=self.admission)
            self.server.start()
            chart_docs = self._install_chart_admission()
            self.server.write_kubeconfig(
                self.kubeconfig, users={name: identity.token for name, identity in self.identities.items()}
            )
            settings = self._operator_settings(chart_docs)
            self.settings = settings
            if self.scripted_seconds is not None:
                from .kuberay import Outcome, ScriptedRunner

                self.runner = ScriptedRunner(default=Outcome.succeed(self.scripted_seconds, startup=0.5))
            else:
                self.runner = LocalRayRunner(self.state_dir, prepare=self._ensure_bucket, code_dirs=self.code_dirs)
            # dashboard: the heads' Jobs API on loopback, so the operator's graceful stop reaches the driver (issue 26)
            self.standin = KubeRayStandIn(
                self.server.api_client(self._token("kuberay")),
                self.runner,
                emulate_pods=True,
                poll_interval=1.0,
                dashboard=True,
                container_logs=self.server.emulator.container_logs,
                cluster_api_client=self.server.api_client(),  # the Job controller and kubelet: the administrator
            )
            self.standin.start()
            if self.kueue:
                self.kueue_standin = start_kueue(self.server, settings.kueue_default_queue)
            if chart_docs:
                self._route_webhook_service(chart_docs, settings.webhook_port)
            self.operator = OperatorThread(
                settings, self.server.url, token=self._token("operator"), ca_file=self.server.ca_file
            )
            assert self.standin.jobs_api is not None  # the heads' Service names reach it as the cluster's DNS would
            controller = self.operator.controller
            controller.stop_job, controller.job_status = (
                self.standin.jobs_api.stop_job,
                self.standin.jobs_api.job_status,
            )
            self.operator.start()
            if chart_docs:
                from .chart_admission import wait_for_webhook

                wait_for_webhook(self.server)
        except BaseException:
            self.stop()
            raise
        write_env_file(self.env_file, self.environment())
        return self

    def _operator_settings(self, chart_docs: list[dict[str, Any]]) -> Settings:
        """The sandbox operator's settings: loopback S3, a laptop's rhythm, Kueue's default queue, the chart's webhook."""
        assert self.s3 is not None
        settings = self.settings or Settings(
            s3_endpoint_url=self.s3.endpoint_url,
            s3_region=SANDBOX_CREDENTIALS["AWS_REGION"],
            reconcile_seconds=2.0,
            status_poll_seconds=2.0,
            # A laptop's sandbox shows progress within seconds; a cluster's defaults trade that for requests.
            status_poll_max_seconds=4.0,
            progress_mirror_seconds=2.0,
            ttl_seconds_after_finished=SANDBOX_TTL_SECONDS,
            metrics_port=0,
            liveness_port=0,
        )
        if self.overrides:
            settings = dataclasses.replace(settings, **self.overrides)
        if self.kueue and not settings.kueue_default_queue:
            settings = dataclasses.replace(settings, kueue_default_queue=SANDBOX_LOCAL_QUEUE)
        if chart_docs:
            from . import chart_admission

            settings = chart_admission.operator_settings(
                chart_docs, settings, chart_admission.free_port(), self.state_dir / "webhook-tls"
            )
        return settings

    def _token(self, context: str) -> str | None:
        identity = self.identities.get(context)
        return identity.token if identity is not None else None

    def _install_chart_admission(self) -> list[dict[str, Any]]:
        """The chart's guard policy, webhook configurations and certificate Secret in the emulator, and its users;
        [] (and a warning) where the chart or its renderer is not there: the sandbox then enforces none of them."""
        if not self.admission:
            return []
        from . import chart_admission

        try:
            docs = chart_admission.render()
        except (ImportError, FileNotFoundError) as exc:
            log.warning("sandbox: no admission policy or webhooks (the chart does not render here: %s)", exc)
            return []
        self.identities = chart_admission.install(self.server, docs, webhook_port=None)
        # The default context (token `sandbox`, and the KubeRay-free helpers without one) is the platform team:
        # an administrator in the guard policy's allowed groups, so `sweepctl release --force` works as there.
        self.server.emulator.admission.default_user = chart_admission.SANDBOX_ADMIN
        return docs

    def _route_webhook_service(self, docs: list[dict[str, Any]], port: int) -> None:
        from .chart_admission import route_webhook_service

        route_webhook_service(self.server, docs, port)

    def _ensure_bucket(self, rayjob: Mapping[str, Any]) -> None:
        """Sandbox convenience: a sweep applied with another bucket gets it created in the local S3."""
        from sweep_contracts.runtime_env import run_spec_of

        run_spec = run_spec_of(rayjob)
        if run_spec is None or self.s3 is None or not run_spec.run_root.startswith("s3://"):
            return
        bucket = S3Uri.parse(run_spec.run_root).bucket
        client = self.s3.client()
        if bucket not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
            client.create_bucket(Bucket=bucket)

    def stop(self) -> None:
        """Stop everything started, newest first; never raises."""
        for name in ("operator", "kueue_standin", "standin", "runner", "mlflow", "server", "s3"):
            part = getattr(self, name)
            if part is None:
                continue
            try:
                if name != "runner":
                    part.stop()
                elif hasattr(part, "stop_all"):  # local Ray jobs; a scripted runner has nothing running
                    part.stop_all()
            except Exception as exc:
                log.warning("stopping the sandbox's %s: %s", name, exc)
            setattr(self, name, None)
        os.environ.pop("AWS_ENDPOINT_URL_S3", None)

    def __enter__(self) -> Sandbox:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------------------------ helpers
    def rewrite_storage(self, manifest: dict[str, Any]) -> str | None:
        """Point the sweep's storage at the sandbox bucket and S3; returns a note when the URI changed."""
        spec = manifest.setdefault("spec", {})
        storage = spec.setdefault("storage", {})
        uri = storage.get("uri", "")
        storage["endpointUrl"] = ""  # the operator's sandbox S3 default applies
        try:
            parsed = S3Uri.parse(uri)
        except ValueError:
            return None
        if parsed.bucket == self.bucket:
            return None
        new = str(S3Uri(self.bucket, parsed.key))
        storage["uri"] = new
        return f"storage.uri {uri} -> {new} (the sandbox's bucket)"

    def rewrite_tracking(self, manifest: dict[str, Any]) -> str | None:
        """A sweep that asks for MLflow tracking is tracked in the sandbox's own MLflow server (started on the first
        such sweep, SQLite under state_dir/mlflow); returns a note when its tracking URI changed."""
        mlflow = ((manifest.get("spec") or {}).get("tracking") or {}).get("mlflow")
        if not isinstance(mlflow, dict):
            return None
        given = mlflow.get("trackingUri")
        mlflow["trackingUri"] = self.tracking_url()
        mlflow.pop("credentialsSecret", None)  # the sandbox's server asks for none
        return f"tracking.mlflow.trackingUri {given} -> {self.mlflow.url} (the sandbox's MLflow server)"

    def tracking_url(self) -> str:
        """The sandbox's MLflow server (SQLite under state_dir/mlflow), started on the first call."""
        if self.mlflow is None:
            from .mlflow_server import MlflowServer

            self.mlflow = MlflowServer(self.state_dir / "mlflow").start()
        return str(self.mlflow.url)

    def label_selector(self, sweep: str) -> str:
        return f"{constants.LABEL_SWEEP}={sweep}"
