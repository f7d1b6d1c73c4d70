"""The reads that fill the facts: the run's records in S3, the checkpoint verification, a stuck cluster's pods and
Events, the objects a deletion belongs to. No decisions."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from sweep_contracts import constants, s3_layout
from sweep_contracts.api import DEFAULT_WARN_AFTER_REPORTS
from sweep_contracts.checkpoint_coverage import checkpoint_coverage
from sweep_contracts.problems import SpecError
from sweep_contracts.runspec import RunSpec
from sweep_contracts.runtime_env import run_spec_intact, run_spec_of

from ..bounded_reads import DeadlineReads, UnchangedDocuments
from ..diagnosis import diagnose_startup
from ..gpu_time import still_holding
from ..kube import KubeApi
from ..memory_budget import RUN_RECORD_BOUNDS, DocumentBounds, DocumentTooLarge, MemoryBudget, load_json
from ..metrics import OperatorMetrics
from ..policy import Demand
from ..rendering import rayjob_name, run_id_for
from ..settings import Settings
from ..status import RayJobFacts, is_terminal, progress_patch
from ..verification.listing import read_document
from ..workqueue import FairPool
from .actions import Diagnose
from .cache import Cache, run_ref
from .drift import RunBounds, bounds_of
from .facts import ObjectRef, SweepFacts, meta_of, status_of
from .guard import GuardTarget, StorageDefaults, error_code, run_target, sweep_name_of
from .pod_snapshots import PodSnapshots
from .run_phase import progress_wanted, result_wanted
from .verdicts import status_target, target_of
from .workloads import kueue_managed

log = logging.getLogger(__name__)

S3ClientFactory = Callable[[str, str], Any]  # (endpoint_url, region) -> boto3-like S3 client
Verifier = Callable[..., Any]


def delegated(part: str, name: str) -> Any:
    """A property of the controller that is `name` of its `part` (callers swap the S3 factory or the verifier)."""
    return property(
        lambda self: getattr(getattr(self, part), name), lambda self, value: setattr(getattr(self, part), name, value)
    )


class Reads:
    def __init__(
        self,
        settings: Settings,
        kube: KubeApi,
        cache: Cache,
        s3_client_for: S3ClientFactory,
        verifier: Verifier,
        metrics: OperatorMetrics,
        verification_pool: Any = None,
        emit: Callable[[Mapping[str, Any], str, str, str], None] | None = None,
    ) -> None:
        self.settings, self.kube, self.cache, self.s3_client_for = settings, kube, cache, s3_client_for
        self.emit = emit  # the controller's Events (a rewritten run spec is said on the RayJob)
        self.verifier, self.metrics = verifier, metrics
        # A concurrent.futures executor the guard's verifications run on (bounded: handlers.build_controller).
        self.verification_pool = verification_pool
        # GPU-hours' pods: a namespace's listing shared by its sweeps, a third of a poll old at most.
        self._tampered: set[str] = set()  # RayJobs whose rewritten run spec was reported
        self._oversized: dict[tuple[str, str], str] = {}  # (object uid, document) said to be over its bounds
        # (verifications, document readers) that may run at once: the controller sets its pools' sizes.
        self.concurrency = (1, 1)
        self.pod_snapshots = PodSnapshots(kube.list_pods, lambda: self.settings.status_poll_seconds / 3)
        # Status and result documents: one deadline per read, a few abandoned reads per namespace at most. A read
        # abandoned once its body began is cut off at once; one still waiting for headers holds no document.
        self.deadline_reads = DeadlineReads()
        # The progress documents read each poll, kept with their ETags: an unchanged one is not downloaded again.
        self.unchanged = UnchangedDocuments()

    @property
    def budget(self) -> MemoryBudget:
        """The memory budget of this operator: its pod's limit (settings) shared by what may run at once."""
        verifications, readers = self.concurrency
        return MemoryBudget.from_limit(self.settings.memory_limit_bytes, verifications=verifications, readers=readers)

    @property
    def defaults(self) -> StorageDefaults:
        return StorageDefaults(self.settings.s3_endpoint_url, self.settings.s3_region)

    # ---- a reconcile pass's facts (the informer-style copies first)
    def sweep(self, ref: ObjectRef, *, reread: bool = False) -> dict[str, Any] | None:
        """The newest copy known, else (or with `reread`) a read from the API, remembered."""
        known = None if reread else self.cache.sweep(ref)
        if known is None:
            known = self.kube.get_sweep(ref.namespace, ref.name)
            if known is not None:
                self.cache.observe_sweep(known)
        return known

    def rayjob(self, ref: ObjectRef) -> dict[str, Any] | None:
        """The watched copy when there is one; a GET otherwise (just created, or before the watch caught up)."""
        return self.cache.rayjob(ref) or self.kube.get_rayjob(ref.namespace, ref.name)

    def sweep_facts(self, body: Mapping[str, Any], now: float) -> SweepFacts:
        sweep, problems = None, tuple[str, ...]()
        try:
            sweep = self.cache.parse(body)
        except SpecError as exc:
            problems = tuple(str(p) for p in exc.problems)
        retry_at = self.cache.create_retry_at(ObjectRef.of(body))
        return SweepFacts(
            body,
            now,
            self.settings.limits,
            sweep,
            problems,
            create_retry_at=retry_at,
            read_status=self.cache.status(body),
        )

    def run_facts(self, facts: SweepFacts) -> SweepFacts:
        """An admitted sweep's facts: its RayJob, and the run's progress or result when the decision reads them."""
        if is_terminal(facts.status.phase):
            name = facts.status.ray_job_name or ""
            ended = self.cache.rayjob(ObjectRef(facts.ref.namespace, name)) if name else None
            return replace(facts, ended_rayjob=ended) if ended is not None else facts
        rayjob = self.rayjob(ObjectRef(facts.ref.namespace, facts.status.ray_job_name or ""))
        facts = replace(facts, rayjob=RayJobFacts.from_object(rayjob) if rayjob else None, rayjob_body=rayjob,
                        run_spec=self.run_spec(rayjob) if rayjob else None)  # fmt: skip
        if progress_wanted(facts) and self.cache.poll_due(facts.ref, time.monotonic(), take=True):
            facts = self.with_progress(facts)
        if result_wanted(facts):
            facts = replace(facts, stopped_at_deadline=self.stopped_at_deadline(facts.body))
        return facts

    def run_spec(self, rayjob: Mapping[str, Any]) -> RunSpec | None:
        """The run spec the RayJob carries while it is the one the operator wrote (its recorded digest); else None,
        so the sweep's own spec is enforced: a rewritten runtimeEnvYAML (a week-long graceful window, no budget)
        must not move the run's limits."""
        run_spec = run_spec_of(rayjob)
        if run_spec is None or run_spec_intact(rayjob, run_spec):
            return run_spec
        uid = meta_of(rayjob).get("uid") or ""
        if uid not in self._tampered:  # said once per RayJob (the set is bounded: forgotten, it is said again)
            if len(self._tampered) >= 4096:
                self._tampered.clear()
            self._tampered.add(uid)
            message = (
                f"the run spec in spec.runtimeEnvYAML is not the one the operator wrote (its digest is recorded in "
                f"{constants.ANNOTATION_RUN_SPEC}); the sweep's own spec (deadlines, GPU-hour budget) is enforced"
            )
            log.warning("RayJob %s/%s: %s", meta_of(rayjob).get("namespace"), meta_of(rayjob).get("name"), message)
            if self.emit is not None:
                self.emit(rayjob, "Warning", "RunSpecRewritten", message)
        return None

    def namespace_sweeps(self, namespace: str) -> list[dict[str, Any]]:
        """The sweeps of `namespace`, read fresh (a new GPU-hour ledger is seeded from their own records)."""
        return self.kube.list_sweeps(namespace)

    def run_bounds(self, body: Mapping[str, Any], kind: str) -> RunBounds | None:
        """What a RayJob or RayCluster of ours may hold: the bounds annotation the operator wrote on it (or on the
        cluster's RayJob), else the cap its sweep's status recorded; never the run spec in runtimeEnvYAML, which
        anyone who may edit the RayJob can rewrite."""
        bounds = bounds_of(body)
        if bounds is None and kind == constants.RAYCLUSTER_KIND:
            bounds = bounds_of(self.rayjob_of_cluster(body))
        if bounds is None:
            run = run_ref(body)
            cap = self.cache.cap(run)
            if cap is None:
                replicas = status_of(self.sweep(run.sweep) or {}).replicas
                cap = replicas.cap if replicas is not None else None
            if cap is not None:
                self.cache.remember_cap(run, cap)
                bounds = RunBounds(cap)
        return bounds

    def end_of_run(self, body: Mapping[str, Any]) -> tuple[Any, dict[str, Any] | None, dict[str, Any] | None] | None:
        """(verification, status.json, result.json) of an ended run, verified inline: a reconcile worker queued
        behind the guards' verifications would stall deadlines (guard matrix). None: no run root is known."""
        target = run_target(body, self.defaults)
        if target is None:
            return None
        layout = s3_layout.RunLayout(target.run_root)
        result = self.read_json(target, layout.result_path, about=body)
        progress = self.read_json(target, layout.status_path, about=body)
        return self.verify(target, pooled=False), progress, result

    # ---- the run's records in S3
    def read_json(
        self,
        target: GuardTarget,
        location: str,
        *,
        about: Mapping[str, Any] | None = None,
        conditional: bool = False,
    ) -> dict[str, Any] | None:
        """A JSON document of the run, None when absent or unreadable (progress is best effort; the guard reads
        with `run_documents`, which tells the two apart). One over the memory budget's bounds is neither read past
        them nor parsed: a Warning Event on `about` (the sweep) says so, once while it stays over. `conditional`:
        asked with the ETag of the body last read, and that body parsed again when S3 answers Not Modified."""
        bounds = self.budget.run_records
        try:
            client = self.s3_client_for(target.endpoint_url, target.region)
            data = read_document_body(
                client,
                location,
                bounds,
                self.deadline_reads,
                run_namespace(target.run_root),
                unchanged=self.unchanged if conditional else None,
                endpoint=target.endpoint_url or "",
            )
            doc = load_json(data, location, bounds)
        except DocumentTooLarge as exc:
            self._say_oversized(about, location, str(exc))
            return None
        except Exception as exc:
            log.debug("cannot read %s: %s", location, exc)
            return None
        if about is not None:
            self._oversized.pop((meta_of(about).get("uid") or "", location), None)
        return doc if isinstance(doc, dict) else None

    def _say_oversized(self, about: Mapping[str, Any] | None, location: str, why: str) -> None:
        message = f"{why}; the operator skips it until it is back within its bounds (the memory budget, docs/guard.md)"
        key = (meta_of(about or {}).get("uid") or "", location)
        if self._oversized.get(key) == message:
            return
        log.warning("%s", message)
        if len(self._oversized) >= 4096:  # bounded: a forgotten one is said again
            self._oversized.clear()
        self._oversized[key] = message
        if about is not None and self.emit is not None:
            self.emit(about, "Warning", "RunDocumentTooLarge", message)

    def with_progress(self, facts: SweepFacts) -> SweepFacts:
        """The facts with the run's `_sweep/status.json` read: its status fields and its checkpoint coverage. The
        next read waits longer while the document does not change (`Cache.polled`)."""
        doc, changed = self.progress_document(facts)
        self.cache.polled(facts.ref, changed=changed)
        if not doc:
            return replace(facts, progress={})
        spec = facts.admitted_spec
        warn_after = spec.checkpoints.warn_after_reports if spec is not None else DEFAULT_WARN_AFTER_REPORTS
        return replace(facts, progress=progress_patch(doc, spec), coverage=checkpoint_coverage(doc, warn_after))

    def progress_document(self, facts: SweepFacts) -> tuple[dict[str, Any] | None, bool]:
        """The run's `_sweep/status.json`, read from the run's recorded storage (status.guard) as the guard reads
        it (today's spec only for runs admitted before it was recorded), and whether it changed since the last read
        (its ETag; absent both times is no change)."""
        sweep = facts.sweep
        assert sweep is not None
        target = status_target(facts.body, facts.status)
        if target is None:
            storage = sweep.spec.storage
            root = s3_layout.run_root(storage.uri, sweep.namespace, sweep.name, facts.status.run_id or "")
            target = GuardTarget(
                root, storage.endpoint_url or self.settings.s3_endpoint_url, storage.region or self.settings.s3_region
            )
        location = s3_layout.RunLayout(target.run_root).status_path
        key = (target.endpoint_url or "", location)
        before = self.unchanged.get(key)
        doc = self.read_json(target, location, about=facts.body, conditional=True)
        after = self.unchanged.get(key)
        changed = (before[0] if before else None) != (after[0] if after else None)
        # An endpoint that sends no ETag keeps nothing: every read is a change there (never a longer poll).
        return doc, changed or (doc is not None and after is None)

    def stopped_at_deadline(self, body: Mapping[str, Any]) -> bool:
        """Whether the run's `_sweep/result.json` says Tune's budget ended it (`deadlineReached`)."""
        target = run_target(body, self.defaults)
        if target is None:
            return False
        result = self.read_json(target, s3_layout.RunLayout(target.run_root).result_path, about=body)
        return bool(result and result.get("deadlineReached") is True)

    def run_documents(self, target: GuardTarget) -> tuple[dict[str, Any] | None, dict[str, Any] | None, bool]:
        """The run's `_sweep/status.json` and `result.json` (None when absent) and whether both could be read."""
        client = self.s3_client_for(target.endpoint_url, target.region)
        return run_documents(client, target, self.budget.run_records, self.deadline_reads)

    def verify(self, target: GuardTarget, *, pooled: bool = True, flow: str | None = None) -> Any:
        """Verify a run root, always afresh: a result cached even for seconds could release a deletion after an
        object vanished (one listing pass is cheap next to the data it protects)."""
        started = time.monotonic()
        args = (self.s3_client_for(target.endpoint_url, target.region), target.run_root)
        options = {
            "concurrency": self.settings.verify_concurrency,
            # Targets recorded before a lower cap was set are held to it too.
            "timeout_seconds": min(target.timeout_seconds, self.settings.limits.max_verification_timeout_seconds),
            "min_retention_days": self.settings.min_retention_days,
            "budget": self.budget.verification,
        }
        if pooled and self.verification_pool is not None:
            pool = self.verification_pool
            submit = partial(pool.submit_to, flow) if isinstance(pool, FairPool) else pool.submit
            result = submit(self.verifier, *args, **options).result()
        else:
            result = self.verifier(*args, **options)
        self.metrics.verification_finished(target.run_root, time.monotonic() - started, result.verified)
        return result

    # ---- Kubernetes
    def diagnosis(self, namespace: str, wanted: Diagnose) -> str:
        try:
            pods = (
                self.kube.list_pods(namespace, f"{constants.RAY_LABEL_CLUSTER}={wanted.cluster_name}")
                if wanted.cluster_name
                else []
            )
            events = self.kube.list_events(namespace)
        except Exception as exc:  # diagnosis must never block the failure it explains
            return f"(diagnosis unavailable: {exc})"
        names = {(p.get("metadata") or {}).get("name") for p in pods} | {wanted.cluster_name, wanted.rayjob_name}
        relevant = [e for e in events if ((e.get("involvedObject") or e.get("regarding") or {}).get("name")) in names]
        return diagnose_startup(
            pods,
            relevant,
            cluster_name=wanted.cluster_name,
            worker_cap=wanted.worker_cap,
            workers_wanted=wanted.workers_wanted,
        )

    def cluster_pods(self, ref: ObjectRef, clusters: set[str]) -> list[Mapping[str, Any]] | None:
        """The pods of the sweep's RayClusters, for GPU-hours (`PodSnapshots`: shared, read-only); None when they
        cannot be read (the next pass measures; nothing is lost while the pods' records stand)."""
        try:
            return self.pod_snapshots.pods(ref.namespace, clusters)
        except Exception as exc:
            log.warning("sweep %s: cannot read its pods for GPU-hours: %s", ref, exc)
            return None

    def pods_still_holding(self, namespace: str, wanted: Sequence[tuple[str, str]]) -> list[dict[str, Any]] | None:
        """The pods of `wanted` ((name, uid): open in the record, missing from the listing) that still exist, read
        one by one; None when one cannot be read (the pass measures nothing rather than close a live pod)."""
        try:
            pods = [(self.kube.get_pod(namespace, name), uid) for name, uid in wanted]
        except Exception as exc:
            log.warning("cannot read the pods %s in %s for GPU-hours: %s", [n for n, _ in wanted], namespace, exc)
            return None
        return [pod for pod, uid in pods if pod is not None and still_holding(pod, uid)]

    def rayjob_of_sweep(self, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """The sweep's RayJob, read fresh: by status.rayJobName, else by the name its uid implies (an operator
        that crashed between the create and the status write left exactly that one). Never a foreign one."""
        meta, status = meta_of(body), status_of(body)
        name = status.ray_job_name
        if not name and meta.get("uid"):
            name = rayjob_name(meta["name"], run_id_for(meta["uid"]))
        if not name:
            return None
        rayjob = self.kube.get_rayjob(meta.get("namespace") or "default", name)
        run_id = sweep_run_id(body)
        # By what only the operator writes (the run in its guard record, the run-id label), never ownerReferences,
        # which anyone who may edit the RayJob may point elsewhere (a detached run) or leave empty (a decoy).
        if rayjob is None or not run_id or run_id_of(rayjob) != run_id:
            return None
        return rayjob

    def rayjob_of_cluster(self, cluster: Mapping[str, Any]) -> dict[str, Any] | None:
        """The RayJob the cluster was made for: named by its RayJob ownerReference (else KubeRay's label), and of
        the same run as the cluster's own guard record (KubeRay copies it from the RayJob; only the operator writes
        one): an ownerReference re-pointed at another RayJob names nothing."""
        meta = meta_of(cluster)
        namespace = meta.get("namespace") or "default"
        name = next(
            (o.get("name", "") for o in meta.get("ownerReferences") or [] if o.get("kind") == constants.RAYJOB_KIND),
            (meta.get("labels") or {}).get(constants.RAY_LABEL_ORIGINATED_FROM_CR_NAME),
        )
        rayjob = self.kube.get_rayjob(namespace, name) if name else None
        run_id = run_id_of(cluster)
        return rayjob if rayjob is not None and run_id and run_id_of(rayjob) == run_id else None

    def unfinished_runs(self, namespace: str) -> list[tuple[str, Any]]:
        """(sweep, demand) of each of our RayJobs in `namespace` that has not finished (the ledger's rebuild)."""
        runs = []
        recorded = {  # RayJobs rendered before the bounds annotation: what their sweep's admission recorded
            meta_of(b).get("name", ""): Demand(int(r.workers or 0), int(r.gpus or 0))
            for b in self.cache.sweeps()
            if meta_of(b).get("namespace") == namespace and (r := self.cache.status(b).replicas) is not None
        }
        for rayjob in self.kube.list_rayjobs(namespace, constants.LABEL_SWEEP):
            facts, bounds, target = RayJobFacts.from_object(rayjob), bounds_of(rayjob), target_of(rayjob)
            if facts.finished or facts.deleting or target is None or kueue_managed(rayjob):
                continue  # a Kueue RayJob is held by Kueue's quota, not by the namespace budget
            # The operator's own records (bounds, guard annotation, the sweep's status), never the run spec in
            # runtimeEnvYAML, which anyone who may edit the RayJob can rewrite.
            if bounds is not None:
                runs.append((target.sweep, Demand(bounds.workers, bounds.gpus)))
            elif target.sweep in recorded:
                runs.append((target.sweep, recorded[target.sweep]))
        return runs

    def sweeps_of_workload(self, workload: Mapping[str, Any]) -> list[ObjectRef]:
        """The sweep (by its RayJob's label) of the RayJob that controls a Kueue Workload, read fresh."""
        namespace, sweeps = meta_of(workload).get("namespace") or "default", []
        for owner in meta_of(workload).get("ownerReferences") or []:
            if owner.get("kind") == constants.RAYJOB_KIND and owner.get("controller"):
                rayjob = self.kube.get_rayjob(namespace, owner.get("name", ""))
                sweep = ((meta_of(rayjob or {}).get("labels")) or {}).get(constants.LABEL_SWEEP)
                if sweep:
                    sweeps.append(ObjectRef(namespace, sweep))
        return sweeps

    def sweep_of(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        """The sweep a RayJob or RayCluster belongs to, read fresh: the sweep of its name whose run is the object's
        (`run_id_of`). A sweep deleted and created again under that name is another run (R16): an older run's held
        objects neither write their verification into its status nor take its escape hatch."""
        name = sweep_name_of(obj)
        sweep = self.kube.get_sweep(meta_of(obj).get("namespace") or "default", name) if name else None
        run = run_id_of(obj)
        return sweep if sweep is not None and (not run or run == sweep_run_id(sweep)) else None


def run_documents(
    client: Any,
    target: GuardTarget,
    bounds: DocumentBounds = RUN_RECORD_BOUNDS,
    deadline_reads: DeadlineReads | None = None,
) -> tuple[dict[str, Any] | None, dict[str, Any] | None, bool]:
    """The run's `_sweep/status.json` and `result.json` through `client` (None when absent) and whether both could
    be read: the guard's reads and `sweepctl release` (with the caller's credentials) share it. One over `bounds`,
    or not read within `deadline_reads`' deadline, is unreadable (neither read past them nor parsed): the guard
    holds."""
    layout = s3_layout.RunLayout(target.run_root)
    docs: list[Any] = []
    readable = True
    for location in (layout.status_path, layout.result_path):
        uri = s3_layout.S3Uri.parse(location)
        try:
            data = (deadline_reads or _UNBOUNDED).read(
                run_namespace(target.run_root),
                partial(client.get_object, Bucket=uri.bucket, Key=uri.key),
                partial(read_document, key=uri.key, limit=bounds.max_bytes),
                location,
            )
            docs.append(load_json(data, uri.key, bounds))
        except Exception as exc:  # absent is an answer; anything else means "cannot tell"
            docs.append(None)
            if error_code(exc) not in ("NoSuchKey", "404", "KeyError"):
                readable = False
    return (
        docs[0] if isinstance(docs[0], dict) else None,
        docs[1] if isinstance(docs[1], dict) else None,
        readable,
    )


def read_document_body(
    client: Any,
    location: str,
    bounds: DocumentBounds,
    deadline_reads: DeadlineReads,
    flow: str,
    *,
    unchanged: UnchangedDocuments | None = None,
    endpoint: str = "",
) -> bytes:
    """The body of the document at `location`, read within `deadline_reads`' deadline and `bounds`. With
    `unchanged`: asked with the ETag of the body last read there (`If-None-Match`), and that body answered when S3
    says Not Modified; any other failure forgets it."""
    uri, key = s3_layout.S3Uri.parse(location), (endpoint, location)
    known = unchanged.get(key) if unchanged is not None else None
    etags: list[str] = []

    def get() -> Any:
        if known is None:
            return client.get_object(Bucket=uri.bucket, Key=uri.key)
        return client.get_object(Bucket=uri.bucket, Key=uri.key, IfNoneMatch=known[0])

    def read_body(response: Mapping[str, Any]) -> bytes:
        etags.append(str(response.get("ETag") or ""))
        return read_document(response, location, bounds.max_bytes)

    try:
        data = deadline_reads.read(flow, get, read_body, location)
    except Exception as exc:
        if known is not None and error_code(exc) in NOT_MODIFIED:
            return known[1]
        if unchanged is not None:
            unchanged.forget(key)
        raise
    if unchanged is not None:
        unchanged.keep(key, etags[0] if etags else None, data)
    return data


# botocore's code for S3's 304 answer to a conditional GET (no body; the object did not change).
NOT_MODIFIED = frozenset({"304", "NotModified"})


class _Unbounded:
    """Reads in the caller's thread with botocore's own timeouts only (the CLI, run by the user it waits for)."""

    @staticmethod
    def read(flow: Any, get: Callable[[], Any], read_body: Callable[[Any], bytes], what: str) -> bytes:
        return read_body(get())


_UNBOUNDED = _Unbounded()


def run_namespace(run_root: str) -> str:
    """The namespace a run root is under (`<storage.uri>/<namespace>/<sweep>-<runId>`, which the operator renders
    and records in the protected guard record): the flow its reads count against."""
    parts = run_root.rstrip("/").split("/")
    return parts[-2] if len(parts) >= 2 else ""


def sweep_run_id(sweep: Mapping[str, Any]) -> str:
    """The sweep's run (every attempt's): status.runId, else the id its uid implies (only the operator writes the
    status; the uid is the API server's)."""
    uid = meta_of(sweep).get("uid")
    return str(status_of(sweep).run_id or (run_id_for(uid) if uid else ""))


def run_id_of(obj: Mapping[str, Any]) -> str:
    """The run an object of ours belongs to, from what only the operator writes: its guard record's run, else the
    run-id label (both protected by the chart's policy); "" when neither says."""
    target = GuardTarget.from_annotation((meta_of(obj).get("annotations") or {}).get(constants.ANNOTATION_GUARD))
    if target is not None and target.run_id:
        return target.run_id
    return str((meta_of(obj).get("labels") or {}).get(constants.LABEL_RUN_ID) or "")
