"""Structural schemas of CRDs as kube-apiserver applies them: pruning, defaulting, OpenAPI and CEL validation.

Pure (no I/O): the emulator compiles one `CrdSchema` per CRD version and runs it on every write.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import itertools
import json
import logging
import re
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .schema_cel import CelError, compile_fast

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
_ROOT_FIELDS = ("apiVersion", "kind", "metadata")

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
_OMIT = object()


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
    value: Any = _OMIT
    detail: str = ""

    def body(self) -> str:
        """field.Error.ErrorBody()."""
        text = ERROR_TYPES[self.type]
        if self.type not in _NO_VALUE_TYPES and self.value is not _OMIT:
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


# --------------------------------------------------------------------------------------------------------------------
# Formats (k8s.io/kube-openapi/pkg/validation/strfmt/default.go, the ones apiextensions accepts)

_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_DURATION = re.compile(r"^(-?(\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h|d|w))+$")
# strfmt's hostname pattern without its Unicode classes (no CRD here uses non-ASCII host names)
_HOSTNAME = re.compile(
    r"^([a-zA-Z0-9]((-?[a-zA-Z0-9]{0,62})?)|([a-zA-Z0-9](([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)(\.)){1,}([a-zA-Z]){2,63})$"
)


def _valid_datetime(text: str) -> bool:
    if not _RFC3339.match(text):
        return False
    try:
        datetime.datetime.fromisoformat(text.replace("z", "Z").replace("Z", "+00:00").replace("t", "T"))
    except ValueError:
        return False
    return True


def _valid_date(text: str) -> bool:
    try:
        return bool(_DATE.match(text)) and datetime.date.fromisoformat(text) is not None
    except ValueError:
        return False


def _valid_byte(text: str) -> bool:
    try:
        base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def _valid_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return len(text) == 36


def _valid_ipv4(text: str) -> bool:
    parts = text.split(".")
    return len(parts) == 4 and all(p.isdigit() and int(p) <= 255 and str(int(p)) == p for p in parts)


FORMATS: dict[str, Callable[[str], bool]] = {
    "date-time": _valid_datetime,
    "datetime": _valid_datetime,
    "date": _valid_date,
    "duration": lambda t: bool(_DURATION.match(t)),
    "byte": _valid_byte,
    "uuid": _valid_uuid,
    "ipv4": _valid_ipv4,
    "hostname": lambda t: bool(_HOSTNAME.match(t)) and len(t) <= 255,
}


# --------------------------------------------------------------------------------------------------------------------
# Compiled schema nodes


@dataclass
class Rule:
    """One x-kubernetes-validations entry, compiled (CEL programs are built once per CRD version)."""

    rule: str
    message: str = ""
    message_expression: str = ""
    field_path: str = ""
    reason: str = ""
    optional_old_self: bool = False
    uses_old_self: bool = False
    program: Any = None  # cel-python's
    message_program: Any = None
    fast: Any = None  # schema_cel's closure when the rule is in its subset (checked against cel-python's by a test)
    fast_message: Any = None

    def default_message(self) -> str:
        """cel/validation.go ruleMessageOrDefault."""
        return self.message.strip() if self.message else f"failed rule: {self.rule.strip()}"

    def error_string(self) -> str:
        """cel/validation.go ruleErrorString."""
        return self.message.strip() if self.message else self.rule.strip()


@dataclass
class Node:
    """A structural schema node (apiextensions-apiserver pkg/apiserver/schema.Structural), compiled."""

    type: str = ""
    description: str = ""
    nullable: bool = False
    properties: dict[str, Node] = field(default_factory=dict)
    additional: Node | None = None  # additionalProperties schema (a map)
    items: Node | None = None
    preserve_unknown: bool = False
    embedded: bool = False
    int_or_string: bool = False
    has_default: bool = False
    default: Any = None
    enum: list[Any] | None = None
    format: str = ""
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    exclusive_maximum: bool = False
    multiple_of: float | None = None
    min_length: int | None = None
    max_length: int | None = None
    pattern: re.Pattern[str] | None = None
    pattern_text: str = ""
    min_items: int | None = None
    max_items: int | None = None
    unique_items: bool = False
    min_properties: int | None = None
    max_properties: int | None = None
    required: tuple[str, ...] = ()
    list_type: str = ""
    list_map_keys: tuple[str, ...] = ()
    rules: list[Rule] = field(default_factory=list)
    rules_below: bool = False  # some descendant has x-kubernetes-validations
    defaulted: tuple[tuple[str, Node], ...] = ()  # properties with a default
    list_types_below: bool = False  # this node or a descendant is a list-type map or set
    scalar_checks: bool = True  # a string or number here has more to pass than its type

    def child(self, key: str) -> Node | None:
        node = self.properties.get(key)
        if node is None:
            node = self.additional
        return node

    @property
    def cel_type(self) -> str:
        """The sts.Type a CEL error names as its value ("object"; "" for int-or-string)."""
        return self.type


class SchemaError(ValueError):
    """A CRD schema the emulator cannot serve: not structural, or a CEL rule that does not compile."""


def compile_node(raw: Mapping[str, Any], path: str = "", cel: CelCompiler | None = None) -> Node:
    """Compile one openAPIV3Schema (sub)tree; `path` names it in SchemaError messages."""
    node = Node()
    node.type = str(raw.get("type", ""))
    node.description = str(raw.get("description", ""))
    node.nullable = bool(raw.get("nullable", False))
    node.preserve_unknown = bool(raw.get("x-kubernetes-preserve-unknown-fields", False))
    node.embedded = bool(raw.get("x-kubernetes-embedded-resource", False))
    node.int_or_string = bool(raw.get("x-kubernetes-int-or-string", False))
    if "default" in raw:
        node.has_default, node.default = True, raw["default"]
    node.enum = list(raw["enum"]) if "enum" in raw else None
    node.format = str(raw.get("format", ""))
    for key, attr in (("minimum", "minimum"), ("maximum", "maximum"), ("multipleOf", "multiple_of")):
        if key in raw:
            setattr(node, attr, raw[key])
    node.exclusive_minimum = bool(raw.get("exclusiveMinimum", False))
    node.exclusive_maximum = bool(raw.get("exclusiveMaximum", False))
    for key, attr in (
        ("minLength", "min_length"),
        ("maxLength", "max_length"),
        ("minItems", "min_items"),
        ("maxItems", "max_items"),
        ("minProperties", "min_properties"),
        ("maxProperties", "max_properties"),
    ):
        if key in raw:
            setattr(node, attr, int(raw[key]))
    if "pattern" in raw:
        node.pattern_text = str(raw["pattern"])
        try:
            node.pattern = re.compile(node.pattern_text)
        except re.error as e:
            raise SchemaError(f"{path or '<root>'}.pattern: {e}") from e
    node.unique_items = bool(raw.get("uniqueItems", False))
    node.required = tuple(raw.get("required", ()) or ())
    node.list_type = str(raw.get("x-kubernetes-list-type", ""))
    node.list_map_keys = tuple(raw.get("x-kubernetes-list-map-keys", ()) or ())
    for name, sub in (raw.get("properties") or {}).items():
        node.properties[name] = compile_node(sub, f"{path}.{name}" if path else name, cel)
    additional = raw.get("additionalProperties")
    if isinstance(additional, Mapping):
        node.additional = compile_node(additional, f"{path}[*]", cel)
    if isinstance(raw.get("items"), Mapping):
        node.items = compile_node(raw["items"], f"{path}[*]", cel)
    for entry in raw.get("x-kubernetes-validations") or ():
        rule = Rule(
            rule=str(entry["rule"]),
            message=str(entry.get("message", "")),
            message_expression=str(entry.get("messageExpression", "")),
            field_path=str(entry.get("fieldPath", "")),
            reason=str(entry.get("reason", "")),
            optional_old_self=bool(entry.get("optionalOldSelf", False)),
        )
        if cel is not None:
            cel.compile_rule(rule, node, path)
        node.rules.append(rule)
    children = [*node.properties.values(), *(c for c in (node.additional, node.items) if c is not None)]
    node.rules_below = any(c.rules or c.rules_below for c in children)
    node.defaulted = tuple((k, c) for k, c in node.properties.items() if c.has_default)
    node.list_types_below = node.list_type in ("map", "set") or any(c.list_types_below for c in children)
    node.scalar_checks = any(
        v is not None
        for v in (
            node.enum,
            node.pattern,
            node.min_length,
            node.max_length,
            node.minimum,
            node.maximum,
            node.multiple_of,
            FORMATS.get(node.format),
        )
    )
    return node


# --------------------------------------------------------------------------------------------------------------------
# Pruning (apiextensions-apiserver pkg/apiserver/schema/pruning/algorithm.go PruneWithOptions)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def prune(
    obj: Any,
    node: Node | None,
    path: str = "",
    *,
    root: bool = False,
    pruned: list[str] | None = None,
    embedded_meta: bool = False,
) -> list[str]:
    """Drop fields the schema does not know, in place; returns their paths (`spec.foo`, `spec.items[0].bar`)."""
    pruned = [] if pruned is None else pruned
    if node is None:
        return pruned
    if isinstance(obj, dict):
        keep_meta = root or node.embedded
        if keep_meta:
            meta = obj.get("metadata")
            if isinstance(meta, dict):
                for key in [k for k in meta if k not in OBJECT_META_FIELDS]:
                    del meta[key]
                    pruned.append(_join(_join(path, "metadata"), key))
        if node.preserve_unknown and not node.properties and node.additional is None:
            return pruned
        for key in list(obj):
            if keep_meta and key in _ROOT_FIELDS:
                continue
            child = node.properties.get(key)
            if child is None:
                child = node.additional
            if child is None:
                if not node.preserve_unknown:
                    del obj[key]
                    pruned.append(_join(path, key))
                continue
            value = obj[key]
            if isinstance(value, dict | list):  # scalars have nothing to prune
                prune(value, child, _join(path, key), pruned=pruned)
    elif isinstance(obj, list) and node.items is not None:
        for index, item in enumerate(obj):
            if isinstance(item, dict | list):
                prune(item, node.items, f"{path}[{index}]", pruned=pruned)
    return pruned


# --------------------------------------------------------------------------------------------------------------------
# Defaulting (pkg/apiserver/schema/defaulting/algorithm.go Default and prunenulls.go)


def _copy(value: Any) -> Any:
    """A default's own copy (scalars are immutable)."""
    return json.loads(json.dumps(value)) if isinstance(value, dict | list) else value


