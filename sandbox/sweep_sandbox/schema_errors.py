"""Field errors as kube-apiserver words them (field.Error, StatusReasonInvalid), and the names every schema step
shares: ObjectMeta's fields, the root fields, the marker of an absent old value."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]

# metav1.ObjectMeta's JSON fields: what decoding a CR's metadata (or an embedded resource's) keeps.
OBJECT_META_FIELDS = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    }
)
ROOT_FIELDS = ("apiVersion", "kind", "metadata")

# k8s.io/apimachinery/pkg/util/validation/field/errors.go: ErrorType and ErrorType.String().
ERROR_TYPES = {
    "FieldValueNotFound": "Not found",
    "FieldValueRequired": "Required value",
    "FieldValueDuplicate": "Duplicate value",
    "FieldValueInvalid": "Invalid value",
    "FieldValueNotSupported": "Unsupported value",
    "FieldValueForbidden": "Forbidden",
    "FieldValueTooLong": "Too long",
    "FieldValueTooMany": "Too many",
    "InternalError": "Internal error",
    "FieldValueTypeInvalid": "Invalid value",
}
_NO_VALUE_TYPES = {"FieldValueRequired", "FieldValueForbidden", "FieldValueTooLong", "InternalError"}
OMIT = object()


def go_value(value: Any) -> str:
    """A value as field.Error.ErrorBody prints it (%q for strings, %v for numbers and bools, %#v otherwise)."""
    if isinstance(value, GoLiteral):
        return str(value)
    if value is None:
        return '"null"'  # ErrorBody turns a nil value into the string "null", then quotes it
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int | float):
        return go_number(value)
    if isinstance(value, Mapping):
        inner = ", ".join(f"{json.dumps(k)}:{_go_interface(v)}" for k, v in sorted(value.items()))
        return "map[string]interface {}{" + inner + "}"
    if isinstance(value, list):
        return "[]interface {}{" + ", ".join(_go_interface(v) for v in value) + "}"
    return str(value)


def _go_interface(value: Any) -> str:
    """%#v of a value inside an interface{} container."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value}"
    if isinstance(value, float):
        return go_number(value)
    if value is None:
        return "interface {}(nil)"
    return go_value(value)


def go_number(value: float | int) -> str:
    """Go's %v of a float64/int64: integral floats print without a fraction, big and tiny ones with an exponent."""
    if isinstance(value, int):
        return str(value)
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    text = repr(value)
    if "e" in text:
        mantissa, exponent = text.split("e")
        sign = "-" if exponent.startswith("-") else "+"
        return f"{mantissa}e{sign}{exponent.lstrip('+-').zfill(2)}"
    return text


class GoLiteral(str):
    """A bad value printed verbatim (a uint64 zero prints as 0x0 under %#v)."""


@dataclass(frozen=True)
class FieldError:
    """A field.Error: `<field>: <type>: <value>: <detail>` as Error() prints it."""

    type: str
    field: str
    value: Any = OMIT
    detail: str = ""

    def body(self) -> str:
        """field.Error.ErrorBody()."""
        text = ERROR_TYPES[self.type]
        if self.type not in _NO_VALUE_TYPES and self.value is not OMIT:
            text = f"{text}: {go_value(self.value)}"
        if self.detail:
            text = f"{text}: {self.detail}"
        return text

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}"


def invalid_status(kind: str, group: str, name: str, errors: list[FieldError]) -> Obj:
    """apimachinery/pkg/api/errors.NewInvalid: the 422 metav1.Status (aggregate message without duplicates)."""
    qualified = f"{kind}.{group}" if group else kind
    messages = list(dict.fromkeys(str(e) for e in errors))
    aggregate = messages[0] if len(messages) == 1 else "[" + ", ".join(messages) + "]"
    message = f"{qualified} {json.dumps(name)} is invalid"
    if messages:
        message += f": {aggregate}"
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Invalid",
        "details": {
            "name": name,
            "group": group,
            "kind": kind,
            "causes": [{"reason": e.type, "message": e.body(), "field": e.field} for e in errors],
        },
        "code": 422,
    }
