"""The TrainingSweep CRD: generated from the API models, structural, self-documenting, and in step with the validator."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweep_contracts import constants
from sweep_operator.crd import SPEC_RULES, build_crd, openapi_schema, render_crd_yaml
from sweep_operator.validation import validate_sweep
from tests.support.factories import DELETE, changed, cpu_sweep, gpu_sweep
from tests.support.schemas import errors, validator

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / constants.CRD_FILENAME
EXAMPLES = REPO / "examples"
# Optional spec fields without a default on purpose: "unset" means something (documented in their descriptions).
UNSET_MEANS_SOMETHING = {
    "tune.metric",
    "tune.mode",
    "tune.searcher.seed",
    "workerGroup.tolerations[].tolerationSeconds",
    "checkpoints.scoreAttribute",
    "checkpoints.scoreOrder",
    "deadlines.activeSeconds",
    "budget.gpuHours",  # unset: no sweep budget (the namespace's still applies)
    "resume",  # unset: no resume asked for (issue 16)
    "resume.activeSeconds",  # unset: the remainder of the last attempt's budget
    "tracking",  # unset: the sweep is tracked nowhere outside the cluster
    "tracking.mlflow",
    "tracking.mlflow.credentialsSecret",  # unset: the tracking server needs no credentials
}


# Defaulted by the parser, not the API server, so a sweep never shows another scheduler's parameters.
PARSER_DEFAULTED = "tune.scheduler."


def walk(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any], bool]]:
    required = set(schema.get("required", []))
    for name, prop in schema.get("properties", {}).items():
        here = f"{path}.{name}" if path else name
        yield here, prop, name in required
        if prop.get("type") == "object" and "properties" in prop:
            yield from walk(prop, here)
        if prop.get("type") == "array" and "properties" in prop.get("items", {}):
            yield from walk(prop["items"], here + "[]")


def test_committed_crd_is_the_generated_one() -> None:
    """One source: crds/ is generated from api.py (`make crd`); edit the models, not the YAML."""
    assert CRD_FILE.read_text() == render_crd_yaml(), "run `make crd` and commit the result"


def test_committed_ledger_crd_is_the_generated_one_and_the_chart_installs_it() -> None:
    from sweep_operator.crd import render_ledger_crd_yaml

    committed = REPO / "crds" / constants.LEDGER_CRD_FILENAME
    assert committed.read_text() == render_ledger_crd_yaml(), "run `make crd` and commit the result"
    chart_copy = REPO / "charts" / "trainingsweep-operator" / "crds" / constants.LEDGER_CRD_FILENAME
    assert chart_copy.read_bytes() == committed.read_bytes(), "charts/trainingsweep-operator/crds/ is stale"


def test_reference_doc_is_generated_from_the_models() -> None:
    from sweep_operator.crd import render_reference_markdown

    doc = REPO / "docs" / "trainingsweep-reference.md"
    assert doc.read_text() == render_reference_markdown(), "run `make crd` and commit the result"
    assert "| `spec.tune.metric` |" in doc.read_text()


def test_names_and_printer_columns() -> None:
    crd = yaml.safe_load(CRD_FILE.read_text())
    names = crd["spec"]["names"]
    assert crd["metadata"]["name"] == "trainingsweeps.sweeps.dev"
    assert (names["kind"], names["plural"], names["shortNames"], names["categories"]) == (
        "TrainingSweep",
        "trainingsweeps",
        ["tsw"],
        ["ml"],
    )
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    columns = [c["name"].upper() for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert columns == ["PHASE", "TRIALS", "BEST", "VERIFIED", "RAYJOB", "GPU-HOURS", "DEADLINE", "FINISHED", "AGE"]
    wide = [c["name"].upper() for c in version["additionalPrinterColumns"] if c.get("priority") == 1]  # -o wide
    assert wide == ["GPUS", "NS-BUDGET", "VERIFIED-AT", "KUEUE"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    for column in version["additionalPrinterColumns"]:
        path = column["jsonPath"].lstrip(".").split(".")
        if path[0] == "status":
            node = status
            for part in path[1:]:
                node = node["properties"][part]  # every column points at a real status field


def test_every_field_has_a_description() -> None:
    """kubectl explain must be useful: no field without a description."""
    # metadata is ObjectMeta: the API server documents it and forbids restrictions beyond name/generateName.
    missing = [path for path, prop, _ in walk(openapi_schema()) if not prop.get("description") and path != "metadata"]
    assert missing == []


def test_every_optional_spec_field_has_a_default() -> None:
    spec = openapi_schema()["properties"]["spec"]
    missing = [
        path
        for path, prop, required in walk(spec)
        if not required
        and "default" not in prop
        and path not in UNSET_MEANS_SOMETHING
        and not path.startswith(PARSER_DEFAULTED)
    ]
    assert missing == []
    for path in UNSET_MEANS_SOMETHING:
        assert any(p == path for p, _, _ in walk(spec)), f"{path} listed but not in the schema"


def test_schema_is_structural() -> None:
    """Every node has a type, except int-or-string quantities and the two free-form places DESIGN allows."""
    free_form = []

    def check(node: dict[str, Any], path: str) -> None:
        if node.get("x-kubernetes-preserve-unknown-fields"):
            free_form.append(path)
        elif not node.get("x-kubernetes-int-or-string"):
            assert node.get("type"), f"{path} has no type"
        for name, prop in node.get("properties", {}).items():
            check(prop, f"{path}.{name}")
        if isinstance(node.get("additionalProperties"), dict):
            check(node["additionalProperties"], f"{path}.*")
        if "items" in node:
            check(node["items"], f"{path}[]")

    check(openapi_schema(), "")
    assert sorted(free_form) == [".spec.paramSpace.*", ".status.bestTrial.config"]


def test_enums_minimums_and_cel_rules_are_present() -> None:
    spec = openapi_schema()["properties"]["spec"]
    tune = spec["properties"]["tune"]["properties"]
    assert tune["mode"]["enum"] == ["min", "max"]
    assert tune["scheduler"]["properties"]["type"]["enum"] == ["fifo", "asha", "hyperband", "median", "pbt"]
    assert tune["numSamples"]["minimum"] == 1
    failure = spec["properties"]["failurePolicy"]["properties"]
    assert all(failure[k]["minimum"] == -1 for k in ("workerFailures", "controllerFailures", "preemptionFailures"))
    assert spec["properties"]["rayVersion"]["enum"] == ["2.58.0"]
    assert len(spec["x-kubernetes-validations"]) == len(SPEC_RULES) >= 5


# Each CEL rule paired with a spec that breaks it: the semantic validator must refuse the same spec,
# so a cluster without the webhook and `sweepctl validate` agree.
CEL_VIOLATIONS = {
    "has(self.tune.metric) == has(self.tune.mode)": {"spec.tune.mode": DELETE},
    "!(self.tune.scheduler.type in": {"spec.tune.metric": DELETE, "spec.tune.mode": DELETE, "spec.checkpoints": {}},
    "self.tune.searcher.type != 'optuna'": {
        "spec.tune.metric": DELETE,
        "spec.tune.mode": DELETE,
        "spec.checkpoints": {},
        "spec.tune.scheduler": {"type": "fifo"},
        "spec.tune.searcher": {"type": "optuna"},
    },
    "self.tune.scheduler.type != 'asha'": {"spec.tune.scheduler.gracePeriod": 7},
    "self.trial.resourcesPerWorker.gpu <= 0": {"spec.workerGroup.instanceType": DELETE},
    "self.workerGroup.minReplicas <=": {"spec.workerGroup.minReplicas": 9},
    "self.deadlines.startupSeconds <": {"spec.deadlines.startupSeconds": 30000},
    "self.deadlines.gracefulStopSeconds <": {"spec.deadlines.gracefulStopSeconds": 30000},
    "self.deletion.maxRetryBackoffSeconds": {"spec.deletion.retryBackoffSeconds": 700},
    "hyperparamMutations": {"spec.tune.scheduler": {"type": "pbt"}},
}


@pytest.mark.parametrize("rule", SPEC_RULES, ids=lambda r: r["fieldPath"])
def test_each_cel_rule_is_also_enforced_by_the_validator(rule: dict[str, str]) -> None:
    (changes,) = [v for k, v in CEL_VIOLATIONS.items() if k in rule["rule"]]
    problems = validate_sweep(changed(gpu_sweep(), changes))
    assert any(p.path == "spec" + rule["fieldPath"] for p in problems), problems


@pytest.fixture(scope="module")
def crd_validator() -> Any:
    return validator(openapi_schema())


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_examples_validate_against_the_crd_schema(example: Path, crd_validator: Any) -> None:
    doc = yaml.safe_load(example.read_text())
    assert errors(crd_validator, doc) == []
    assert validate_sweep(doc) == []


@pytest.mark.parametrize(
    "changes",
    [
        {"spec.tune.mode": "minimum"},
        {"spec.tune.numSamples": 0},
        {"spec.trial.workerz": 1},
        {"spec.failurePolicy.jobRetries": -1},
        {"spec.trial.resourcesPerWorker.memory": "lots"},
    ],
)
def test_crd_schema_refuses_what_the_api_server_would(changes: dict[str, Any], crd_validator: Any) -> None:
    assert errors(crd_validator, changed(cpu_sweep(), changes))


# Size limits and patterns (issue 15): the API server refuses these before the operator sees them, and the
# validator (webhook, sweepctl validate) refuses the same, naming the field.
SIZE_AND_PATTERN_CASES = {
    "image too long": ({"spec.image": "r.example/" + "a" * 600}, "spec.image"),
    "trainLoop too long": ({"spec.trainLoop": "m" * 300 + ":f"}, "spec.trainLoop"),
    "trainLoop not module:function": ({"spec.trainLoop": "pkg.mod.fn"}, "spec.trainLoop"),
    "trainLoop with spaces": ({"spec.trainLoop": "pkg.mod: fn"}, "spec.trainLoop"),
    "uri too long": ({"spec.storage.uri": "s3://bucket/" + "p" * 1100}, "spec.storage.uri"),
    "service account not a name": ({"spec.storage.serviceAccountName": "Runner_A"}, "spec.storage.serviceAccountName"),
    "endpoint with a path": ({"spec.storage.endpointUrl": "http://minio:9000/evil/path"}, "spec.storage.endpointUrl"),
    "region not a region": ({"spec.storage.region": "oregon"}, "spec.storage.region"),
    "paramSpace too many": ({"spec.paramSpace": {f"p{i}": 1 for i in range(65)}}, "spec.paramSpace"),
    "tolerations too many": (
        {"spec.workerGroup.tolerations": [{"key": f"k{i}"} for i in range(33)]},
        "spec.workerGroup.tolerations",
    ),
    "nodeSelector too many": (
        {"spec.workerGroup.nodeSelector": {f"k{i}": "v" for i in range(33)}},
        "spec.workerGroup.nodeSelector",
    ),
    "quantity too long": ({"spec.trial.resourcesPerWorker.memory": "1" * 65}, "spec.trial.resourcesPerWorker.memory"),
    "metric too long": ({"spec.tune.metric": "m" * 129}, "spec.tune.metric"),
}


@pytest.mark.parametrize(("changes", "path"), SIZE_AND_PATTERN_CASES.values(), ids=SIZE_AND_PATTERN_CASES.keys())
def test_size_limits_and_patterns_are_refused_by_the_crd_and_the_validator(
    changes: dict[str, Any], path: str, crd_validator: Any
) -> None:
    doc = changed(cpu_sweep(), changes)
    assert errors(crd_validator, doc), "the CRD schema admits it"
    assert path in {p.path for p in validate_sweep(doc)}


@pytest.mark.parametrize("uri", ["https://bucket/prefix", "s3://bucket/", "s3://Bucket_1/x", "gs://b/x"])
def test_a_bad_storage_uri_is_refused_with_words_not_a_regex(uri: str) -> None:
    """Issue 28: a schema pattern's only message is the regex; the API server prints a CEL rule's message. The
    emulator's apiserver validation, as `kubectl apply` would show it; the validator names the field too."""
    from sweep_sandbox import emulator

    schema = emulator.compiled_schema("TrainingSweep", constants.GROUP, build_crd()["spec"]["versions"][0])
    doc = changed(cpu_sweep(), {"spec.storage.uri": uri})
    schema.decode(doc)
    (error,) = [str(e) for e in schema.errors(doc)]
    assert error.startswith(f"spec.storage.uri: Invalid value: \"string\": got '{uri}'; expected s3://bucket/prefix: a")
    assert "^s3://" not in error and "[a-z0-9]" not in error
    assert "spec.storage.uri" in {p.path for p in validate_sweep(doc)}


