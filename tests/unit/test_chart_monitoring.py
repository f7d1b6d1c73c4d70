"""The chart's Grafana dashboard and PrometheusRule: rendered behind values, every query names metrics the operator
exports (metrics.py's registry), and the alerts pass promtool's rule check and fire in promtool's rule tests."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from sweep_operator.metrics import OperatorMetrics
from tests.unit.test_chart import KUBE_VERSION, NAMESPACE, RELEASE, _chart, of_kind, one, render_values

MONITORING = {
    "monitoring": {
        "dashboard": {"enabled": True},
        "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}},
    }
}
JOB = f"{RELEASE}-trainingsweep-operator-metrics"  # the metrics Service: a ServiceMonitor's job label
# Names in PromQL that are not metrics: functions, aggregations, keywords, Grafana's variables.
PROMQL_WORDS = {
    "sum",
    "max",
    "min",
    "avg",
    "count",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "rate",
    "increase",
    "irate",
    "time",
    "histogram_quantile",
    "absent",
    "bool",
    "offset",
    "le",
}
# Metrics Prometheus itself makes for every scrape target (not the operator's).
PROMETHEUS_BUILTINS = {"up"}


@functools.cache
def monitoring_docs() -> tuple[dict[str, Any], ...]:
    return tuple(render_values(MONITORING))


def dashboard() -> dict[str, Any]:
    (configmap,) = [
        d for d in of_kind(list(monitoring_docs()), "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")
    ]
    (text,) = configmap["data"].values()
    return json.loads(text)


def rule_spec() -> dict[str, Any]:
    return one(list(monitoring_docs()), "PrometheusRule")["spec"]


def alerts() -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for group in rule_spec()["groups"] for r in group["rules"]}


def metric_names_in(expr: str) -> set[str]:
    """Metric names a PromQL expression selects: label matchers, grouping label lists, strings, durations and
    Grafana variables and label_values' label removed; what remains and is not a function or keyword is a metric name."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"label_values\(\s*([^,)]+),[^)]*\)", r"\1", expr)  # Grafana's label_values(metric, label)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\$\w+", "", expr)
    names = set(re.findall(r"(?<![\w.:])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(?!\s*\()", expr))
    return {n for n in names if n not in PROMQL_WORDS and not re.fullmatch(r"\d+\w*", n)}


def dashboard_queries() -> list[str]:
    board = dashboard()
    queries = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    queries += [v["query"]["query"] for v in board["templating"]["list"] if isinstance(v.get("query"), dict)]
    return queries


def test_monitoring_is_off_by_default() -> None:
    docs = render_values({})
    assert not of_kind(docs, "PrometheusRule")
    assert not [c for c in of_kind(docs, "ConfigMap") if c["metadata"]["name"].endswith("-dashboard")]


def test_the_chart_lints_clean_with_monitoring_on() -> None:
    import helm_python as helm

    from tests.unit.test_chart import CHART

    report = helm.lint(CHART, MONITORING, strict=True, namespace=NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems and not report["errors"], problems or report["errors"]


def test_the_dashboard_configmap_carries_the_sidecar_label_and_valid_json() -> None:
    (configmap,) = [
        d for d in of_kind(list(monitoring_docs()), "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")
    ]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["namespace"] == NAMESPACE
    kubernetes_validate.validate(configmap, KUBE_VERSION, strict=True)
    board = dashboard()
    assert board["uid"] == "trainingsweep-operator"
    assert {v["name"] for v in board["templating"]["list"]} == {"datasource", "job", "namespace"}
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))


def test_the_dashboard_namespace_and_labels_follow_values() -> None:
    docs = render_values(
        {
            "monitoring": {
                "dashboard": {
                    "enabled": True,
                    "namespace": "monitoring",
                    "labels": {"grafana_dashboard": "1", "team": "ml"},
                    "annotations": {"grafana_folder": "ML platform"},
                }
            }
        }
    )
    (configmap,) = [d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]
    assert configmap["metadata"]["namespace"] == "monitoring"
    assert configmap["metadata"]["labels"]["team"] == "ml"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "ML platform"}


