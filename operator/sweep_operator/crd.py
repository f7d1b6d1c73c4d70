"""Generate the TrainingSweep CRD (apiextensions.k8s.io/v1) from the API models.

    python -m sweep_operator.crd > crds/trainingsweeps.sweeps.dev.yaml

The schema is structural, every field has a description (kubectl explain) and every optional spec
field its default; CEL rules carry the cross-field checks the API server can enforce.
A test compares the committed file with this output, and the chart's copy with the committed file.
"""

from __future__ import annotations

import enum
import json
import types
import typing
from typing import Any, Literal, get_args, get_origin

import annotated_types
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from sweep_contracts import constants
from sweep_contracts.api import GPUHourLedgerSpec, GPUHourLedgerStatus, SchedulerSpec, SweepSpec, SweepStatus

from .validation import RESUME_RULES

# Kubernetes' own quantity pattern (k8s.io/apimachinery resource.Quantity).
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)

_SCHEDULER = SchedulerSpec()  # the parser's defaults, which CEL rules assume for an unset field

# Cross-field rules the API server enforces at admission; the semantic validator checks the same and more.
SPEC_RULES: list[dict[str, str]] = [
    {
        "rule": "has(self.tune.metric) == has(self.tune.mode)",
        "message": "tune.metric and tune.mode must be set together",
        "fieldPath": ".tune.mode",
    },
    {
        "rule": "!(self.tune.scheduler.type in ['asha', 'hyperband', 'median', 'pbt']) || has(self.tune.metric)",
        "message": "tune.metric and tune.mode are required by every scheduler but fifo",
        "fieldPath": ".tune.metric",
    },
    {
        "rule": "self.tune.searcher.type != 'optuna' || has(self.tune.metric)",
        "message": "tune.metric and tune.mode are required by searcher optuna",
        "fieldPath": ".tune.metric",
    },
    {
        "rule": "self.tune.scheduler.type != 'pbt' || (has(self.tune.scheduler.hyperparamMutations) && "
        "size(self.tune.scheduler.hyperparamMutations) > 0)",
        "message": "tune.scheduler.hyperparamMutations (paramSpace names to mutate) is required by pbt",
        "fieldPath": ".tune.scheduler.hyperparamMutations",
    },
    {
        # Neither has an API-server default (api.PARSER_DEFAULT): an unset one is the parser's default.
        "rule": "self.tune.scheduler.type != 'asha' || "
        f"(has(self.tune.scheduler.gracePeriod) ? self.tune.scheduler.gracePeriod : {_SCHEDULER.grace_period}) <= "
        f"(has(self.tune.scheduler.maxT) ? self.tune.scheduler.maxT : {_SCHEDULER.max_t})",
        "message": "tune.scheduler.gracePeriod must be <= maxT",
        "fieldPath": ".tune.scheduler.gracePeriod",
    },
    {
        # <= 0, not == 0: a negative count is the schema's minimum to refuse ("should be greater than or equal to
        # 0"), not a missing instance type.
        "rule": "self.trial.resourcesPerWorker.gpu <= 0 || self.workerGroup.instanceType != ''",
        "message": "workerGroup.instanceType is required when trial.resourcesPerWorker.gpu > 0 (bundle fit)",
        "fieldPath": ".workerGroup.instanceType",
    },
    {
        "rule": "self.workerGroup.minReplicas <= self.trial.workers * self.tune.maxConcurrentTrials",
        "message": "workerGroup.minReplicas must be <= trial.workers x tune.maxConcurrentTrials",
        "fieldPath": ".workerGroup.minReplicas",
    },
    {
        "rule": "!has(self.deadlines.activeSeconds) || self.deadlines.startupSeconds < self.deadlines.activeSeconds",
        "message": "deadlines.startupSeconds must be less than deadlines.activeSeconds",
        "fieldPath": ".deadlines.startupSeconds",
    },
    {
        "rule": "!has(self.deadlines.activeSeconds) || "
        "self.deadlines.gracefulStopSeconds < self.deadlines.activeSeconds",
        "message": "deadlines.gracefulStopSeconds must be less than deadlines.activeSeconds",
        "fieldPath": ".deadlines.gracefulStopSeconds",
    },
    {
        "rule": "self.deletion.maxRetryBackoffSeconds >= self.deletion.retryBackoffSeconds",
        "message": "deletion.maxRetryBackoffSeconds must be >= deletion.retryBackoffSeconds",
        "fieldPath": ".deletion.maxRetryBackoffSeconds",
    },
]

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Lifecycle phase"},
    {
        "name": "Trials",
        "type": "string",
        "jsonPath": ".status.trialsSummary",
        "description": "Trials finished out of tune.numSamples (times the grid's points), and how many run now",
    },
    # A string the operator writes: a column is one JSONPath (no concatenation) and a number column prints all
    # 16-17 digits of a float.
    {
        "name": "Best",
        "type": "string",
        "jsonPath": ".status.bestSummary",
        "description": "The best trial's metric and value (4 significant digits), e.g. val_loss=0.1235",
    },
    {
        "name": "Verified",
        "type": "string",
        "jsonPath": ".status.checkpoints.summary",
        "description": "Checkpoints verified in S3 and at which level (4 committed, 4 full-state), none, or failed: why",
    },
    {"name": "RayJob", "type": "string", "jsonPath": ".status.rayJobName", "description": "The run's RayJob"},
    {
        "name": "GPU-Hours",
        "type": "number",
        "jsonPath": ".status.usage.gpuHours",
        "description": "GPU-hours used (its GPU pods, scheduled to gone; 0 for a CPU sweep)",
    },
    # string, not date: kubectl renders a future date column as "<invalid>" (it prints ages). Empty once the run
    # has ended, when FINISHED says since when (RayJob's END TIME).
    {
        "name": "Deadline",
        "type": "string",
        "jsonPath": ".status.activeDeadlineAt",
        "description": "Sweep deadline (UTC) while the run has not ended",
    },
    {
        "name": "Finished",
        "type": "date",
        "jsonPath": ".status.finishedAt",
        "description": "How long ago the run ended (empty while it goes on)",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    # -o wide only (priority 1): what a platform team checks across sweeps.
    {
        "name": "GPUs",
        "type": "integer",
        "jsonPath": ".status.replicas.gpus",
        "priority": 1,
        "description": "GPUs admitted to the sweep",
    },
    {
        "name": "NS-Budget",
        "type": "string",
        "jsonPath": ".status.replicas.namespaceBudget",
        "priority": 1,
        "description": "GPUs admitted in the namespace / its budget, at the sweep's admission",
    },
    {
        "name": "Verified-At",
        "type": "date",
        "jsonPath": ".status.checkpoints.verifiedAt",
        "priority": 1,
        "description": "When the checkpoints were last verified in S3",
    },
    {
        "name": "Kueue",
        "type": "string",
        "jsonPath": ".status.kueue.summary",
        "priority": 1,
        "description": "Kueue mode: Queued (Kueue: <LocalQueue>), Admitted or Preempted (docs/kueue.md)",
    },
]


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    origin = get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return annotation, False