def test_user_facing_text_names_no_internal_rule_or_issue_ids() -> None:
    """Issue 28: `(R5, R14)` in `kubectl explain`, `(issue 16)` in the reference, `(R18)` in validate's output."""
    import re

    internal = re.compile(r"\bR\d{1,2}\b|\bissue \d+")
    crd_text = CRD_FILE.read_text()
    reference = (REPO / "docs" / "trainingsweep-reference.md").read_text()
    refused = [str(p) for p in validate_sweep(changed(cpu_sweep(), {"spec.tune.scheduler": {"type": "pbt"}}))]
    assert refused and any("hyperparamMutations" in p for p in refused)
    for where, text in {"CRD": crd_text, "reference": reference, "validate": "\n".join(refused)}.items():
        assert not internal.findall(text), f"{where}: {sorted(set(internal.findall(text)))}"


def test_every_spec_string_list_and_map_is_bounded() -> None:
    spec = openapi_schema()["properties"]["spec"]
    unbounded = []
    for path, prop, _ in walk(spec):
        kind = prop.get("type") or ("int-or-string" if prop.get("x-kubernetes-int-or-string") else None)
        if kind == "string" and "enum" not in prop and "maxLength" not in prop:
            unbounded.append(path)
        if kind == "int-or-string" and "maxLength" not in prop:
            unbounded.append(path)
        if kind == "array" and "maxItems" not in prop:
            unbounded.append(path)
        if kind == "object" and "properties" not in prop and "maxProperties" not in prop:
            unbounded.append(path)  # a map
    assert unbounded == []
    props = spec["properties"]
    assert props["trainLoop"]["pattern"]
    assert props["storage"]["properties"]["uri"]["x-kubernetes-validations"][0]["rule"].startswith("self.matches(")
    assert props["storage"]["properties"]["serviceAccountName"]["pattern"]