def test_every_dashboard_query_names_only_metrics_the_operator_exports() -> None:
    exported = OperatorMetrics().metric_names()
    used: set[str] = set()
    for query in dashboard_queries():
        names = metric_names_in(query)
        assert names, f"no metric found in {query!r}"
        unknown = names - exported - PROMETHEUS_BUILTINS
        assert not unknown, f"{query!r} names metrics the operator does not export: {sorted(unknown)}"
        used |= names
    # What the issue asks the board to show, each by the metric behind it.
    for needed in (
        "trainingsweep_sweeps",
        "trainingsweep_queued_sweeps",
        "trainingsweep_sweep_queued_timestamp_seconds",
        "trainingsweep_guard_holding_objects",
        "trainingsweep_guard_holding_since_timestamp_seconds",
        "trainingsweep_verification_duration_seconds_bucket",
        "trainingsweep_verification_failures_total",
        "trainingsweep_deadline_stops_total",
        "trainingsweep_admitted_gpus",
        "trainingsweep_namespace_gpu_budget",
        "trainingsweep_reconcile_duration_seconds_bucket",
    ):
        assert needed in used, needed


def test_the_name_check_catches_a_misspelt_metric() -> None:
    assert metric_names_in('sum by (namespace) (trainingsweep_queued_sweep{namespace=~"$namespace"})') == {
        "trainingsweep_queued_sweep"
    }
    assert metric_names_in("histogram_quantile(0.95, sum by (le) (rate(x_bucket[5m])))") == {"x_bucket"}
    assert "trainingsweep_queued_sweep" not in OperatorMetrics().metric_names()


def test_the_alerts_name_exported_metrics_and_follow_values() -> None:
    exported = OperatorMetrics().metric_names()
    assert set(alerts()) == {
        "TrainingSweepGuardHolding",
        "TrainingSweepVerificationFailing",
        "TrainingSweepQueuedTooLong",
        "TrainingSweepOperatorDown",
        "TrainingSweepGpuBudgetNearlySpent",
        "TrainingSweepGpuBudgetSpent",  # issue 18 (tests/unit/test_usage.py)
    }
    for name, rule in alerts().items():
        assert metric_names_in(rule["expr"]) - PROMETHEUS_BUILTINS <= exported, name
        assert rule["labels"]["severity"] and rule["annotations"]["summary"], name
    assert one(list(monitoring_docs()), "PrometheusRule")["metadata"]["labels"]["release"] == "prometheus"
    assert f'job="{JOB}"' in alerts()["TrainingSweepOperatorDown"]["expr"]
    tuned = render_values(
        {
            "monitoring": {
                "prometheusRule": {
                    "enabled": True,
                    "guardHoldingMinutes": 10,
                    "queuedMinutes": 5,
                    "verificationFailures": 2,
                    "verificationFailuresWindow": "30m",
                    "alertLabels": {"team": "ml"},
                }
            }
        }
    )
    rules = {r["alert"]: r for g in one(tuned, "PrometheusRule")["spec"]["groups"] for r in g["rules"]}
    assert rules["TrainingSweepGuardHolding"]["expr"].endswith("> 600")
    assert rules["TrainingSweepQueuedTooLong"]["expr"].endswith("> 300")
    assert "[30m])) >= 2" in rules["TrainingSweepVerificationFailing"]["expr"]
    assert all(r["labels"]["team"] == "ml" for r in rules.values())


@pytest.mark.parametrize(
    "values",
    [
        {"monitoring": {"prometheusRule": {"guardHoldingMinutes": 0}}},
        {"monitoring": {"prometheusRule": {"verificationFailuresWindow": "1 hour"}}},
        {"monitoring": {"dashboard": {"labels": {"grafana_dashboard": 1}}}},
        {"monitoring": {"alerts": {}}},
    ],
    ids=["zero minutes", "bad duration", "label not a string", "unknown key"],
)
def test_values_schema_rejects_bad_monitoring_values(values: dict[str, Any]) -> None:
    import helm_python as helm

    with pytest.raises(helm.HelmValuesError):
        _chart().render(values, name=RELEASE, namespace=NAMESPACE)


REQUIRE_PROMTOOL = "SWEEPS_REQUIRE_PROMTOOL"


def _promtool() -> str:
    """promtool, else skip saying how to get it; under SWEEPS_REQUIRE_PROMTOOL=1 (.ci/run sets it) a failure."""
    path = shutil.which("promtool")
    if path is None:
        message = "promtool not installed: `apt-get update && apt-get install -y prometheus` brings it"
        if os.environ.get(REQUIRE_PROMTOOL) == "1":
            pytest.fail(f"{message} ({REQUIRE_PROMTOOL}=1: required here)", pytrace=False)
        pytest.skip(message)
    return path