def default(obj: Any, node: Node | None) -> None:
    """Fill absent fields with their schema defaults, in place, top-down (a defaulted {} gets its own defaults).

    Nulls of non-nullable fields are first dropped (PruneNonNullableNullsWithoutDefaults), then defaulted.
    """
    if node is None:
        return
    if isinstance(obj, dict):
        for key in [k for k, v in obj.items() if v is None]:
            child = node.properties.get(key)
            if child is not None and not child.nullable:
                del obj[key]
        for key, child in node.defaulted:
            if key not in obj:
                obj[key] = _copy(child.default)
        if node.additional is not None:
            for key in [k for k, v in obj.items() if v is None and k not in node.properties]:
                if not node.additional.nullable:
                    if node.additional.has_default:
                        obj[key] = _copy(node.additional.default)
                    else:
                        del obj[key]
        for key, value in obj.items():
            if isinstance(value, dict | list):
                default(value, node.child(key))
    elif isinstance(obj, list) and node.items is not None:
        for index, item in enumerate(obj):
            if item is None and node.items.has_default and not node.items.nullable:
                obj[index] = _copy(node.items.default)
            elif isinstance(item, dict | list):
                default(item, node.items)


# --------------------------------------------------------------------------------------------------------------------
# OpenAPI validation (k8s.io/kube-openapi/pkg/validation/validate, errors as validation.go
# kubeOpenAPIResultToFieldErrors converts them)