def _type_schema(annotation: Any, info: FieldInfo | None) -> dict[str, Any]:
    annotation, _ = _unwrap_optional(annotation)
    extra = (info.json_schema_extra if info else None) or {}
    if isinstance(extra, dict) and extra.get("x-quantity"):
        return {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    origin = get_origin(annotation)
    if origin is typing.Annotated:
        return _type_schema(get_args(annotation)[0], info)
    if origin is Literal:
        values = list(get_args(annotation))
        return {"type": "string", "enum": values}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):  # a str-valued enum (Phase)
        return {"type": "string", "enum": [member.value for member in annotation]}
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return model_schema(annotation)
    if origin is dict:
        key_type, value_type = get_args(annotation)
        value, value_info = _annotated(value_type)
        if value is str:
            schema: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "string"}}
            if value_info is not None:
                schema["additionalProperties"].update(_constraints(value_info, "string"))
            _, key_info = _annotated(key_type)
            key_max = _constraints(key_info, "string").get("maxLength") if key_info is not None else None
            if key_max:
                # A structural schema has no propertyNames: a rule bounds the keys.
                schema["x-kubernetes-validations"] = [
                    {"rule": f"self.all(k, size(k) <= {key_max})", "message": f"keys are at most {key_max} characters"}
                ]
            return schema
        return {"type": "object", "additionalProperties": {"x-kubernetes-preserve-unknown-fields": True}}
    if origin is list:
        (item,) = get_args(annotation)
        return {"type": "array", "items": _type_schema(item, None)}
    if annotation is bool:
        return {"type": "boolean"}
    if annotation is int:
        return {"type": "integer", "format": "int64"}
    if annotation is float:
        return {"type": "number"}
    if annotation is str:
        return {"type": "string"}
    if annotation is typing.Any:
        return {"x-kubernetes-preserve-unknown-fields": True}
    raise TypeError(f"no CRD schema for {annotation!r}")


def _annotated(annotation: Any) -> tuple[Any, FieldInfo | None]:
    """`Annotated[T, Field(...)]` as (T, its constraints); anything else as (it, None)."""
    if get_origin(annotation) is typing.Annotated:
        base, *meta = get_args(annotation)
        infos = [m for m in meta if isinstance(m, FieldInfo)]
        return base, FieldInfo.merge_field_infos(*infos) if infos else None
    return annotation, None


