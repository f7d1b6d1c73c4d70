"""The OpenAPI side of a CRD schema as kube-apiserver applies it: pruning unknown fields, defaulting, and the type,
format, bound and list-type checks of a write."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from .schema_errors import OBJECT_META_FIELDS, OMIT, ROOT_FIELDS, FieldError, Obj, go_number
from .schema_nodes import FORMATS, Node, join_path

# --------------------------------------------------------------------------------------------------------------------
# Pruning (apiextensions-apiserver pkg/apiserver/schema/pruning/algorithm.go PruneWithOptions)


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
                    pruned.append(join_path(join_path(path, "metadata"), key))
        if node.preserve_unknown and not node.properties and node.additional is None:
            return pruned
        for key in list(obj):
            if keep_meta and key in ROOT_FIELDS:
                continue
            child = node.properties.get(key)
            if child is None:
                child = node.additional
            if child is None:
                if not node.preserve_unknown:
                    del obj[key]
                    pruned.append(join_path(path, key))
                continue
            value = obj[key]
            if isinstance(value, dict | list):  # scalars have nothing to prune
                prune(value, child, join_path(path, key), pruned=pruned)
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


def json_type(value: Any) -> str:
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
    actual = actual or json_type(value)
    if actual == "null":
        return node.nullable
    if node.int_or_string:
        return actual in ("string", "integer")
    kind = node.type
    return not kind or actual == kind or (kind == "number" and actual == "integer")


def validate(value: Any, node: Node, path: str, errors: list[FieldError], old: Any = OMIT) -> None:
    """Append the errors of `value` against `node`; with `old`, unchanged values are ratcheted (not re-checked).

    Ratcheting as pkg/apiserver/schema/validation/ratcheting.go: an update keeps a value that is unchanged from
    the stored object even where the schema now refuses it.
    """
    if old is not OMIT and old == value and type(old) is type(value):
        return
    actual = _TYPE_NAMES.get(type(value)) or json_type(value)
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
            errors.append(FieldError("FieldValueRequired", join_path(path, name)))
    old_map = old if isinstance(old, dict) else {}
    for key, item in value.items():
        child = node.properties.get(key)
        if child is None:
            child = node.additional
        if child is None:
            continue
        validate(item, child, join_path(path, key), errors, old_map.get(key, OMIT))


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


def validate_list_types(value: Any, node: Node | None, path: str, errors: list[FieldError], old: Any = OMIT) -> None:
    """Duplicate keys of list-type map and set lists (pkg/apiserver/schema/listtype/validation.go), ratcheted:
    a value unchanged from `old` is not looked at again (strategy.go ValidateUpdate validates only new lists)."""
    if node is None or not node.list_types_below or (old is not OMIT and old == value):
        return
    if isinstance(value, dict):
        old_map = old if isinstance(old, dict) else {}
        for key, item in value.items():
            child = node.properties.get(key) or node.additional
            if child is not None and isinstance(item, dict | list):
                validate_list_types(item, child, join_path(path, key), errors, old_map.get(key, OMIT))
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