_TYPE_NAMES: dict[type, str] = {
    type(None): "null",
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "array",
    dict: "object",
}


def _json_type(value: Any) -> str:
    """The name kube-openapi's type validator reports for a value (swag's JSON type)."""
    name = _TYPE_NAMES.get(type(value))
    if name is not None:
        return name
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _type_ok(node: Node, value: Any, actual: str | None = None) -> bool:
    actual = actual or _json_type(value)
    if actual == "null":
        return node.nullable
    if node.int_or_string:
        return actual in ("string", "integer")
    kind = node.type
    return not kind or actual == kind or (kind == "number" and actual == "integer")


def validate(value: Any, node: Node, path: str, errors: list[FieldError], old: Any = _OMIT) -> None:
    """Append the errors of `value` against `node`; with `old`, unchanged values are ratcheted (not re-checked).

    Ratcheting as pkg/apiserver/schema/validation/ratcheting.go: an update keeps a value that is unchanged from
    the stored object even where the schema now refuses it.
    """
    if old is not _OMIT and old == value and type(old) is type(value):
        return
    actual = _TYPE_NAMES.get(type(value)) or _json_type(value)
    if not _type_ok(node, value, actual):
        if value is None and not node.nullable:
            # InvalidType with a "null" value: `must be of type string: "null"`
            type_name = "integer,string" if node.int_or_string else node.type
            errors.append(
                FieldError("FieldValueTypeInvalid", path, "null", f'{path} in body must be of type {type_name}: "null"')
            )
            return
        type_name = "integer,string" if node.int_or_string else node.type
        errors.append(
            FieldError("FieldValueTypeInvalid", path, actual, f'{path} in body must be of type {type_name}: "{actual}"')
        )
        return
    if actual == "null" or not (node.scalar_checks or actual in ("object", "array")):
        return
    if actual == "string":
        _validate_string(value, node, path, errors)
    elif actual in ("integer", "number"):
        _validate_number(value, node, path, errors)
    if node.enum is not None and value not in node.enum:
        values = [v if isinstance(v, str) else json.dumps(v) for v in node.enum]
        errors.append(
            FieldError(
                "FieldValueNotSupported", path, value, "supported values: " + ", ".join(json.dumps(v) for v in values)
            )
        )
    if actual == "object":
        _validate_object(value, node, path, errors, old)
    elif actual == "array":
        _validate_array(value, node, path, errors, old)


def _validate_string(value: str, node: Node, path: str, errors: list[FieldError]) -> None:
    length = len(value)  # kube-openapi counts runes (utf8.RuneCountInString)
    if node.max_length is not None and length > node.max_length:
        errors.append(FieldError("FieldValueTooLong", path, value, f"may not be longer than {node.max_length}"))
    if node.min_length is not None and length < node.min_length:
        errors.append(
            FieldError(
                "FieldValueInvalid", path, value, f"{path} in body should be at least {node.min_length} chars long"
            )
        )
    if node.pattern is not None and not node.pattern.search(value):
        errors.append(
            FieldError("FieldValueInvalid", path, value, f"{path} in body should match '{node.pattern_text}'")
        )
    check = FORMATS.get(node.format)
    if check is not None and not check(value):
        errors.append(
            FieldError(
                "FieldValueTypeInvalid",
                path,
                value,
                f"{path} in body must be of type {node.format}: {json.dumps(value)}",
            )
        )