def test_promtool_accepts_the_rules(tmp_path: Path) -> None:
    promtool = _promtool()
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule_spec()))
    done = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "6 rules found" in done.stdout


# Series as the operator exports them (one sample a minute from t=0); each case says when its alert must and must
# not fire with the default thresholds (30 min hold, 60 min queued, 3 failures in 1h, 5m down).
ALERT_TESTS: list[dict[str, Any]] = [
    {
        "interval": "1m",
        "input_series": [
            {
                "series": 'trainingsweep_guard_holding_since_timestamp_seconds{namespace="ml",sweep="s",kind="RayJob",name="s-abc"}',
                "values": "0+0x60",
            },
            {"series": 'trainingsweep_sweep_queued_timestamp_seconds{namespace="ml",sweep="q"}', "values": "0+0x90"},
            {"series": 'trainingsweep_verification_failures_total{namespace="ml",sweep="v"}', "values": "0 1 2 3+0x20"},
            {"series": 'trainingsweep_verification_failures_total{namespace="ml",sweep="w"}', "values": "0 1 2+0x20"},
            {"series": f'up{{job="{JOB}",namespace="{NAMESPACE}"}}', "values": "1 1 0+0x20"},
        ],
        "alert_rule_test": [
            {"eval_time": "29m", "alertname": "TrainingSweepGuardHolding", "exp_alerts": []},
            {
                "eval_time": "31m",
                "alertname": "TrainingSweepGuardHolding",
                "exp_alerts": [
                    {
                        "exp_labels": {
                            "severity": "warning",
                            "namespace": "ml",
                            "sweep": "s",
                            "kind": "RayJob",
                            "name": "s-abc",
                        },
                        "exp_annotations": {
                            "summary": "The checkpoint guard has held a deletion for more than 30 minutes",
                            "description": "RayJob ml/s-abc (sweep s): deletion held by the checkpoint guard for 31m 0s; its checkpoints "
                            "do not verify in S3. kubectl describe tsw -n ml s names the problem; sweepctl verify checks the run root.",
                        },
                    }
                ],
            },
            {"eval_time": "59m", "alertname": "TrainingSweepQueuedTooLong", "exp_alerts": []},
            {
                "eval_time": "61m",
                "alertname": "TrainingSweepQueuedTooLong",
                "exp_alerts": [
                    {
                        "exp_labels": {"severity": "warning", "namespace": "ml", "sweep": "q"},
                        "exp_annotations": {
                            "summary": "A sweep has waited Queued for namespace GPU budget for more than 60 minutes",
                            "description": "Sweep ml/q has been Queued for 1h 1m 0s; its namespace's GPU budget is taken by older sweeps "
                            "(status.message says how many GPUs it needs).",
                        },
                    }
                ],
            },
            {
                "eval_time": "10m",
                "alertname": "TrainingSweepVerificationFailing",
                "exp_alerts": [
                    {
                        "exp_labels": {"severity": "warning", "namespace": "ml", "sweep": "v"},
                        "exp_annotations": {
                            "summary": "Checkpoint verification failed 3 times or more within 1h",
                            "description": "Sweep ml/v: 3 failed checkpoint verifications; status.checkpoints.problems lists what is "
                            "missing or wrong.",
                        },
                    }
                ],
            },
            {"eval_time": "5m", "alertname": "TrainingSweepOperatorDown", "exp_alerts": []},
            {
                "eval_time": "8m",
                "alertname": "TrainingSweepOperatorDown",
                "exp_alerts": [
                    {
                        "exp_labels": {"severity": "critical"},
                        "exp_annotations": {
                            "summary": "The TrainingSweep operator is down",
                            "description": f"No replica of {JOB} in {NAMESPACE} has answered Prometheus for 5m: sweeps are not "
                            "admitted, deadlines not enforced, and deletions of guarded objects wait.",
                        },
                    }
                ],
            },
        ],
    },
]


def test_the_alerts_fire_when_they_should_and_not_before(tmp_path: Path) -> None:
    promtool = _promtool()
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_spec()))
    tests = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": ALERT_TESTS}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    done = subprocess.run(
        [promtool, "test", "rules", "tests.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
