"""The only kopf-aware module: wires kopf's watch events and the admission webhook to the controller.

Each sweep's periodic check (SweepTicks) runs from a work queue of our own, so kopf puts no finalizer of its own on
anything.

    python -m sweep_operator            # settings from SWEEP_* environment variables (the chart's ConfigMap)

Handlers stay short: they note the object and enqueue (the controller's work queues do the rest); a deleting object
of ours goes to the guard's own deletion pipeline, which keeps its finalizer until a verification releases it.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import random
import re
import ssl
import sys
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp.web
import kopf

from sweep_contracts import constants

from .install_checks import run_startup_checks
from .kopf_tuning import (
    WatchRouter,
    set_watch_router,
    tune_gc,
    tune_json_patch,
    tune_kopf,
    tune_watch_decoding,
    tune_watch_router,
)
from .kube import KubeApi, api_client_from_environment
from .memory_budget import DocumentTooLarge, check_json_shape
from .metrics import OperatorMetrics
from .reconcile.controller import SweepController
from .reconcile.facts import ObjectRef
from .s3_clients import operator_s3_clients
from .settings import WEBHOOK_PATH, Settings, SettingsError
from .watch_events import (
    EVENT_COMPONENT,
    KOPF_FINALIZER,
    EventPoster,
    has_kopf_finalizer,
    ours,
    ours_body,
    raycluster_event,
    rayjob_event,
    routed,
    sweep_event,
)
from .webhook_bounds import BUSY_MESSAGE, ValidationBusy, ValidationPool, refusal_message, review_bounds
from .webhook_finalizers import (
    MUTATING_WEBHOOK_ID,
    SWEEP_MUTATING_WEBHOOK_ID,
    finalizers_at_create,
    sweep_finalizers_at_create,
)
from .workqueue import FairPool, WorkQueue

log = logging.getLogger(__name__)

SWEEPS: dict[str, Any] = {"group": constants.GROUP, "version": constants.VERSION, "plural": constants.PLURAL}
RAYJOBS: dict[str, Any] = {
    "group": constants.RAY_GROUP,
    "version": constants.RAY_VERSION_API,
    "plural": constants.RAYJOB_PLURAL,
}
RAYCLUSTERS: dict[str, Any] = {
    "group": constants.RAY_GROUP,
    "version": constants.RAY_VERSION_API,
    "plural": constants.RAYCLUSTER_PLURAL,
}

# Kueue's Workloads (read only; docs/kueue.md)
WORKLOADS: dict[str, Any] = {"group": "kueue.x-k8s.io", "version": "v1beta2", "plural": "workloads"}

WEBHOOK_ID = WEBHOOK_PATH.strip("/")
MAX_HANDLER_THREADS = 16  # kopf's executor; event handlers only enqueue
RECONCILE_WORKERS = 8  # the controller's work queue; more only queue up at the API server
GUARD_WORKERS = 8  # the guard's deletion pipeline (each may wait on an S3 verification)


class SweepTicks:
    """Each sweep's periodic check (deadlines, progress polls, the admission queue), one `reconcile_seconds` after
    it was last looked at, as kopf.timer did, but from a work queue of our own: kopf requires a finalizer of its
    own on every object with a timer (a patch per sweep, its echo, and a pass that waits for it), and ours needs
    none. The first tick comes one interval after the sweep is seen (its event reconciles it at once). Ticks stop
    for a sweep being deleted (its held pass schedules itself) or gone (forgotten by the controller).
    Unlike kopf's timers, ticks keep running while kopf's peering pauses this operator: a standby's pass is
    what an active one's would be (status writes carry their resourceVersion, RayJob names follow the uid)."""

    def __init__(self, controller: SweepController, interval: float) -> None:
        self.controller, self.interval = controller, interval
        self.queue: WorkQueue[ObjectRef] = WorkQueue(self._tick, workers=1, name="tick", flow=lambda ref: ref.namespace)

    def follow(self, body: Mapping[str, Any]) -> None:
        """A watched sweep gets its next tick one interval from now, unless one is already due sooner."""
        if not (body.get("metadata") or {}).get("deletionTimestamp"):
            self.queue.add_after(ObjectRef.of(body), self.interval)

    def _tick(self, ref: ObjectRef) -> None:
        body = self.controller.cache.sweep(ref)  # the newest copy the watch or our own write delivered
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            return
        try:
            if self.controller.tick_due(body):  # steady sweeps cost nothing
                self.controller.request_reconcile(ref.namespace, ref.name)
        finally:
            self.queue.add_after(ref, self.interval)

    def stop(self) -> None:
        self.queue.close(timeout=0)