def _validate_number(value: float, node: Node, path: str, errors: list[FieldError]) -> None:
    if node.maximum is not None:
        if node.exclusive_maximum and value >= node.maximum:
            errors.append(
                FieldError(
                    "FieldValueInvalid", path, value, f"{path} in body should be less than {go_number(node.maximum)}"
                )
            )
        elif not node.exclusive_maximum and value > node.maximum:
            errors.append(
                FieldError(
                    "FieldValueInvalid",
                    path,
                    value,
                    f"{path} in body should be less than or equal to {go_number(node.maximum)}",
                )
            )
    if node.minimum is not None:
        if node.exclusive_minimum and value <= node.minimum:
            errors.append(
                FieldError(
                    "FieldValueInvalid", path, value, f"{path} in body should be greater than {go_number(node.minimum)}"
                )
            )
        elif not node.exclusive_minimum and value < node.minimum:
            errors.append(
                FieldError(
                    "FieldValueInvalid",
                    path,
                    value,
                    f"{path} in body should be greater than or equal to {go_number(node.minimum)}",
                )
            )
    if node.multiple_of and (value / node.multiple_of) != int(value / node.multiple_of):
        errors.append(
            FieldError(
                "FieldValueInvalid",
                path,
                value,
                f"{path} in body should be a multiple of {go_number(node.multiple_of)}",
            )
        )


def _validate_object(value: Obj, node: Node, path: str, errors: list[FieldError], old: Any) -> None:
    count = len(value)
    if node.max_properties is not None and count > node.max_properties:
        errors.append(FieldError("FieldValueTooMany", path, count, f"must have at most {node.max_properties} items"))
    if node.min_properties is not None and count < node.min_properties:
        errors.append(
            FieldError(
                "FieldValueInvalid",
                path,
                count,
                f"{path} in body should have at least {node.min_properties} properties",
            )
        )
    for name in node.required:
        if name not in value:
            errors.append(FieldError("FieldValueRequired", _join(path, name)))
    old_map = old if isinstance(old, dict) else {}
    for key, item in value.items():
        child = node.properties.get(key)
        if child is None:
            child = node.additional
        if child is None:
            continue
        validate(item, child, _join(path, key), errors, old_map.get(key, _OMIT))


def _validate_array(value: list[Any], node: Node, path: str, errors: list[FieldError], old: Any) -> None:
    count = len(value)
    if node.max_items is not None and count > node.max_items:
        errors.append(FieldError("FieldValueTooMany", path, count, f"must have at most {node.max_items} items"))
    if node.min_items is not None and count < node.min_items:
        errors.append(
            FieldError("FieldValueInvalid", path, count, f"{path} in body should have at least {node.min_items} items")
        )
    if node.unique_items and len({json.dumps(v, sort_keys=True) for v in value}) != count:
        errors.append(FieldError("FieldValueInvalid", path, value, f"{path} in body shouldn't contain duplicates"))
    if node.items is not None:
        for index, item in enumerate(value):
            validate(item, node.items, f"{path}[{index}]", errors)


def validate_list_types(value: Any, node: Node | None, path: str, errors: list[FieldError], old: Any = _OMIT) -> None:
    """Duplicate keys of list-type map and set lists (pkg/apiserver/schema/listtype/validation.go), ratcheted:
    a value unchanged from `old` is not looked at again (strategy.go ValidateUpdate validates only new lists)."""
    if node is None or not node.list_types_below or (old is not _OMIT and old == value):
        return
    if isinstance(value, dict):
        old_map = old if isinstance(old, dict) else {}
        for key, item in value.items():
            child = node.properties.get(key) or node.additional
            if child is not None and isinstance(item, dict | list):
                validate_list_types(item, child, _join(path, key), errors, old_map.get(key, _OMIT))
    elif isinstance(value, list):
        if node.list_type == "map" and node.list_map_keys:
            seen: set[str] = set()
            for index, item in enumerate(value):
                if not isinstance(item, dict):
                    continue
                keys = {k: item.get(k) for k in node.list_map_keys if k in item}
                marker = json.dumps(keys, sort_keys=True)
                if marker in seen:
                    errors.append(FieldError("FieldValueDuplicate", f"{path}[{index}]", keys))
                seen.add(marker)
        elif node.list_type == "set":
            seen = set()
            for index, item in enumerate(value):
                marker = json.dumps(item, sort_keys=True)
                if marker in seen:
                    errors.append(FieldError("FieldValueDuplicate", f"{path}[{index}]", item))
                seen.add(marker)
        if node.items is not None:
            for index, item in enumerate(value):
                if isinstance(item, dict | list):
                    validate_list_types(item, node.items, f"{path}[{index}]", errors)


def unknown_field_messages(paths: Iterable[str]) -> list[str]:
    """What strict decoding reports per pruned field (`unknown field "spec.foo"`)."""
    return [f"unknown field {json.dumps(p)}" for p in paths]


# --------------------------------------------------------------------------------------------------------------------
# CEL (pkg/apiserver/schema/cel/validation.go Validator.validateExpressions), evaluated by cel-python


