"""The namespace GPU ledger (admission_ledger.AdmissionLedger) keeps its in-use demand as a running total: admissions, a
repeated admission, releases and a rebuild from the API leave it equal to the sum of what is admitted."""

from __future__ import annotations

from sweep_operator.admission_ledger import AdmissionLedger
from sweep_operator.policy import Admit, Demand, Queue
from sweep_operator.settings import OperatorLimits
from sweep_operator.validation import parse_sweep
from tests.support.factories import gpu_sweep


def _summed(ledger: AdmissionLedger, namespace: str) -> Demand:
    return sum(ledger.admitted[namespace].values(), Demand())


def test_the_running_total_follows_admissions_and_releases() -> None:
    running = {**gpu_sweep("old", "ml"), "status": {"runId": "abc123", "phase": "Running"}}
    ledger = AdmissionLedger(lambda namespace: [running], lambda namespace: [("orphan", Demand(1, 1))])
    limits = OperatorLimits(max_gpus_per_namespace=12)
    spec = parse_sweep(gpu_sweep("a", "ml")).spec  # 4 GPUs each
    assert isinstance(ledger.decide("ml", "a", "2026-12-05T00:00:01Z", spec, limits), Admit)
    assert ledger.in_use("ml") == _summed(ledger, "ml") == Demand(9, 9)  # old 4 + orphan 1 + a 4
    assert isinstance(ledger.decide("ml", "a", "2026-12-05T00:00:01Z", spec, limits), Admit)  # asked again
    assert ledger.in_use("ml") == _summed(ledger, "ml")
    assert isinstance(ledger.decide("ml", "b", "2026-12-05T00:00:02Z", spec, limits), Queue), "9 + 4 > 12"
    ledger.release("ml", "old")
    ledger.release("ml", "never-admitted")
    assert ledger.in_use("ml") == _summed(ledger, "ml") == Demand(5, 5)
    assert isinstance(ledger.decide("ml", "b", "2026-12-05T00:00:02Z", spec, limits), Admit)
    for name in ("a", "b", "orphan"):
        ledger.release("ml", name)
    assert ledger.in_use("ml") == Demand() and ledger.in_use("other") == Demand()
