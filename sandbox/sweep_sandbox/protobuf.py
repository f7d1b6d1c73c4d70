"""Protobuf request bodies for the emulator: kubectl sends the built-in kinds it builds itself (`kubectl create
namespace`, `secret`, `role`, ...) as application/vnd.kubernetes.protobuf; they are decoded into the JSON object the
same request would have carried as JSON, driven by a table of the k8s.io/api generated.proto field numbers."""

from __future__ import annotations

import base64
import datetime
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .emulator_tables import ApiError

Obj = dict[str, Any]

CONTENT_TYPE = "application/vnd.kubernetes.protobuf"
# k8s.io/apimachinery/pkg/runtime/serializer/protobuf/protobuf.go protoEncodingPrefix
MAGIC = b"k8s\x00"

# wire types (protobuf encoding: varint, 64-bit, length-delimited, 32-bit)
_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5


def is_protobuf(content_type: str | None) -> bool:
    return (content_type or "").split(";")[0].strip().lower() == CONTENT_TYPE


# ------------------------------------------------------------------------------------------------- the schema


@dataclass(frozen=True)
class Field:
    """One field of a message: its JSON name and how its value reads.

    kind: string, bytes (base64 in JSON), int, bool, time (meta/v1 Time: RFC 3339, absent when zero), raw-json
    (FieldsV1's bytes hold JSON), map-string, map-bytes, or a message name. `pointer`: a Go pointer, whose zero value
    on the wire JSON carries too; `always`: a Go field without `omitempty`, which JSON carries even when absent (its
    zero value; null for a list)."""

    name: str
    kind: str
    repeated: bool = False
    pointer: bool = False
    always: bool = False


def _f(name: str, kind: str = "string", **options: Any) -> Field:
    return Field(name, kind, **options)


# k8s.io/apimachinery pkg/apis/meta/v1/generated.proto, k8s.io/api core/v1 and rbac/v1 generated.proto
MESSAGES: dict[str, dict[int, Field]] = {
    "ObjectMeta": {
        1: _f("name"),
        2: _f("generateName"),
        3: _f("namespace"),
        4: _f("selfLink"),
        5: _f("uid"),
        6: _f("resourceVersion"),
        7: _f("generation", "int"),
        8: _f("creationTimestamp", "time"),
        9: _f("deletionTimestamp", "time"),
        10: _f("deletionGracePeriodSeconds", "int", pointer=True),
        11: _f("labels", "map-string"),
        12: _f("annotations", "map-string"),
        13: _f("ownerReferences", "OwnerReference", repeated=True),
        14: _f("finalizers", repeated=True),
        17: _f("managedFields", "ManagedFieldsEntry", repeated=True),
    },
    "OwnerReference": {
        5: _f("apiVersion"),
        1: _f("kind"),
        3: _f("name"),
        4: _f("uid"),
        6: _f("controller", "bool", pointer=True),
        7: _f("blockOwnerDeletion", "bool", pointer=True),
    },
    "ManagedFieldsEntry": {
        1: _f("manager"),
        2: _f("operation"),
        3: _f("apiVersion"),
        4: _f("time", "time"),
        6: _f("fieldsType"),
        7: _f("fieldsV1", "FieldsV1"),
        8: _f("subresource"),
    },
    "FieldsV1": {1: _f("Raw", "raw-json")},
    "LabelSelector": {
        1: _f("matchLabels", "map-string"),
        2: _f("matchExpressions", "LabelSelectorRequirement", repeated=True),
    },
    "LabelSelectorRequirement": {1: _f("key"), 2: _f("operator"), 3: _f("values", repeated=True)},
    # core/v1
    "Namespace": {1: _f("metadata", "ObjectMeta"), 2: _f("spec", "NamespaceSpec"), 3: _f("status", "NamespaceStatus")},
    "NamespaceSpec": {1: _f("finalizers", repeated=True)},
    "NamespaceStatus": {1: _f("phase"), 2: _f("conditions", "NamespaceCondition", repeated=True)},
    "NamespaceCondition": {
        1: _f("type"),
        2: _f("status"),
        4: _f("lastTransitionTime", "time"),
        5: _f("reason"),
        6: _f("message"),
    },
    "ServiceAccount": {
        1: _f("metadata", "ObjectMeta"),
        2: _f("secrets", "ObjectReference", repeated=True),
        3: _f("imagePullSecrets", "LocalObjectReference", repeated=True),
        4: _f("automountServiceAccountToken", "bool", pointer=True),
    },
    "ObjectReference": {
        1: _f("kind"),
        2: _f("namespace"),
        3: _f("name"),
        4: _f("uid"),
        5: _f("apiVersion"),
        6: _f("resourceVersion"),
        7: _f("fieldPath"),
    },
    "LocalObjectReference": {1: _f("name")},
    "Secret": {
        1: _f("metadata", "ObjectMeta"),
        5: _f("immutable", "bool", pointer=True),
        2: _f("data", "map-bytes"),
        4: _f("stringData", "map-string"),
        3: _f("type"),
    },
    "ConfigMap": {
        1: _f("metadata", "ObjectMeta"),
        4: _f("immutable", "bool", pointer=True),
        2: _f("data", "map-string"),
        3: _f("binaryData", "map-bytes"),
    },
    # rbac/v1
    "PolicyRule": {
        1: _f("verbs", repeated=True, always=True),
        2: _f("apiGroups", repeated=True),
        3: _f("resources", repeated=True),
        4: _f("resourceNames", repeated=True),
        5: _f("nonResourceURLs", repeated=True),
    },
    "AggregationRule": {1: _f("clusterRoleSelectors", "LabelSelector", repeated=True)},
    "Role": {1: _f("metadata", "ObjectMeta"), 2: _f("rules", "PolicyRule", repeated=True, always=True)},
    "ClusterRole": {
        1: _f("metadata", "ObjectMeta"),
        2: _f("rules", "PolicyRule", repeated=True, always=True),
        3: _f("aggregationRule", "AggregationRule"),
    },
    "Subject": {1: _f("kind"), 2: _f("apiGroup"), 3: _f("name"), 4: _f("namespace")},
    "RoleRef": {1: _f("apiGroup", always=True), 2: _f("kind", always=True), 3: _f("name", always=True)},
    "RoleBinding": {
        1: _f("metadata", "ObjectMeta"),
        2: _f("subjects", "Subject", repeated=True),
        3: _f("roleRef", "RoleRef"),
    },
    "ClusterRoleBinding": {
        1: _f("metadata", "ObjectMeta"),
        2: _f("subjects", "Subject", repeated=True),
        3: _f("roleRef", "RoleRef"),
    },
    # k8s.io/apimachinery pkg/runtime/generated.proto: the envelope
    "TypeMeta": {1: _f("apiVersion"), 2: _f("kind")},
    "Unknown": {
        1: _f("typeMeta", "TypeMeta"),
        2: _f("raw", "raw-bytes"),
        3: _f("contentEncoding"),
        4: _f("contentType"),
    },
}