_CEL_IDENT = re.compile(r"\b(self|oldSelf)((?:\s*\.\s*[A-Za-z_][A-Za-z0-9_]*)+)")
_CEL_CALL = re.compile(r"(?<![\w$])\.?\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(")
_CEL_MACROS = {
    "has",
    "all",
    "exists",
    "exists_one",
    "map",
    "filter",
    "size",
    "int",
    "uint",
    "double",
    "string",
    "bytes",
    "bool",
    "type",
    "duration",
    "timestamp",
    "dyn",
    "matches",
    "startsWith",
    "endsWith",
    "contains",
    "getDate",
    "getDayOfMonth",
    "getDayOfWeek",
    "getDayOfYear",
    "getFullYear",
    "getMonth",
    "getHours",
    "getMilliseconds",
    "getMinutes",
    "getSeconds",
    "list",
}


def _k8s_functions() -> dict[str, Callable[..., Any]]:
    """Kubernetes CEL library functions cel-python lacks (k8s.io/apiserver/pkg/cel/library: lists.go, strings)."""
    from celpy import celtypes

    def is_sorted(items: Any) -> Any:
        values = list(items)
        return celtypes.BoolType(all(a <= b for a, b in itertools.pairwise(values)))

    def list_sum(items: Any) -> Any:
        values = list(items)
        if not values:
            return celtypes.IntType(0)
        total = values[0]
        for value in values[1:]:
            total = total + value
        return total

    def list_min(items: Any) -> Any:
        values = list(items)
        if not values:
            raise ValueError("min called on empty list")
        return min(values)

    def list_max(items: Any) -> Any:
        values = list(items)
        if not values:
            raise ValueError("max called on empty list")
        return max(values)

    def index_of(target: Any, item: Any) -> Any:
        if isinstance(target, str):
            return celtypes.IntType(str(target).find(str(item)))
        values = list(target)
        return celtypes.IntType(values.index(item) if item in values else -1)

    def last_index_of(target: Any, item: Any) -> Any:
        if isinstance(target, str):
            return celtypes.IntType(str(target).rfind(str(item)))
        values = list(target)
        return celtypes.IntType(len(values) - 1 - values[::-1].index(item) if item in values else -1)

    def lower_ascii(text: Any) -> Any:
        return celtypes.StringType("".join(c.lower() if c.isascii() else c for c in str(text)))

    def upper_ascii(text: Any) -> Any:
        return celtypes.StringType("".join(c.upper() if c.isascii() else c for c in str(text)))

    def trim(text: Any) -> Any:
        return celtypes.StringType(str(text).strip())

    def split(text: Any, separator: Any) -> Any:
        return celtypes.ListType([celtypes.StringType(p) for p in str(text).split(str(separator))])

    def join(items: Any, separator: Any = "") -> Any:
        return celtypes.StringType(str(separator).join(str(i) for i in items))

    def replace(text: Any, old: Any, new: Any) -> Any:
        return celtypes.StringType(str(text).replace(str(old), str(new)))

    def find(text: Any, pattern: Any) -> Any:
        match = re.search(str(pattern), str(text))
        return celtypes.StringType(match.group(0) if match else "")

    def find_all(text: Any, pattern: Any) -> Any:
        return celtypes.ListType([celtypes.StringType(m.group(0)) for m in re.finditer(str(pattern), str(text))])

    return {
        "isSorted": is_sorted,
        "sum": list_sum,
        "min": list_min,
        "max": list_max,
        "indexOf": index_of,
        "lastIndexOf": last_index_of,
        "lowerAscii": lower_ascii,
        "upperAscii": upper_ascii,
        "trim": trim,
        "split": split,
        "join": join,
        "replace": replace,
        "find": find,
        "findAll": find_all,
    }


class CelCompiler:
    """Compiles x-kubernetes-validations rules once; refuses what the apiserver's type-checked compile refuses.

    cel-python only parses, so two checks stand in for cel-go's checker: every function must be known (CEL's
    standard ones or the Kubernetes library above) and every `self.a.b` chain must name declared properties
    (where the schema declares them: not through preserve-unknown, maps or int-or-string).
    """

    def __init__(self) -> None:
        import celpy

        logging.getLogger("celpy").setLevel(logging.CRITICAL)
        self._celpy = celpy
        self._interpreted_env = celpy.Environment()
        self.functions = _k8s_functions()
        self.known_functions = _CEL_MACROS | set(self.functions)

    def compile_rule(self, rule: Rule, node: Node, path: str) -> None:
        where = f"{path or '<root>'} x-kubernetes-validations {rule.rule!r}"
        rule.program = self._program(rule.rule, where)
        rule.fast = compile_fast(rule.rule)
        rule.uses_old_self = bool(re.search(r"\boldSelf\b", rule.rule))
        self._check_references(rule.rule, node, where)
        if rule.message_expression:
            rule.message_program = self._program(rule.message_expression, f"{where} messageExpression")
            rule.fast_message = compile_fast(rule.message_expression)
        if rule.field_path and not _valid_field_path(rule.field_path, node):
            raise SchemaError(f"{where}: fieldPath {rule.field_path!r} does not name a declared field")

    def _program(self, text: str, where: str) -> Any:
        for name in _CEL_CALL.findall(_strip_strings(text)):
            if name not in self.known_functions:
                raise SchemaError(f"{where}: undeclared reference to '{name}'")
        try:
            ast = self._interpreted_env.compile(text)
        except Exception as e:  # celpy's CELParseError
            raise SchemaError(f"{where}: compilation failed: {e}") from e
        # cel-python's CompiledRunner is faster but wrong on `!has(...)` (0.5.0): the interpreter only
        return self._interpreted_env.program(ast, functions=self.functions)

    @staticmethod
    def _check_references(text: str, node: Node, where: str) -> None:
        for _, chain in _CEL_IDENT.findall(_strip_strings(text)):
            current: Node | None = node
            for name in (p.strip() for p in chain.split(".") if p.strip()):
                if current is None or current.preserve_unknown or current.int_or_string or not current.type:
                    break
                if current.type != "object":
                    break  # a member call on a scalar or list (self.size()): the function check covers it
                if current.properties:
                    if name not in current.properties:
                        raise SchemaError(f"{where}: undefined field '{name}'")
                    current = current.properties[name]
                else:
                    current = current.additional
                    break

    def to_cel(self, value: Any) -> Any:
        return self._celpy.json_to_cel(value)


