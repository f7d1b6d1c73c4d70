"""A CRD's openAPIV3Schema compiled into structural nodes (apiextensions-apiserver's schema.Structural), with the
string formats apiextensions accepts and each node's x-kubernetes-validations rules."""

from __future__ import annotations

import base64
import binascii
import datetime
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .schema_rules import CelCompiler


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


def join_path(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def every_rule(node: Node) -> Iterable[tuple[str, Rule]]:
    """(schema path, rule) for each x-kubernetes-validations rule under `node`."""
    stack: list[tuple[str, Node]] = [("", node)]
    while stack:
        path, current = stack.pop()
        for rule in current.rules:
            yield path, rule
        for name, child in current.properties.items():
            stack.append((join_path(path, name), child))
        if current.additional is not None:
            stack.append((f"{path}[*]", current.additional))
        if current.items is not None:
            stack.append((f"{path}[*]", current.items))