@dataclass
class OperatorWiring:
    """What one operator instance runs with (tests and the sandbox build their own)."""

    settings: Settings
    controller: SweepController
    login: Callable[..., kopf.ConnectionInfo | None] | None = None
    ticks: SweepTicks = field(init=False)
    watch_router: WatchRouter = field(init=False)  # our own writes' echoes and the run objects' events (kopf_tuning)
    # The validating webhook's threads: its validations never run on kopf's event loop (webhook_bounds.py).
    validation_pool: ValidationPool = field(default_factory=ValidationPool)

    def __post_init__(self) -> None:
        self.ticks = SweepTicks(self.controller, self.settings.reconcile_seconds)
        self.watch_router = WatchRouter(lambda plural, obj: self.controller.cache.watch_echo(plural, obj))


class NoDiffBaseStorage(kopf.DiffBaseStorage):
    """We register no update or field handlers, so kopf needs no copy of each object's last spec: without this,
    it writes the whole RayJob spec into an annotation on every RayJob and RayCluster (an extra patch each)."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> Any:
        return {}

    def fetch(self, *, body: kopf.Body) -> Any:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: Any) -> None:
        return None


ROUTINE_HANDLERS = ("sweep_changed", "rayjob_changed", "raycluster_changed")


class RoutineHandlerSuccess(logging.Filter):
    """Drops kopf's INFO line "Handler '...sweep_changed' succeeded." for the handlers that run on every watch
    event or tick and only enqueue (a line per event, thousands a minute in a busy namespace). Failures,
    retries, the guard's deletion handlers and everything at DEBUG (--verbose) are kept."""

    _pattern = re.compile(r"^(Handler|Timer) '[^']*\.({})' succeeded\.$".format("|".join(ROUTINE_HANDLERS)))

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or not isinstance(record.msg, str):
            return True
        return not self._pattern.match(record.msg)


def quiet_routine_handler_logs() -> None:
    logger = logging.getLogger("kopf.objects")
    if not any(isinstance(f, RoutineHandlerSuccess) for f in logger.filters):
        logger.addFilter(RoutineHandlerSuccess())
    # With event handlers only, kopf's per-object INFO lines are those success lines: below WARNING (unless
    # --verbose) kopf does not even build them (a record per watch event, then dropped by the filter above).
    if logger.level == logging.NOTSET and not logging.getLogger().isEnabledFor(logging.DEBUG):
        logger.setLevel(logging.WARNING)


def configure_kopf(kopf_settings: kopf.OperatorSettings, settings: Settings) -> None:
    # The guard's finalizer is ours, not kopf's: kopf removes its configured finalizer from an object once no handler
    # needs it, and we register none that does (no deletion handler: the controller's deletion pipeline adds and
    # removes ours; no timer: SweepTicks). kopf's name stays the one its timers used, so kopf takes it off the
    # sweeps an earlier operator version left it on.
    kopf_settings.persistence.finalizer = KOPF_FINALIZER
    kopf_settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=constants.GROUP)
    kopf_settings.persistence.diffbase_storage = NoDiffBaseStorage()
    kopf_settings.execution.max_workers = MAX_HANDLER_THREADS
    # Our Events are explicit (EventPoster: every transition, every guard decision); kopf's own per-object log
    # lines become Events only from WARNING up (handler failures and retries), not its INFO successes.
    kopf_settings.posting.level = logging.WARNING
    # Events name their writer (kopf's defaults: From "kopf", reportingInstance "dev"); a pod's hostname is its name.
    kopf_settings.posting.reporting_component = EVENT_COMPONENT
    kopf_settings.posting.reporting_instance = os.uname().nodename
    quiet_routine_handler_logs()
    kopf_settings.scanning.disabled = True  # our kinds are known; no cluster-wide namespace/CRD scans
    kopf_settings.watching.server_timeout = 300
    kopf_settings.networking.request_timeout = 60
    if settings.webhook_port:
        kopf_settings.admission.server = ReloadingWebhookServer(
            addr="0.0.0.0",
            port=settings.webhook_port,
            certfile=os.path.join(settings.webhook_cert_dir, "tls.crt"),
            pkeyfile=os.path.join(settings.webhook_cert_dir, "tls.key"),
            file_check_interval=settings.webhook_cert_check_seconds,
            max_request_bytes=settings.webhook_max_request_bytes,
        )
        # admission.managed stays unset: the chart owns the ValidatingWebhookConfiguration.