def _strip_strings(text: str) -> str:
    """The expression with its string literals blanked (a word in a message is no call)."""
    return re.sub(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"", "''", text)


def _valid_field_path(field_path: str, node: Node) -> bool:
    current: Node | None = node
    for name in (p for p in re.split(r"\.|\[[^\]]*\]", field_path) if p):
        if current is None:
            return False
        if current.properties and name in current.properties:
            current = current.properties[name]
            continue
        return bool(current.additional is not None or current.preserve_unknown)
    return True


def _normalized_field_path(field_path: str) -> str:
    return field_path.lstrip(".")


def _cel_error(rule: Rule, path: str, node: Node, detail: str, value: Any) -> FieldError:
    """cel/validation.go fieldErrorForReason."""
    if rule.reason == "FieldValueForbidden":
        return FieldError("FieldValueForbidden", path, detail=detail)
    if rule.reason == "FieldValueRequired":
        return FieldError("FieldValueRequired", path, detail=detail)
    if rule.reason == "FieldValueDuplicate":
        return FieldError("FieldValueDuplicate", path, value)
    return FieldError("FieldValueInvalid", path, node.cel_type, detail)


def _cel_error_text(error: Any) -> str:
    """cel-go's wording for the runtime errors a rule meets most (`no such key: metric`)."""
    if isinstance(error, CelError):
        text = str(error)
        if text == "no such overload":
            return "'no such overload': call arguments did not match a supported operator, function or macro signature"
        return text
    text = repr(getattr(error, "args", error))
    match = re.search(r"no such member in mapping: '([^']*)'", text)
    if match:
        return f"no such key: {match.group(1)}"
    if "no such overload" in text:
        return "'no such overload': call arguments did not match a supported operator, function or macro signature"
    strings = [a for a in getattr(error, "args", ()) if isinstance(a, str) and a != "evaluation error"]
    return strings[0] if strings else str(error)


def run_rules(
    value: Any,
    node: Node,
    path: str,
    errors: list[FieldError],
    cel: CelCompiler,
    old: Any = _OMIT,
) -> None:
    """Evaluate every rule under `node` for `value`; non-transition rules on values unchanged from `old` are skipped.

    Skipping an unchanged value is the apiserver's ratcheting (cel/validation.go: a non-transition rule's error on
    a correlated, unchanged value is only a warning), less the warning.
    """
    if value is None:
        return
    unchanged = old is not _OMIT and old == value
    if node.rules:
        rules = [r for r in node.rules if r.uses_old_self] if unchanged else node.rules
        if rules:
            _evaluate(value, node, rules, path, errors, cel, old)
    if unchanged or not node.rules_below:
        return
    if isinstance(value, dict):
        old_map = old if isinstance(old, dict) else {}
        for key, item in value.items():
            child = node.properties.get(key)
            child_path = _join(path, key)
            if child is None and node.additional is not None:
                child, child_path = node.additional, f"{path}[{key}]"
            if child is not None and (child.rules or child.rules_below):
                run_rules(item, child, child_path, errors, cel, old_map.get(key, _OMIT))
    elif isinstance(value, list) and node.items is not None:
        old_items = _correlate_list(old, node)
        for index, item in enumerate(value):
            key = _list_key(item, node)
            run_rules(
                item,
                node.items,
                f"{path}[{index}]",
                errors,
                cel,
                old_items.get(key, _OMIT) if key is not None else _OMIT,
            )


def _list_key(item: Any, node: Node) -> str | None:
    if node.list_type == "map" and node.list_map_keys and isinstance(item, dict):
        return json.dumps([item.get(k) for k in node.list_map_keys])
    return None


def _correlate_list(old: Any, node: Node) -> dict[str, Any]:
    """Old items by list-map key: only list-type=map items correlate (set and atomic lists do not)."""
    if not isinstance(old, list) or node.list_type != "map":
        return {}
    result = {}
    for item in old:
        key = _list_key(item, node)
        if key is not None:
            result[key] = item
    return result


_RESULTS: OrderedDict[tuple[Any, ...], list[FieldError]] = OrderedDict()
_RESULTS_LIMIT = 4096


