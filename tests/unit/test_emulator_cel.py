"""The emulator's fast CEL subset (sandbox/schema_cel.py) against cel-python on every rule it takes."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from sweep_sandbox import emulator
from sweep_sandbox.schema_cel import CelError, compile_fast
from sweep_sandbox.schema_rules import CelCompiler
from sweep_sandbox.schema_validation import json_type
from tests.support.factories import DELETE, changed, cpu_sweep, gpu_sweep


def outcome_fast(program: Any, env: dict[str, Any]) -> Any:
    try:
        return program(env)
    except CelError:
        return "error"


def outcome_celpy(cel: CelCompiler, text: str, env: dict[str, Any]) -> Any:
    program = cel._program(text, "test")
    try:
        result = program.evaluate({k: cel.to_cel(v) for k, v in env.items()})
    except Exception:
        return "error"
    if isinstance(result, Exception):
        return "error"
    return bool(result) if type(result).__name__ == "BoolType" else result


def spec_corpus() -> list[Any]:
    """Sweep specs as the apiserver hands them to the rules (defaulted, schema-typed), breaking every rule.

    Only schema-typed values: there cel-python is laxer than cel-go (has() over a missing map, 1.0 == 0 an error),
    cases test_fast_subset_semantics_follow_cel_spec pins to cel-go's behaviour.
    """
    schema = emulator.compiled_schema("TrainingSweep", "sweeps.dev", emulator.sweep_crd()["spec"]["versions"][0])
    variants = [
        {},
        {"spec.tune.mode": DELETE},
        {"spec.tune.metric": DELETE, "spec.tune.mode": DELETE},
        {"spec.tune.scheduler": {"type": "asha", "gracePeriod": 9, "maxT": 3}},
        {"spec.tune.searcher": {"type": "optuna"}},
        {"spec.workerGroup.minReplicas": 99},
        {"spec.deadlines.activeSeconds": DELETE},
        {"spec.deadlines.startupSeconds": 99999},
        {"spec.deadlines.gracefulStopSeconds": 99999},
        {"spec.deletion.retryBackoffSeconds": 900, "spec.deletion.maxRetryBackoffSeconds": 1},
    ]
    specs = []
    for base, change in itertools.product((cpu_sweep(), gpu_sweep()), variants):
        doc = changed(base, change)
        schema.decode(doc)
        assert not [e for e in schema.errors(doc) if e.type != "FieldValueInvalid"]  # no type error: CEL runs
        specs.append(doc["spec"])
    return specs


def object_corpus() -> list[Any]:
    """Whole TrainingSweeps for the rules at the CRD's root (they read status.runId and status.phase: resume, issue
    16): specs of `spec_corpus`, with and without spec.resume, before a run, while it runs and after it ended."""
    statuses: list[Any] = [
        None,
        {"runId": "r1abcd", "phase": "Running"},
        {"runId": "r1abcd", "phase": "DeadlineExceeded"},
    ]
    resumes: list[Any] = [
        None,
        {"generation": 1, "activeSeconds": 3600},
        {"generation": 2},
        {"generation": 1, "activeSeconds": 60},
    ]
    objects = []
    for index, (spec, status, resume) in enumerate(itertools.product(spec_corpus()[:3], statuses, resumes)):
        spec = {**spec, "tune": {**spec["tune"], "numSamples": 4 + index % 3}}
        if resume is not None:
            spec["resume"] = resume
        doc = {"apiVersion": "sweeps.dev/v1alpha1", "kind": "TrainingSweep", "metadata": {"name": "s"}, "spec": spec}
        if status is not None:
            doc["status"] = status
        objects.append(doc)
    return objects


def rules_of_loaded_crds() -> list[tuple[str, str, str]]:
    """(where, schema type of the rule's node, rule) for every rule of every CRD the emulator loads."""
    found = []
    for crd in [emulator.sweep_crd(), *emulator.kuberay_crds()]:
        for version in crd["spec"]["versions"]:
            compiled = emulator.compiled_schema(crd["spec"]["names"]["kind"], crd["spec"]["group"], version)
            stack = [("", compiled.root)]
            while stack:
                path, node = stack.pop()
                found += [(f"{crd['metadata']['name']}:{path}", node.type, rule.rule) for rule in node.rules]
                stack += [(f"{path}.{k}", c) for k, c in node.properties.items()]
                stack += [(f"{path}[*]", c) for c in (node.additional, node.items) if c is not None]
    return sorted(set(found))


VALUES: list[Any] = [
    {},
    {"jobStatus": "SUCCEEDED"},
    {"jobDeploymentStatus": "Complete"},
    {"jobStatus": "FAILED", "jobDeploymentStatus": "Failed"},
    {"onSuccess": {"policy": "DeleteCluster"}},
    {"onSuccess": {}, "onFailure": {}},
    {"deletionRules": []},
    {"onSuccess": {}, "deletionRules": [{}]},
    "ray.io/kuberay-operator",
    "kueue.x-k8s.io/multikueue",
    "other",
    "redis",
    "",
    3,
    None,
]


def fast_rules() -> list[tuple[str, str, str]]:
    """The loaded rules the subset evaluator compiles (the others are evaluated by cel-python only)."""
    return [
        (where, node_type, rule) for where, node_type, rule in rules_of_loaded_crds() if compile_fast(rule) is not None
    ]


def test_the_fast_subset_covers_most_loaded_rules() -> None:
    """A subset that compiled nothing would leave the differential test below with nothing to compare."""
    assert len(fast_rules()) >= len(rules_of_loaded_crds()) // 2 > 0


@pytest.mark.parametrize(("where", "node_type", "rule"), fast_rules())
def test_every_loaded_rule_in_the_fast_subset_agrees_with_cel_python(where: str, node_type: str, rule: str) -> None:
    """The subset evaluator replaces cel-python only where both give the same answer (result or error), on values
    of the rule's schema type (the only ones that reach a rule: kubernetes/kubernetes apiextensions-apiserver
    pkg/registry/customresource/strategy.go hasBlockingErr)."""
    program = compile_fast(rule)
    assert program is not None
    cel = CelCompiler()
    corpus = (
        object_corpus()
        if where == "trainingsweeps.sweeps.dev:"
        else spec_corpus()
        if where.startswith("trainingsweeps")
        else VALUES
    )
    corpus = [v for v in corpus if json_type(v) == node_type or (node_type == "number" and json_type(v) == "integer")]
    assert corpus, (where, node_type)
    # A transition rule runs only with a correlated old value (cel/validation.go), so never without oldSelf.
    sample = corpus[::5][:6] if where == "trainingsweeps.sweeps.dev:" else corpus[:3]  # ran and not, resumed and not
    olds = [*sample] if "oldSelf" in rule else [None, *sample]
    for value, old in itertools.product(corpus, olds):
        env = {"self": value} if old is None else {"self": value, "oldSelf": old}
        assert outcome_fast(program, env) == outcome_celpy(cel, rule, env), (rule, value, old)


@pytest.mark.parametrize(
    ("expression", "wanted"),
    [
        ("1 == 1.0", True),  # heterogeneous numeric equality (cel-go, as Kubernetes enables it)
        ("true == 1", False),  # a bool is no number
        ("2 < 2.5", True),
        ("7 / -2 == -3 && -7 % 2 == -1", True),  # truncated division, as Go
        ("'b' > 'a' && 'a' + 'b' == 'ab'", True),
        ("[1, 2] == [1, 2] && 2 in [1, 2] && !(3 in [1, 2])", True),
        ("true || self.missing", True),  # errors absorbed by ||
        ("self.missing && false", False),  # and by &&
        ("false || self.missing", "error"),
        ("1 + 2.0 == 3.0", "error"),  # no implicit int/double arithmetic
        ("has(self.a) ? self.a.b == 1 : false", True),
        ("!has(self.x) || self.x > 0", True),
        ("self.a.c", "error"),
        ("1 / 0 == 1", "error"),
        ("has(self.missing.x)", "error"),  # has() tests the last field only: the operand errors (cel-go)
        ("self.a.b == 1.0", True),
    ],
)
def test_fast_subset_semantics_follow_cel_spec(expression: str, wanted: Any) -> None:
    """google/cel-spec doc/langdef.md (and google/cel-go as Kubernetes configures it): logical operators, equality,
    arithmetic, has() and errors."""
    program = compile_fast(expression)
    assert program is not None
    assert outcome_fast(program, {"self": {"a": {"b": 1}}}) == wanted


def test_expressions_outside_the_subset_are_left_to_cel_python() -> None:
    for expression in (
        "self.size() > 0",
        "self.all(x, x > 0)",
        "int(self) > 1",
        "self.matches('^a')",
        "'\\u00e9' == self",
        "[1,2].isSorted()",
    ):
        assert compile_fast(expression) is None, expression