class ReloadingWebhookServer(kopf.WebhookServer):
    """kopf's admission server, which re-reads its certificate files every `file_check_interval` seconds and
    restarts its listener on a change (kopf/_kits/webhooks.py WebhookServer.__call__). A pair read mid-rotation
    (a new tls.crt beside the old tls.key: files copied one by one, where kubelet's Secret volume swaps both
    at once) does not load; kopf's server would then die and every create be refused under failurePolicy Fail.
    This one keeps serving the last good pair, and the next change (the matching key) brings the new one.

    It reads at most `max_request_bytes` of a request and counts its JSON elements and depth before kopf parses it
    (kopf reads any body aiohttp accepts, 1 MiB by default, and parses it on the event loop): a larger one is
    answered 413 at once, so a forged review costs the loop a few milliseconds at most (webhook_bounds.py)."""

    _last_good: tuple[bytes | None, ssl.SSLContext | None] | None = None

    def __init__(self, *, max_request_bytes: int = 256 * 1024, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.review_bounds = review_bounds(max_request_bytes)

    async def _serve(  # type: ignore[override]  # kopf's is a staticmethod; this one needs the bounds
        self, fn: Any, request: aiohttp.web.Request
    ) -> aiohttp.web.Response:
        cap = self.review_bounds.max_bytes
        if request.content_length is not None and request.content_length > cap:
            raise _too_large(f"the admission request is {request.content_length} bytes", cap)
        capped = request.clone(client_max_size=cap)  # aiohttp stops reading past it (a chunked body has no length)
        try:
            body = await capped.read()  # kept by the request: kopf's own read gets these bytes
        except aiohttp.web.HTTPRequestEntityTooLarge:
            raise _too_large(f"the admission request is over {cap} bytes", cap) from None
        try:
            check_json_shape(body.decode("utf-8", "replace"), "the admission request", self.review_bounds)
        except DocumentTooLarge as exc:
            raise _too_large(str(exc), cap) from None
        return await kopf.WebhookServer._serve(fn, capped)

    def _build_ssl(self) -> tuple[bytes | None, ssl.SSLContext | None]:
        try:
            built = super()._build_ssl()
        except (ssl.SSLError, OSError) as exc:
            if self._last_good is None:
                raise
            log.warning("webhook certificate %s does not load (%s); serving the previous one", self.certfile, exc)
            return self._last_good
        self._last_good = built
        return built


def _too_large(what: str, cap: int) -> aiohttp.web.HTTPRequestEntityTooLarge:
    """413, saying what was too large and the cap (the API server shows a webhook's text answer to the user)."""
    text = (
        f"{what}; the TrainingSweep webhook reads at most {cap} bytes (webhook.maxRequestBytes), a sweep is a few KiB"
    )
    return aiohttp.web.HTTPRequestEntityTooLarge(max_size=cap, text=text)


def build_registry(wiring: OperatorWiring) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    _register_startup(registry, wiring)
    _register_sweeps(registry, wiring)
    _register_run_objects(registry, wiring)
    return registry


def _register_startup(registry: kopf.OperatorRegistry, wiring: OperatorWiring) -> None:
    """kopf's settings, the install's checks and the login."""
    controller = wiring.controller

    @kopf.on.startup(registry=registry)
    def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_kopf(settings, wiring.settings)
        set_watch_router(settings, wiring.watch_router)

    # Before kopf starts its admission server: the webhook's own certificate, and KubeRay's identity for the guard.
    @kopf.on.startup(registry=registry)
    def install_checks(**_: Any) -> None:
        kube_client = getattr(controller.kube, "api_client", None)
        if kube_client is not None:
            run_startup_checks(wiring.settings, kube_client, controller.metrics.registry)

    if wiring.login is not None:
        kopf.on.login(registry=registry)(wiring.login)
    else:
        kopf.on.login(registry=registry)(kopf.login_via_client)


def _register_sweeps(registry: kopf.OperatorRegistry, wiring: OperatorWiring) -> None:
    """TrainingSweep events, the sweep's admission webhook and the guard's mutating webhook."""
    controller, settings = wiring.controller, wiring.settings

    # ------------------------------------------------------------------ TrainingSweep
    # Event handlers are coroutines that only note the object and enqueue a reconcile for the controller's
    # work queue (no I/O): run in kopf's event loop, they never wait behind busy handler threads, so a new
    # sweep's event reaches the queue at once however much status traffic the running ones make.
    @kopf.on.event(**SWEEPS, registry=registry)
    async def sweep_changed(type: str, event: kopf.RawEvent, **_: Any) -> None:
        await sweep_event(controller, wiring.ticks.follow, type, _object_of(event))

    # Where kopf_tuning's router is installed, sweep events go from kopf's stream to `sweep_event` directly (see
    # the run objects below), except a sweep still carrying the finalizer an earlier version's kopf.timer needed:
    # kopf's own processing takes that one off.
    wiring.watch_router.route(
        constants.PLURAL,
        routed(functools.partial(sweep_event, controller, wiring.ticks.follow), kopf_keeps=has_kopf_finalizer),
    )

    if settings.webhook_port:  # kopf refuses admission handlers without a server to serve them
        # A coroutine, not a sync handler in kopf's thread pool: the guards' deletion handlers wait on S3 in those
        # threads, and the API server's admission call must never queue behind them. admission_problems is pure
        # (parse and compare; no S3, no API call) but CPU: it runs on the webhook's own few threads, bounded in
        # number and time, so a flood of forged reviews is refused as busy instead of holding kopf's event loop
        # (where the guard's finalizer webhooks below and every watch event are served).
        # WebhookFn's protocol lists every kwarg kopf passes; this handler takes the four it reads and **_.
        @kopf.on.validate(**SWEEPS, id=WEBHOOK_ID, operations=["CREATE", "UPDATE"], registry=registry)  # type: ignore[arg-type]  # see above
        async def sweep_admission(
            body: kopf.Body, old: Any, userinfo: Any = None, dryrun: bool = False, **_: Any
        ) -> None:
            _log_escape_hatch(body, old, userinfo, dryrun)
            try:
                problems = await wiring.validation_pool.run(controller.admission_problems, body, old)
            except ValidationBusy as busy:
                if wiring.validation_pool.note_refusal():  # one line a minute, however many a flood makes
                    log.warning("TrainingSweep reviews refused as busy (%s); the first of a minute's refusals", busy)
                raise kopf.AdmissionError(BUSY_MESSAGE, code=429) from None
            if problems:
                raise kopf.AdmissionError(refusal_message(problems), code=422)

        @kopf.on.cleanup(registry=registry)
        def stop_validations(**_: Any) -> None:
            wiring.validation_pool.shutdown()

        # The guard's finalizer at creation: on a guarded RayCluster (whether or not the operator's watch ever sees
        # it; the chart sends only objects with the guard annotation, failurePolicy Fail) and on every sweep (the
        # first pass patches nothing before it creates the RayJob, and no sweep exists unguarded).
        for resource, hook_id, decide in (
            (RAYCLUSTERS, MUTATING_WEBHOOK_ID, finalizers_at_create),
            (SWEEPS, SWEEP_MUTATING_WEBHOOK_ID, sweep_finalizers_at_create),
        ):
            kopf.on.mutate(**resource, id=hook_id, operations=["CREATE"], registry=registry)(_guard_finalizer(decide))


def _guard_finalizer(
    decide: Callable[[Mapping[str, Any]], list[str] | None],
) -> Callable[..., Coroutine[Any, Any, None]]:
    """A mutating handler that sets the finalizers `decide` asks for (None: the object stays as it is)."""

    async def handler(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        finalizers = decide(body)
        if finalizers is not None:
            patch.metadata["finalizers"] = finalizers

    return handler


def _register_run_objects(registry: kopf.OperatorRegistry, wiring: OperatorWiring) -> None:
    """RayJob, RayCluster and (Kueue mode) Workload events."""
    controller = wiring.controller

    # ------------------------------------------------------------------ RayJob / RayCluster
    # Both are watched through kopf (its streams, login and reconnects), and where kopf_tuning's router is installed
    # their events go from the stream straight to `rayjob_event` / `raycluster_event`, never through kopf's
    # per-object workers: the handlers only note, check and enqueue, and every RayJob and RayCluster in the cluster,
    # other teams' too, paid kopf's per-event processing (causes, body views, a logger, a worker task per object).
    # The kopf handlers below serve the same functions where the router is not installed.
    @kopf.on.event(**RAYJOBS, when=ours, registry=registry)
    async def rayjob_changed(type: str, event: kopf.RawEvent, **_: Any) -> None:
        await rayjob_event(controller, type, _object_of(event))

    # The guard's finalizer goes on each of our RayClusters as it appears; a deleting one enters the guard's
    # pipeline; a worker group raised above the run's cap is set back.
    @kopf.on.event(**RAYCLUSTERS, when=ours, registry=registry)
    async def raycluster_changed(type: str, event: kopf.RawEvent, **_: Any) -> None:
        await raycluster_event(controller, type, _object_of(event))

    for plural, handle in ((constants.RAYJOB_PLURAL, rayjob_event), (constants.RAYCLUSTER_PLURAL, raycluster_event)):
        wiring.watch_router.route(plural, routed(functools.partial(handle, controller), accept=ours_body))

    # Kueue mode: a Workload's admission or eviction reaches its sweep at once (ticks would find it too).
    @kopf.on.event(**WORKLOADS, registry=registry)
    async def workload_changed(type: str, body: kopf.Body, **_: Any) -> None:
        if type != "DELETED":
            await asyncio.to_thread(controller.workload_changed, body)


def _log_escape_hatch(
    body: Mapping[str, Any], old: Mapping[str, Any] | None, userinfo: Any, dryrun: bool = False
) -> None:
    """The webhook is the one place the API names the user: say who sets the escape hatch on a sweep it sees
    (creates and spec changes; the guard's ValidatingAdmissionPolicy decides whether they may). The user is what
    the review says: the API server's word only where the NetworkPolicy admits no one else to the webhook
    (`networkPolicy.webhookFrom`), since any caller that reaches the port can send a review of its own making."""

    def skip(obj: Mapping[str, Any] | None) -> str | None:
        return (((obj or {}).get("metadata") or {}).get("annotations") or {}).get(
            constants.ANNOTATION_SKIP_VERIFICATION
        )

    if skip(body) is not None and skip(body) != skip(old):
        meta = body.get("metadata") or {}
        user = (userinfo or {}).get("username") or "unknown"
        log.warning(
            "escape hatch %s=%r set on TrainingSweep %s/%s by %s (groups %s), as the admission review says%s",
            constants.ANNOTATION_SKIP_VERIFICATION,
            skip(body),
            meta.get("namespace"),
            meta.get("name"),
            user,
            ", ".join((userinfo or {}).get("groups") or []) or "none",
            " (a dry run: nothing stored)" if dryrun else "",
        )


def _object_of(event: kopf.RawEvent) -> Mapping[str, Any]:
    """The event's object as the watch delivered it (a plain dict; read only). kopf's Body is a view that resolves
    every key through its layers: a tenth of the operator's CPU went to reading metadata through it."""
    return event["object"]


def build_controller(settings: Settings, api_client: Any, metrics: OperatorMetrics | None = None) -> SweepController:
    """The controller with real clients: Kubernetes from `api_client`, S3 from the shared factory."""
    # Verifications share no thread with reconciles or the webhook; at most verification_workers wait on S3.
    # Fair between namespaces as the guard's queue is: one namespace's slow buckets hold at most its share.
    pool = FairPool(settings.verification_workers, name="verify")
    kube = KubeApi(api_client)
    return SweepController(
        settings,
        kube,
        operator_s3_clients(settings),  # allowlisted endpoints only (s3_clients.py)
        EventPoster(kube),
        metrics=metrics,
        reconcile_workers=RECONCILE_WORKERS,
        verification_pool=pool,
        guard_workers=GUARD_WORKERS,
    )


async def operate(
    wiring: OperatorWiring,
    *,
    stop_flag: asyncio.Event | None = None,
    ready_flag: asyncio.Event | None = None,
    liveness_endpoint: str | None = None,
) -> None:
    """Run one operator until `stop_flag` is set (in-process: tests and the sandbox)."""
    settings = wiring.settings
    tune_kopf()
    tune_watch_decoding()
    tune_watch_router()
    tune_json_patch()
    try:
        await _run_kopf(
            wiring, settings, stop_flag=stop_flag, ready_flag=ready_flag, liveness_endpoint=liveness_endpoint
        )
    finally:
        wiring.ticks.stop()
        wiring.controller.close()
        router = wiring.watch_router
        log.info("watch events taken before kopf: echoes %s, routed %s", dict(router.dropped), dict(router.routed))
        if wiring.controller.verification_pool is not None:
            wiring.controller.verification_pool.shutdown(wait=False, cancel_futures=True)


async def _run_kopf(
    wiring: OperatorWiring,
    settings: Settings,
    *,
    stop_flag: asyncio.Event | None,
    ready_flag: asyncio.Event | None,
    liveness_endpoint: str | None,
) -> None:
    await kopf.operator(
        registry=build_registry(wiring),
        standalone=not settings.peering_name,
        peering_name=settings.peering_name or None,
        # kopf pauses peers of equal or higher priority: distinct random priorities leave exactly one active.
        priority=random.randint(1, 1_000_000) if settings.peering_name else None,
        clusterwide=not settings.namespaces,
        namespaces=settings.namespaces,
        liveness_endpoint=liveness_endpoint,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )


def run_operator(argv: list[str]) -> int:
    """`python -m sweep_operator`: settings from the environment, read once, then kopf until stopped."""
    parser = argparse.ArgumentParser(prog="python -m sweep_operator", description=__doc__)
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account, else $KUBECONFIG)")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = Settings.from_env(os.environ)
    except SettingsError as exc:
        print(f"sweep-operator: invalid setting: {exc}", file=sys.stderr)
        return 2
    metrics = OperatorMetrics()
    if settings.metrics_port:
        metrics.serve(settings.metrics_port)
    controller = build_controller(settings, api_client_from_environment(args.kubeconfig), metrics)
    login = None
    if args.kubeconfig:
        path = args.kubeconfig

        def login(**_: Any) -> kopf.ConnectionInfo | None:
            os.environ["KUBECONFIG"] = path
            return kopf.login_with_kubeconfig(**_)

    wiring = OperatorWiring(settings, controller, login)
    liveness = f"http://0.0.0.0:{settings.liveness_port}/healthz" if settings.liveness_port else None
    # The platform's own S3 client now (botocore's import and its service model), not in the first progress poll.
    try:
        controller.s3_client_for(settings.s3_endpoint_url, settings.s3_region)
    except Exception as exc:  # the first poll builds it again and reports what fails there
        log.warning("cannot build the S3 client for %r yet: %s", settings.s3_endpoint_url or "AWS", exc)
    tune_gc()
    asyncio.run(operate(wiring, liveness_endpoint=liveness))
    return 0