def _evaluate(
    value: Any, node: Node, rules: list[Rule], path: str, errors: list[FieldError], cel: CelCompiler, old: Any
) -> None:
    """The rules' errors for this value, memoized: rules are pure, and cel-python's interpreter costs ~0.3 ms a rule
    (a thousand sweeps from one template pay for one)."""
    key = (
        id(node),
        len(rules),
        path,
        json.dumps(value, sort_keys=True),
        json.dumps(old, sort_keys=True) if old is not _OMIT else None,
    )
    found = _RESULTS.get(key)
    if found is None:
        found = []
        _evaluate_now(value, node, rules, path, found, cel, old)
        _RESULTS[key] = found
        if len(_RESULTS) > _RESULTS_LIMIT:
            _RESULTS.popitem(last=False)
    else:
        _RESULTS.move_to_end(key)
    errors.extend(found)


def _evaluate_now(
    value: Any, node: Node, rules: list[Rule], path: str, errors: list[FieldError], cel: CelCompiler, old: Any
) -> None:
    has_old = old is not _OMIT
    plain = {"self": value, "oldSelf": old} if has_old else {"self": value}
    activation: dict[str, Any] | None = None
    for rule in rules:
        if rule.uses_old_self and not has_old and not rule.optional_old_self:
            continue  # a transition rule runs only on an update with a correlated old value
        if rule.fast is None and activation is None:
            activation = {name: cel.to_cel(v) for name, v in plain.items()}
        try:
            result = rule.fast(plain) if rule.fast is not None else rule.program.evaluate(activation)
            if rule.fast is not None and not isinstance(result, bool):
                raise CelError("no such overload")
        except Exception as e:
            errors.append(
                FieldError(
                    "FieldValueInvalid",
                    path,
                    node.cel_type,
                    f"{_cel_error_text(e)} evaluating rule: {rule.error_string()}",
                )
            )
            continue
        if isinstance(result, Exception):
            errors.append(
                FieldError(
                    "FieldValueInvalid",
                    path,
                    node.cel_type,
                    f"{_cel_error_text(result)} evaluating rule: {rule.error_string()}",
                )
            )
            continue
        if bool(result):
            continue
        detail = rule.default_message()
        if rule.message_program is not None:
            try:
                if rule.fast_message is not None:
                    message = rule.fast_message(plain)
                else:
                    activation = activation or {name: cel.to_cel(v) for name, v in plain.items()}
                    message = rule.message_program.evaluate(activation)
                if isinstance(message, str) and message.strip() and "\n" not in message:
                    detail = message.strip()
            except Exception:
                pass  # messageExpression failures fall back to message (as the apiserver logs and does)
        field_path = path
        if rule.field_path:
            field_path = _join(path, _normalized_field_path(rule.field_path))
        errors.append(_cel_error(rule, field_path, node, detail, value))


# --------------------------------------------------------------------------------------------------------------------
# One CRD version


_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start "
    "and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)

# apimachinery/pkg/util/validation/validation.go: qualified names (label keys, finalizers) and label values
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_QUALIFIED_NAME_MSG = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
    "character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
    "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start "
    "and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for "
    "validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
_TOTAL_ANNOTATION_SIZE = 256 * 1024


def _qualified_name_errors(value: str, path: str, checked: str | None = None) -> list[FieldError]:
    """validation.go IsQualifiedName of `checked` (default `value`): `[prefix/]name`, a DNS-subdomain prefix, a
    name of at most 63; errors quote `value`."""
    errors = []
    prefix, _, name = (value if checked is None else checked).rpartition("/")
    if "/" in (value if checked is None else checked) and not prefix:
        errors.append(FieldError("FieldValueInvalid", path, value, "prefix part must be non-empty"))
    elif prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        errors.append(FieldError("FieldValueInvalid", path, value, "prefix part " + _DNS_SUBDOMAIN_MSG))
    if not name:
        errors.append(FieldError("FieldValueInvalid", path, value, "name part must be non-empty"))
    elif len(name) > 63:
        errors.append(FieldError("FieldValueInvalid", path, value, "name part must be no more than 63 characters"))
    elif not _QUALIFIED_NAME.match(name):
        errors.append(FieldError("FieldValueInvalid", path, value, _QUALIFIED_NAME_MSG))
    return errors


def object_meta_errors(meta: Mapping[str, Any]) -> list[FieldError]:
    """ValidateObjectMeta's label, annotation and finalizer checks (apimachinery/pkg/api/validation/objectmeta.go),
    which every kind's strategy runs."""
    errors: list[FieldError] = []
    for key, value in (meta.get("labels") or {}).items():
        errors += _qualified_name_errors(str(key), "metadata.labels")
        text = "" if value is None else str(value)
        if len(text) > 63:
            errors.append(
                FieldError("FieldValueInvalid", "metadata.labels", text, "must be no more than 63 characters")
            )
        elif not _LABEL_VALUE.match(text):
            errors.append(FieldError("FieldValueInvalid", "metadata.labels", text, _LABEL_VALUE_MSG))
    annotations = meta.get("annotations") or {}
    for key in annotations:
        errors += _qualified_name_errors(str(key), "metadata.annotations", str(key).lower())
    size = sum(len(str(k)) + len(str(v)) for k, v in annotations.items())
    if size > _TOTAL_ANNOTATION_SIZE:
        errors.append(
            FieldError(
                "FieldValueTooLong",
                "metadata.annotations",
                _OMIT,
                f"may not be more than {_TOTAL_ANNOTATION_SIZE} bytes",
            )
        )
    for index, finalizer in enumerate(meta.get("finalizers") or []):
        errors += _qualified_name_errors(str(finalizer), f"metadata.finalizers[{index}]")
    return errors