# A pydantic max_length, by the JSON type it bounds.
_MAX_KEYWORD = {"array": "maxItems", "object": "maxProperties"}


def _constraints(info: FieldInfo, json_type: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    if "pattern" in extra:  # CRD-only patterns (api.py: the parser checks the same form with its own message)
        out["pattern"] = extra["pattern"]
    if "x-kubernetes-validations" in extra:  # CRD-only rules, for a message a user can act on (api.py)
        out["x-kubernetes-validations"] = extra["x-kubernetes-validations"]
    for meta in info.metadata:
        if isinstance(meta, annotated_types.Ge):
            out["minimum"] = meta.ge
        elif isinstance(meta, annotated_types.Gt):
            out["minimum"] = meta.gt
            out["exclusiveMinimum"] = True
        elif isinstance(meta, annotated_types.Le):
            out["maximum"] = meta.le
        elif isinstance(meta, annotated_types.MinLen):
            out["minLength"] = meta.min_length
        elif isinstance(meta, annotated_types.MaxLen):
            out[_MAX_KEYWORD.get(json_type or "", "maxLength")] = meta.max_length
    return out


def _parser_default(info: FieldInfo) -> bool:
    return isinstance(info.json_schema_extra, dict) and bool(info.json_schema_extra.get("parserDefault"))


def _default(info: FieldInfo) -> tuple[bool, Any]:
    if _parser_default(info):
        return False, None
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]  # pydantic allows a factory of the data; ours take none
    elif info.is_required() or info.default is None:
        return False, None
    else:
        value = info.default
    if isinstance(value, BaseModel):
        # Nested defaults are applied by the API server once the parent object exists.
        return True, {}
    return True, value


def model_schema(model: type[BaseModel], with_defaults: bool = True) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": {}}
    required = []
    for name, info in model.model_fields.items():
        key = info.alias or name
        prop: dict[str, Any] = {"description": info.description or ""}
        if _parser_default(info):
            prop["description"] += f" Default: {json.dumps(info.default)}."
        prop.update(_type_schema(info.annotation, info))
        prop.update(_constraints(info, prop.get("type")))
        if info.is_required():
            required.append(key)
        elif with_defaults:
            has_default, value = _default(info)
            if has_default:
                prop["default"] = value
        if key == "config" and prop.get("type") == "object":
            prop = {"description": prop["description"], "type": "object", "x-kubernetes-preserve-unknown-fields": True}
        schema["properties"][key] = prop
    if required:
        schema["required"] = required
    return schema