def errors_of(schema: Any, doc: dict[str, Any]) -> list[str]:
    """What the emulator's API server answers a create of `doc` (decoded and defaulted as it stores it)."""
    schema.decode(doc)
    schema.apply_defaults(doc)
    return [str(e) for e in schema.errors(doc)]


def test_a_fifo_sweep_is_stored_without_other_schedulers_parameters() -> None:
    """Issue 28: the API server defaulted asha's maxT, gracePeriod, brackets... into every sweep, and `kubectl
    describe` showed them on a fifo sweep. They stay unset; the parser's defaults say what an unset one means,
    also to the asha rule gracePeriod <= maxT."""
    from sweep_contracts.api import SchedulerSpec
    from sweep_sandbox import emulator

    schema = emulator.compiled_schema("TrainingSweep", constants.GROUP, build_crd()["spec"]["versions"][0])
    doc = cpu_sweep()
    schema.decode(doc)
    schema.apply_defaults(doc)
    assert doc["spec"]["tune"]["scheduler"] == {"type": "fifo"}
    defaults = SchedulerSpec()
    scheduler = openapi_schema()["properties"]["spec"]["properties"]["tune"]["properties"]["scheduler"]
    for key, prop in scheduler["properties"].items():
        if key != "type":
            assert "default" not in prop and "Default: " in prop["description"], key
    rule = next(r for r in SPEC_RULES if r["fieldPath"] == ".tune.scheduler.gracePeriod")
    asha = changed(gpu_sweep(), {"spec.tune.scheduler": {"type": "asha", "gracePeriod": defaults.max_t + 1}})
    assert errors_of(schema, asha) == [f'spec.tune.scheduler.gracePeriod: Invalid value: "object": {rule["message"]}']
    assert errors_of(schema, changed(gpu_sweep(), {"spec.tune.scheduler": {"type": "asha", "maxT": 1}})) == []


def test_crd_defaults_match_the_model_defaults() -> None:
    """The API server's defaults (from the CRD) and the parser's defaults are the same values."""
    from sweep_contracts.api import SweepSpec

    spec_schema = openapi_schema()["properties"]["spec"]
    model_defaults = SweepSpec.model_validate(cpu_sweep()["spec"]).model_dump(by_alias=True)
    tune = spec_schema["properties"]["tune"]["properties"]
    scheduler = tune["scheduler"]["properties"]
    assert "default" not in scheduler["maxT"] and scheduler["maxT"]["description"].endswith(" Default: 100.")
    for section in ("failurePolicy", "deletion"):
        props = spec_schema["properties"][section]["properties"]
        fresh = SweepSpec.model_validate({**cpu_sweep()["spec"], section: {}}).model_dump(by_alias=True)[section]
        assert {k: p["default"] for k, p in props.items()} == fresh
    assert model_defaults["rayVersion"] == spec_schema["properties"]["rayVersion"]["default"]
    assert build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"] == openapi_schema()