_CEL: CelCompiler | None = None
# customresource/strategy.go hasBlockingErr: these schema errors keep CEL rules from running at all
_BLOCKING = {
    "FieldValueNotSupported",
    "FieldValueRequired",
    "FieldValueTooLong",
    "FieldValueTooMany",
    "FieldValueTypeInvalid",
}
_NOT_CHECKED = (
    "some validation rules were not checked because the object was invalid; correct the existing errors "
    "to complete validation"
)


def cel_compiler() -> CelCompiler:
    global _CEL
    if _CEL is None:
        _CEL = CelCompiler()
    return _CEL


@dataclass
class WriteResult:
    """What a write's admission produced: the object to store, warnings, and the pruned paths."""

    obj: Obj
    warnings: list[str]
    pruned: list[str]


class CrdSchema:
    """The schema of one served CRD version, compiled once: decode (prune, default) and validate objects."""

    def __init__(self, kind: str, group: str, openapi_schema: Mapping[str, Any] | None) -> None:
        self.kind = kind
        self.group = group
        raw = dict(openapi_schema or {"type": "object", "x-kubernetes-preserve-unknown-fields": True})
        has_rules = "x-kubernetes-validations" in json.dumps(raw)
        self.cel = cel_compiler() if has_rules else None
        self.root = compile_node(raw, "", self.cel)
        self.status = self.root.properties.get("status")
        # the root without apiVersion/kind/metadata (ObjectMeta is validated on its own, as the strategy does)
        self.body = Node(
            **{
                **self.root.__dict__,
                "rules": [],
                "properties": {k: v for k, v in self.root.properties.items() if k not in _ROOT_FIELDS},
            }
        )

    def decode(
        self, obj: Obj, *, defaults: bool = True, status_only: bool = False, keys: set[str] | None = None
    ) -> list[str]:
        """Prune unknown fields and apply defaults in place, as decoding a request body does; returns the pruned.

        `status_only` decodes just `status` (a /status write keeps nothing else of the body); `keys` just those
        top-level fields (a merge patch over an object decoded before).
        """
        if keys is not None and not status_only:
            view = {k: obj[k] for k in keys if k in obj}
            pruned = prune(view, self.root, root=True)
            for key in [k for k in keys if k in obj and k not in view]:
                del obj[key]
            if defaults:
                default(view, self.root)
                obj.update({k: v for k, v in view.items() if k in keys or k not in obj})
            return pruned
        if status_only:
            if self.status is None or not isinstance(obj.get("status"), dict):
                return []
            pruned = prune(obj["status"], self.status, "status")
            if defaults:
                default(obj["status"], self.status)
            return pruned
        pruned = prune(obj, self.root, root=True)
        if defaults:
            default(obj, self.root)
        return pruned

    def apply_defaults(self, obj: Obj) -> None:
        default(obj, self.root)

    def errors(self, obj: Obj, old: Obj | None = None, *, status_only: bool = False) -> list[FieldError]:
        """Every validation error of a create (old None) or an update, as the apiserver's strategy finds them."""
        errors: list[FieldError] = []
        if old is None:
            name = (obj.get("metadata") or {}).get("name", "")
            if name and not _DNS_SUBDOMAIN.match(name):
                errors.append(FieldError("FieldValueInvalid", "metadata.name", name, _DNS_SUBDOMAIN_MSG))
            elif len(name) > 253:
                errors.append(
                    FieldError("FieldValueInvalid", "metadata.name", name, "must be no more than 253 characters")
                )
        errors += object_meta_errors(obj.get("metadata") or {})
        body = {k: v for k, v in obj.items() if k not in _ROOT_FIELDS}
        old_body: Any = {k: v for k, v in old.items() if k not in _ROOT_FIELDS} if old is not None else _OMIT
        if status_only:
            if self.status is not None and "status" in obj:
                old_status = old_body.get("status", _OMIT) if isinstance(old_body, dict) else _OMIT
                validate(obj["status"], self.status, "status", errors, old_status)
        else:
            validate(body, self.body, "", errors, old_body)
        validate_list_types(body, self.root, "", errors, old_body)
        if self.cel is not None:
            if any(e.type in _BLOCKING for e in errors):
                errors.append(FieldError("FieldValueInvalid", "<nil>", None, _NOT_CHECKED))
            else:
                run_rules(obj, self.root, "", errors, self.cel, old if old is not None else _OMIT)
        return errors


def every_rule(node: Node) -> Iterable[tuple[str, Rule]]:
    """(schema path, rule) for each x-kubernetes-validations rule under `node`."""
    stack: list[tuple[str, Node]] = [("", node)]
    while stack:
        path, current = stack.pop()
        for rule in current.rules:
            yield path, rule
        for name, child in current.properties.items():
            stack.append((_join(path, name), child))
        if current.additional is not None:
            stack.append((f"{path}[*]", current.additional))
        if current.items is not None:
            stack.append((f"{path}[*]", current.items))
