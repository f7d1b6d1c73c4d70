"""The namespace's budgets as admission asks them, and the I/O a resume step is lent (resume.ResumePorts). They read
and change state (the ledger, the API, the caches), so they sit beside reads, above the decisions."""

from __future__ import annotations

from typing import Any

from ..ledger import AdmissionLedger
from ..policy import Admit
from ..rendering import RenderContext
from ..settings import Settings
from . import admission, kueue, resume
from .actions import Decision
from .facts import ObjectRef, SweepFacts, meta_of
from .reads import Reads
from .status_writer import EventSink
from .usage import NamespaceBudget, decide_gpu_hour_answer


class Budgets:
    """Kueue's rules (Kueue mode) or the namespace's GPU ledger, then the namespace's GPU-hour window."""

    def __init__(self, reads: Reads, ledger: AdmissionLedger, context: RenderContext) -> None:
        self.reads, self.ledger, self.context = reads, ledger, context

    @property
    def settings(self) -> Settings:
        return self.reads.settings  # the controller's (tests change them in flight)

    def gpu_hour_budget(self, namespace: str) -> NamespaceBudget | None:
        hours = self.settings.namespace_gpu_hour_budget(namespace)
        return NamespaceBudget(hours, self.settings.gpu_hours_window_seconds) if hours else None

    def in_use(self, namespace: str) -> str:
        """`<GPUs admitted>/<maxGpusPerNamespace>` in the namespace (the -o wide NS-BUDGET column)."""
        return f"{self.ledger.in_use(namespace).gpus}/{self.settings.limits.max_gpus_per_namespace}"

    def ask(self, facts: SweepFacts, spec: Any) -> Any:
        """The GPU caps' answer for the sweep run with `spec`; the ledger's records an admission."""
        ref = facts.ref
        if kueue.our_queue_steps_aside(self.context.queue_name(spec, ref.namespace)):
            return kueue.decide_kueue_admission(spec, self.settings.limits)  # Kueue's quota, not our ledger
        created = meta_of(facts.body).get("creationTimestamp") or ""
        return self.ledger.decide(ref.namespace, ref.name, created, spec, self.settings.limits)

    def gpu_hours(self, facts: SweepFacts, budget: Any) -> Decision | None:
        """The GPU-hour check beside the GPU caps: None admits; else the Invalid or Queued decision (docs/budgets.md)."""
        ref = facts.ref
        namespace = self.gpu_hour_budget(ref.namespace)
        # Only a namespace window needs the others' hours: reading them parses every cached sweep of the namespace,
        # which each admission of a burst would otherwise pay.
        sweeps = self.reads.namespace_usage(ref.namespace, facts.now) if namespace is not None else []
        answer = decide_gpu_hour_answer(facts, budget, self.settings.limits, namespace, sweeps)
        if answer is None:
            return None
        self.ledger.release(ref.namespace, ref.name)  # the GPU caps admitted it; the hours do not
        return admission.decide_budget(facts, answer, self.in_use(ref.namespace), self.context)


def resume_ports(facts: SweepFacts, budgets: Budgets, emit: EventSink) -> resume.ResumePorts:
    """The I/O a resume step may do for this sweep: verify afresh, read the run's records, ask the namespace's
    budgets as an admission does, create (or adopt) the attempt's RayJob, post Events on the sweep."""
    reads, ref = budgets.reads, facts.ref

    def admit(sweep: Any) -> str | None:
        budget = budgets.ask(facts, sweep.spec)
        return resume.budget_refusal(budget, budgets.gpu_hours(facts, budget) if isinstance(budget, Admit) else None)

    def create(rayjob: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        made, created = reads.kube.create_rayjob(rayjob)
        reads.cache.observe_rayjob(made)
        return made, created

    return resume.ResumePorts(
        verify=lambda target: reads.verify(target, pooled=False),
        documents=reads.run_documents,
        rayjob=lambda name: reads.rayjob(ObjectRef(ref.namespace, name)),
        admit=admit,
        create=create,
        emit=lambda type_, reason, message: emit(facts.body, type_, reason, message),
    )