# The kinds decoded, by the apiVersion they are served at
KINDS: dict[tuple[str, str], str] = {
    ("v1", "Namespace"): "Namespace",
    ("v1", "ServiceAccount"): "ServiceAccount",
    ("v1", "Secret"): "Secret",
    ("v1", "ConfigMap"): "ConfigMap",
    ("rbac.authorization.k8s.io/v1", "Role"): "Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "RoleBinding",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "ClusterRole",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "ClusterRoleBinding",
}


# ------------------------------------------------------------------------------------------------ the wire


class DecodeError(ValueError):
    pass


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise DecodeError("unexpected end of a varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise DecodeError("a varint longer than 10 bytes")


def wire_fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field: an int for a varint, the bytes otherwise."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise DecodeError("field number 0")
        value: int | bytes
        if wire == _VARINT:
            value, pos = _varint(buf, pos)
        elif wire == _BYTES:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise DecodeError(f"field {number}: {size} bytes announced, {len(buf) - pos} left")
            value, pos = buf[pos : pos + size], pos + size
        elif wire in (_FIXED64, _FIXED32):
            width = 8 if wire == _FIXED64 else 4
            if pos + width > len(buf):
                raise DecodeError(f"field {number}: a truncated fixed-width value")
            value, pos = buf[pos : pos + width], pos + width
        else:
            raise DecodeError(f"field {number}: unsupported wire type {wire}")
        yield number, wire, value


def _signed(value: int) -> int:
    """int64 (and int32, sign-extended) from its varint."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _time(buf: bytes) -> str | None:
    """meta/v1 Time {seconds, nanos} as its JSON form (RFC 3339, whole seconds); None for the zero time."""
    seconds = 0
    for number, wire, value in wire_fields(buf):
        if number == 1 and wire == _VARINT:
            assert isinstance(value, int)
            seconds = _signed(value)
    if not buf:
        return None
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _string(value: int | bytes, where: str) -> str:
    if not isinstance(value, bytes):
        raise DecodeError(f"{where}: expected a length-delimited value")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DecodeError(f"{where}: invalid UTF-8") from error


def _map_entry(buf: bytes, value_kind: str, where: str) -> tuple[str, str]:
    key, item = "", b""
    for number, _wire, value in wire_fields(buf):
        if number == 1:
            key = _string(value, where)
        elif number == 2:
            if not isinstance(value, bytes):
                raise DecodeError(f"{where}[{key}]: expected a length-delimited value")
            item = value
    if value_kind == "map-bytes":
        return key, base64.b64encode(item).decode()
    return key, _string(item, f"{where}[{key}]")


def _scalar(field: Field, wire: int, value: int | bytes, where: str) -> Any:
    kind = field.kind
    if kind in ("int", "bool"):
        if wire != _VARINT or not isinstance(value, int):
            raise DecodeError(f"{where}: expected a varint")
        return bool(value) if kind == "bool" else _signed(value)
    if not isinstance(value, bytes):
        raise DecodeError(f"{where}: expected a length-delimited value")
    if kind == "string":
        return _string(value, where)
    if kind == "bytes":
        return base64.b64encode(value).decode()
    if kind == "raw-bytes":
        return value
    if kind == "raw-json":
        try:
            return json.loads(value) if value else None
        except ValueError as error:
            raise DecodeError(f"{where}: not JSON") from error
    if kind == "time":
        return _time(value)
    return decode_message(value, kind, where)


def _empty(value: Any) -> bool:
    return value is None or value == "" or value == 0 or value is False


def decode_message(buf: bytes, message: str, where: str = "") -> Obj:
    """A message into its JSON object: absent fields, and zero scalars Go's JSON omits, are left out; a nested
    message present on the wire is an object even when empty (Go's JSON never omits a struct); unknown fields are
    skipped, as proto decoding does."""
    schema = MESSAGES[message]
    obj: Obj = {}
    for number, wire, value in wire_fields(buf):
        field = schema.get(number)
        if field is None:
            continue
        path = f"{where}.{field.name}" if where else field.name
        if field.kind in ("map-string", "map-bytes"):
            if not isinstance(value, bytes):
                raise DecodeError(f"{path}: expected a map entry")
            key, item = _map_entry(value, field.kind, path)
            obj.setdefault(field.name, {})[key] = item
            continue
        item = _scalar(field, wire, value, path)
        if field.repeated:
            obj.setdefault(field.name, []).append(item)
        elif item is not None and (field.pointer or field.always or not _empty(item) or isinstance(item, dict)):
            obj[field.name] = item
        else:
            obj.pop(field.name, None)  # a later zero value replaces an earlier one (the last field wins)
    for field in schema.values():
        if field.always and field.name not in obj:
            obj[field.name] = None if field.repeated else _ZERO.get(field.kind)
    return obj


_ZERO: dict[str, Any] = {"string": "", "int": 0, "bool": False}


# ---------------------------------------------------------------------------------------------- a request body


def decode_body(body: bytes, api_version: str, kind: str) -> Obj:
    """The object a protobuf request body carries, as JSON would have carried it; 400 for a body that is not one of
    `kind`, 415 for a kind this table does not know (as the real server answers a custom resource in protobuf)."""
    message = KINDS.get((api_version, kind))
    if message is None:
        raise ApiError(
            415,
            "UnsupportedMediaType",
            f"the body of the request was in an unknown format - accepted media types include: application/json, "
            f"application/yaml (the emulator decodes {CONTENT_TYPE} for "
            f"{', '.join(sorted({k for _, k in KINDS}))} only)",
        )
    if not body.startswith(MAGIC):
        raise ApiError(400, "BadRequest", "provided data does not appear to be a protobuf message, expected prefix "
                       f"{list(MAGIC)}")  # fmt: skip
    try:
        envelope = decode_message(body[len(MAGIC) :], "Unknown")
        type_meta = envelope.get("typeMeta") or {}
        if envelope.get("contentEncoding"):
            raise DecodeError(f"unsupported content encoding {envelope['contentEncoding']!r}")
        if (type_meta.get("apiVersion"), type_meta.get("kind")) != (api_version, kind):
            raise DecodeError(
                f"the object is a {type_meta.get('apiVersion')}/{type_meta.get('kind')}, not a {api_version}/{kind}"
            )
        obj = decode_message(envelope.get("raw") or b"", message)
    except DecodeError as error:
        raise ApiError(400, "BadRequest", f"unable to decode the {kind} in the request body: {error}") from error
    return {"kind": kind, "apiVersion": api_version, **obj}
