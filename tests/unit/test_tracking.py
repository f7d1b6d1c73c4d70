"""The MLflow tracker (training_entrypoints.tracking) against an in-memory server double, the spec's tracking checks,
the head's credential references, and the tracking block as the operator judges it (sweep_contracts.tracking)."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from sweep_contracts import tracking as contract
from sweep_contracts.problems import SpecError
from sweep_contracts.spec_checks import parse_spec
from sweep_contracts.status_models import SweepStatus, TrackingStatus
from sweep_operator.reconcile.run_phase import tracking_changes
from sweep_operator.rendering import build_rayjob
from sweep_operator.status import progress_patch, read_status
from sweep_operator.validation import parse_sweep
from tests.support.factories import changed, cpu_sweep
from tests.support.waiting import wait_for
from training_entrypoints.tracking import MlflowTracker, TrackingCallback, install
from training_entrypoints.tracking_values import TrackingTarget, metric_values, param_values

TARGET = TrackingTarget("http://mlflow.test:5000", "team/sweep", "team", "sweep", "r1", "s3://bucket/p/team/sweep-r1")


@dataclass
class FakeMlflow:
    """MLflow's client as the tracker uses it: experiments, runs with tags/params/metrics. `down` makes every call
    fail as a refused connection; `hold` (an Event) makes every call wait for it, as a server that hangs."""

    down: bool = False
    hold: threading.Event | None = None
    experiments: dict[str, str] = field(default_factory=dict)
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    _ids: Any = field(default_factory=lambda: itertools.count(1))

    def _call(self, name: str) -> None:
        if self.hold is not None:
            self.hold.wait()
        if self.down:
            raise ConnectionError("Connection refused")
        self.calls.append(name)

    def get_experiment_by_name(self, name: str) -> Any:
        self._call("get_experiment_by_name")
        return SimpleNamespace(experiment_id=self.experiments[name]) if name in self.experiments else None

    def create_experiment(self, name: str, tags: Any = None) -> str:
        self._call("create_experiment")
        self.experiments[name] = str(next(self._ids))
        return self.experiments[name]

    def search_runs(self, experiment_ids: list[str], filter_string: str = "", max_results: int = 1000) -> list[Any]:
        self._call("search_runs")
        wanted = dict(
            (part.split("` = '")[0].removeprefix("tags.`"), part.split("` = '")[1].rstrip("'"))
            for part in filter_string.split(" and ")
        )
        return [
            self._view(run_id)
            for run_id, run in self.runs.items()
            if run["experiment"] in experiment_ids and all(run["tags"].get(k) == v for k, v in wanted.items())
        ][:max_results]

    def create_run(self, experiment_id: str, start_time: Any = None, tags: Any = None, run_name: Any = None) -> Any:
        self._call("create_run")
        run_id = f"run{next(self._ids)}"
        self.runs[run_id] = {
            "experiment": experiment_id, "tags": dict(tags or {}), "params": {}, "metrics": [], "status": "RUNNING",
            "name": run_name,
        }  # fmt: skip
        return self._view(run_id)

    def _view(self, run_id: str) -> Any:
        run = self.runs[run_id]
        return SimpleNamespace(
            info=SimpleNamespace(run_id=run_id, status=run["status"]),
            data=SimpleNamespace(params=dict(run["params"]), tags=dict(run["tags"])),
        )

    def get_run(self, run_id: str) -> Any:
        self._call("get_run")
        return self._view(run_id)

    def update_run(self, run_id: str, status: str | None = None, name: str | None = None) -> None:
        self._call("update_run")
        self.runs[run_id]["status"] = status or self.runs[run_id]["status"]

    def log_batch(self, run_id: str, metrics: Any = (), params: Any = (), tags: Any = ()) -> None:
        self._call("log_batch")
        run = self.runs[run_id]
        for p in params:
            assert p.key not in run["params"], f"param {p.key} logged twice (MLflow refuses a changed one)"
            run["params"][p.key] = p.value
        run["tags"].update({t.key: t.value for t in tags})
        run["metrics"] += [(m.key, m.step, m.value) for m in metrics]

    def set_terminated(self, run_id: str, status: str | None = None, end_time: Any = None) -> None:
        self._call("set_terminated")
        self.runs[run_id]["status"] = status

    def role(self, role: str) -> list[dict[str, Any]]:
        return [r for r in self.runs.values() if r["tags"].get(contract.TAG_ROLE) == role]


@pytest.fixture(autouse=True, scope="module")
def _mlflow_entities_imported() -> None:
    """The tracker's thread imports mlflow.entities at its first batch (seconds, once per process): done here, so
    the waits below measure the tracker, not the import."""
    import mlflow.entities

    assert mlflow.entities.Metric


def tracker(fake: FakeMlflow, **kwargs: Any) -> MlflowTracker:
    return MlflowTracker(TARGET, lambda: fake, retry_min_s=0.02, retry_max_s=0.05, **kwargs).start()


def report(t: MlflowTracker, trial: str, step: int, checkpoint: str | None = None) -> None:
    t.trial_result(trial, {"score": float(step), "training_iteration": step, "time_this_iter_s": 0.1}, checkpoint)


def test_the_tune_side_never_waits_for_a_server_that_hangs() -> None:
    hold = threading.Event()
    fake = FakeMlflow(hold=hold)
    t = tracker(fake)
    started = time.monotonic()
    t.trial_started("t1", {"lr": 0.1})
    for step in range(1, 501):
        report(t, "t1", step)
    t.trial_ended("t1", "FINISHED")
    assert time.monotonic() - started < 1.0
    assert t.fact() is None  # nothing said before the first call returns
    finished = time.monotonic()
    t.finish("FINISHED", timeout_s=0.2)  # the end of the run waits its own bound, not the server
    assert time.monotonic() - finished < 1.0
    hold.set()


def test_a_down_server_is_reported_and_the_buffered_metrics_arrive_when_it_is_back() -> None:
    fake = FakeMlflow(down=True)
    t = tracker(fake)
    t.trial_started("t1", {"lr": 0.1, "model": {"hidden": 64}})
    for step in (1, 2, 3):
        report(t, "t1", step, checkpoint=f"s3://bucket/p/train/t1/checkpoint_epoch-00000{step}")
    fact = wait_for(lambda: (f := t.fact()) and f["available"] is False and f, what="unavailable")
    assert "Connection refused" in fact["error"] and fact["pending"] >= 3 and fact["runId"] is None
    fake.down = False
    wait_for(lambda: (f := t.fact()) and f["available"] and f["pending"] == 0, timeout=5, what="caught up")
    (parent,) = fake.role(contract.ROLE_SWEEP)
    (trial,) = fake.role(contract.ROLE_TRIAL)
    caught_up = t.fact()
    assert caught_up is not None and trial["tags"]["mlflow.parentRunId"] == caught_up["runId"]
    assert parent["tags"][contract.TAG_RUN_ID] == "r1" and trial["tags"][contract.TAG_TRIAL_ID] == "t1"
    assert trial["params"] == {"lr": "0.1", "model/hidden": "64"}
    assert [(k, s) for k, s, _ in trial["metrics"]] == [("score", 1), ("score", 2), ("score", 3)]
    assert trial["tags"][contract.TAG_CHECKPOINT].endswith("checkpoint_epoch-000003")
    t.trial_ended("t1", "FINISHED")
    final = t.finish("FINISHED", timeout_s=5)
    assert final is not None and final["pending"] == 0 and final["error"] is None
    assert parent["status"] == "FINISHED" and trial["status"] == "FINISHED"


def test_past_its_bound_the_buffer_drops_the_oldest_points_and_counts_them() -> None:
    fake = FakeMlflow(down=True)
    t = tracker(fake, max_points=5)
    t.trial_started("t1", {})
    for step in range(1, 9):
        report(t, "t1", step)
    wait_for(lambda: (f := t.fact()) and f["dropped"] == 3, what="three points dropped")
    fake.down = False
    final = t.finish("FINISHED", timeout_s=5)
    assert final is not None and final["dropped"] == 3 and final["pending"] == 0
    (trial,) = fake.role(contract.ROLE_TRIAL)
    assert [s for _, s, _ in trial["metrics"]] == [4, 5, 6, 7, 8]  # the latest kept


def test_a_restarted_driver_continues_its_runs_found_by_tags_and_logs_each_param_once() -> None:
    fake = FakeMlflow()
    first = tracker(fake)
    first.trial_started("t1", {"lr": 0.1})
    report(first, "t1", 1)
    first.finish("KILLED", timeout_s=5)
    for run in fake.runs.values():
        run["name"] = "renamed in the UI"  # names are the users': the tags find the runs
    second = tracker(fake)
    second.trial_started("t1", {"lr": 0.1, "added": 1})
    report(second, "t1", 2)
    second.trial_started("t2", {"lr": 0.2})
    final = second.finish("FINISHED", timeout_s=5)
    assert final is not None and final["pending"] == 0
    (parent,) = fake.role(contract.ROLE_SWEEP)
    trials = {r["tags"][contract.TAG_TRIAL_ID]: r for r in fake.role(contract.ROLE_TRIAL)}
    assert sorted(trials) == ["t1", "t2"] and parent["status"] == "FINISHED"
    assert trials["t1"]["params"] == {"lr": "0.1", "added": "1"}
    assert [s for _, s, _ in trials["t1"]["metrics"]] == [1, 2]


def test_a_restored_callback_holds_no_tracker_and_install_keeps_only_this_attempts() -> None:
    import pickle

    fake = FakeMlflow()
    t = MlflowTracker(TARGET, lambda: fake)
    restored = pickle.loads(pickle.dumps(TrackingCallback(t)))
    assert restored.tracker is None
    restored.on_trial_start(0, [], SimpleNamespace(trial_id="t1", config={}))  # does nothing
    callbacks = install([restored, "progress"], t)
    assert callbacks[0] == "progress" and len(callbacks) == 2 and callbacks[1].tracker is t
    assert install([restored], None) == []


def test_metrics_are_the_loops_numbers_and_params_are_text() -> None:
    result = {
        "val_loss": 0.5, "acc": 1, "nested": {"f1": 0.2}, "flag": True, "name": "x", "nan": float("nan"),
        "bad key!": 1.0, "training_iteration": 3, "time_total_s": 2.0, "checkpoint_path": "s3://b/c", "done": False,
    }  # fmt: skip
    assert metric_values(result) == {"val_loss": 0.5, "acc": 1.0, "nested/f1": 0.2}
    assert param_values({"lr": 0.1, "layers": [1, 2], "opt": {"name": "adam"}}) == {
        "lr": "0.1", "layers": "[1, 2]", "opt/name": "adam",
    }  # fmt: skip


# ---------------------------------------------------------------------------------------- the spec and rendering

BASE = {"image": "img", "trainLoop": "m:f", "storage": {"uri": "s3://bucket/p"}}


@pytest.mark.parametrize(
    ("tracking", "path", "says"),
    [
        ({"mlflow": {"trackingUri": "ftp://m"}}, "spec.tracking.mlflow.trackingUri", "http(s)://host"),
        ({"mlflow": {"trackingUri": "http://m/?token=x"}}, "spec.tracking.mlflow.trackingUri", "no query"),
        ({"mlflow": {}}, "spec.tracking.mlflow.trackingUri", "required"),
        (
            {"mlflow": {"trackingUri": "http://m", "credentialsSecret": {"name": "c"}}},
            "spec.tracking.mlflow.credentialsSecret",
            "set tokenKey, or usernameKey and passwordKey",
        ),
        (
            {
                "mlflow": {
                    "trackingUri": "http://m",
                    "credentialsSecret": {"name": "c", "tokenKey": "t", "usernameKey": "u"},
                }
            },
            "spec.tracking.mlflow.credentialsSecret",
            "not both kinds",
        ),
        (
            {"mlflow": {"trackingUri": "http://m", "credentialsSecret": {"name": "c", "usernameKey": "u"}}},
            "spec.tracking.mlflow.credentialsSecret.passwordKey",
            "go together",
        ),
        ({"mlflow": {"trackingUri": "http://m", "token": "x"}}, "spec.tracking.mlflow.token", "unknown field"),
    ],
)
def test_tracking_spec_problems_name_the_field(tracking: dict[str, Any], path: str, says: str) -> None:
    with pytest.raises(SpecError) as raised:
        parse_spec({**BASE, "tracking": tracking})
    assert any(p.path == path and says in p.message for p in raised.value.problems), raised.value


def test_the_head_gets_references_to_the_secrets_keys_never_a_credential() -> None:
    secret = {"name": "mlflow-creds", "usernameKey": "user", "passwordKey": "pass"}
    doc = changed(
        cpu_sweep("t"), {"spec.tracking": {"mlflow": {"trackingUri": "https://m", "credentialsSecret": secret}}}
    )
    rayjob = build_rayjob(parse_sweep(doc), "abc")
    env = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in env if "valueFrom" in e}
    assert refs == {
        "MLFLOW_TRACKING_USERNAME": {"name": "mlflow-creds", "key": "user"},
        "MLFLOW_TRACKING_PASSWORD": {"name": "mlflow-creds", "key": "pass"},
    }
    assert all("value" not in e for e in env if e["name"].startswith("MLFLOW_"))
    plain = build_rayjob(parse_sweep(cpu_sweep("t")), "abc")
    assert "MLFLOW" not in str(plain)


# ---------------------------------------------------------------------------------------- the operator's reading


def tracked_spec(uri: str = "https://mlflow.example.com") -> Any:
    return parse_spec({**BASE, "tracking": {"mlflow": {"trackingUri": uri}}})


def test_the_status_links_to_the_parent_run_on_the_specs_server_never_the_documents() -> None:
    doc = {"tracking": {"backend": "mlflow", "experimentId": "7", "runId": "abc123", "available": True}}
    assert progress_patch(doc, tracked_spec())["tracking"]["url"] == (
        "https://mlflow.example.com/#/experiments/7/runs/abc123"
    )
    forged = {"tracking": {**doc["tracking"], "runId": "x/../../evil?"}}
    assert progress_patch(forged, tracked_spec())["tracking"]["url"] is None
    assert "tracking" not in progress_patch(doc, parse_spec(BASE))  # no tracking asked: nothing mirrored


def test_tracking_condition_warns_once_when_the_server_goes_and_says_when_it_is_back() -> None:
    spec = tracked_spec()
    down = {"available": False, "lastError": "ConnectionError: refused", "pending": 4, "dropped": 0}
    conditions, events = tracking_changes(SweepStatus(), down, spec)
    assert conditions[0][:3] == (contract.CONDITION, False, contract.REASON_UNAVAILABLE)
    assert [(e.type, e.reason) for e in events] == [("Warning", contract.REASON_UNAVAILABLE)]
    stored = {"type": contract.CONDITION, "status": "False", "reason": contract.REASON_UNAVAILABLE}
    held = read_status(
        {"conditions": [{**stored, "message": conditions[0][3], "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    )
    assert held.conditions, "a stored condition, as the API keeps it"
    assert tracking_changes(held, {**down, "pending": 9}, spec)[1] == []  # still down: said once
    modelled = tracking_changes(SweepStatus(), TrackingStatus.model_validate(down), spec)
    assert modelled == tracking_changes(SweepStatus(), down, spec) and modelled[1], "a model reads as its document"
    conditions, events = tracking_changes(held, {"available": True, "pending": 0, "dropped": 2}, spec)
    assert conditions[0][1] is True and "2 metric points were dropped" in conditions[0][3]
    assert [(e.type, e.reason) for e in events] == [("Normal", contract.REASON_CAUGHT_UP)]
    assert tracking_changes(SweepStatus(), None, spec) == ([], [])


def test_the_report_links_to_the_parent_run() -> None:
    from sweep_operator.cli.report_html import _tracking_link
    from sweep_operator.cli.report_records import RunRecords

    url = "https://mlflow.example.com/#/experiments/7/runs/abc123"
    assert f'href="{url}"' in _tracking_link(RunRecords(root="s3://b/p", sweep={"status": {"tracking": {"url": url}}}))
    assert _tracking_link(RunRecords(root="s3://b/p", sweep={"status": {"tracking": {"url": "javascript:x"}}})) == ""
    assert _tracking_link(RunRecords(root="s3://b/p")) == ""