def build_crd() -> dict[str, Any]:
    spec_schema = model_schema(SweepSpec)
    spec_schema["description"] = "What to sweep, on which resources, within which limits."
    spec_schema["x-kubernetes-validations"] = SPEC_RULES
    status_schema = model_schema(SweepStatus, with_defaults=False)
    status_schema["description"] = "Observed state, written by the operator."
    root = {
        "type": "object",
        "description": "A hyper-parameter sweep of a PyTorch model: Ray Tune over Ray Train V2 in a KubeRay "
        "RayJob, with a deadline, GPU caps and a checkpoint guard.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "sweeps.dev/v1alpha1"},
            "kind": {"type": "string", "description": "TrainingSweep"},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
        # At the root, beside spec: these rules read status.runId and status.phase (resume).
        "x-kubernetes-validations": [rule.cel() for rule in RESUME_RULES],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": constants.CRD_NAME},
        "spec": {
            "group": constants.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": constants.KIND,
                "listKind": f"{constants.KIND}List",
                "plural": constants.PLURAL,
                "singular": constants.SINGULAR,
                "shortNames": [constants.SHORT_NAME],
                "categories": [constants.CATEGORY],
            },
            "versions": [
                {
                    "name": constants.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


LEDGER_PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Used", "type": "number", "jsonPath": ".status.usedGpuHours", "description": "GPU-hours in the window"},
    {
        "name": "Reserved",
        "type": "number",
        "jsonPath": ".status.reservedGpuHours",
        "description": "GPU-hours promised to admitted attempts, not yet used",
    },
    {"name": "Limit", "type": "number", "jsonPath": ".spec.gpuHours", "description": "GPU-hours per window"},
    {"name": "Window", "type": "string", "jsonPath": ".status.window", "description": "The rolling window"},
    {
        "name": "Frees-At",
        "type": "string",
        "jsonPath": ".status.freesAt",
        "description": "When budget frees up (UTC); empty: there is room now",
    },
    {"name": "Updated", "type": "date", "jsonPath": ".status.updatedAt"},
]


def build_ledger_crd() -> dict[str, Any]:
    """The GPUHourLedger CRD: one object per namespace, written only by the operator (docs/budgets.md). No status
    subresource: a reservation is one whole-object write with the resourceVersion precondition."""
    spec_schema = model_schema(GPUHourLedgerSpec, with_defaults=False)
    spec_schema["description"] = "The namespace's budget, copied from the operator's settings (the platform team's)."
    status_schema = model_schema(GPUHourLedgerStatus, with_defaults=False)
    status_schema["description"] = "Every GPU-second the namespace's sweeps used in the window, and reservations."
    root = {
        "type": "object",
        "description": "The GPU-hours a namespace's TrainingSweeps used over the rolling window, deleted sweeps "
        "included, and what admitted sweeps have reserved. Written by the operator only.",
        "properties": {
            "apiVersion": {"type": "string", "description": constants.API_VERSION},
            "kind": {"type": "string", "description": constants.LEDGER_KIND},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": constants.LEDGER_CRD_NAME},
        "spec": {
            "group": constants.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": constants.LEDGER_KIND,
                "listKind": f"{constants.LEDGER_KIND}List",
                "plural": constants.LEDGER_PLURAL,
                "singular": constants.LEDGER_SINGULAR,
                "shortNames": [constants.LEDGER_SHORT_NAME],
                "categories": [constants.CATEGORY],
            },
            "versions": [
                {
                    "name": constants.VERSION,
                    "served": True,
                    "storage": True,
                    "additionalPrinterColumns": LEDGER_PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


HEADER = "# Generated from contracts/sweep_contracts/api.py by `python -m sweep_operator.crd`; do not edit.\n"


def render_crd_yaml() -> str:
    return HEADER + yaml.safe_dump(build_crd(), sort_keys=False, width=100, allow_unicode=True)


def render_ledger_crd_yaml() -> str:
    return HEADER + yaml.safe_dump(build_ledger_crd(), sort_keys=False, width=100, allow_unicode=True)


def openapi_schema() -> dict[str, Any]:
    """The CRD's openAPIV3Schema (for validating manifests without an API server)."""
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def render_reference_markdown() -> str:
    """docs/trainingsweep-reference.md: every spec field with type, default and description, from the models."""
    lines = [
        "<!-- Generated from contracts/sweep_contracts/api.py by `make crd`; do not edit. -->",
        "# TrainingSweep reference (sweeps.dev/v1alpha1)",
        "",
        "`kubectl explain trainingsweep.spec --recursive` shows the same text from the installed CRD.",
        "",
        "| field | type | default | description |",
        "|---|---|---|---|",
    ]

    def type_of(prop: dict[str, Any]) -> str:
        if prop.get("x-kubernetes-int-or-string"):
            return "quantity"
        if "enum" in prop:
            return " \\| ".join(f"`{v}`" for v in prop["enum"])
        if prop.get("type") == "array":
            return f"list of {type_of(prop.get('items', {}))}"
        return prop.get("type", "any")

    def walk(schema: dict[str, Any], path: str) -> None:
        required = set(schema.get("required", []))
        for name, prop in schema.get("properties", {}).items():
            here = f"{path}.{name}"
            if "default" in prop and prop["default"] not in ({}, []):
                default = f"`{json.dumps(prop['default'])}`"
            else:
                default = "**required**" if name in required else ""
            description = (prop.get("description") or "").replace("|", "\\|").replace("\n", " ")
            lines.append(f"| `{here}` | {type_of(prop)} | {default} | {description} |")
            if prop.get("type") == "object" and "properties" in prop:
                walk(prop, here)
            if prop.get("type") == "array" and "properties" in prop.get("items", {}):
                walk(prop["items"], here + "[]")

    walk(openapi_schema()["properties"]["spec"], "spec")
    lines += ["", "Cross-field rules the API server enforces (CEL):", ""]
    lines += [f"- `{rule['rule']}`: {rule['message']}" for rule in SPEC_RULES]
    lines += [
        "",
        "Rules on the whole object (CEL; `oldSelf` rules apply to updates): what a resume may not change:",
        "",
    ]
    lines += [f"- `{rule.field}`: {rule.message} (`{rule.rule}`)" for rule in RESUME_RULES]
    lines += ["", "Printer columns (`kubectl get tsw`): " + ", ".join(c["name"].upper() for c in PRINTER_COLUMNS), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    if "--markdown" in sys.argv[1:]:
        print(render_reference_markdown(), end="")
    elif "--ledger" in sys.argv[1:]:
        print(render_ledger_crd_yaml(), end="")
    else:
        print(render_crd_yaml(), end="")
