"""Structural schemas of CRDs as kube-apiserver applies them: one `CrdSchema` per served CRD version, compiled once,
decodes (prunes, defaults) and validates every write. Pure (no I/O)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .object_meta import DNS_SUBDOMAIN, DNS_SUBDOMAIN_MSG, object_meta_errors
from .schema_errors import OMIT, ROOT_FIELDS, FieldError, Obj
from .schema_nodes import Node, compile_node
from .schema_rules import CelCompiler, run_rules
from .schema_validation import default, prune, validate, validate_list_types

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
                "properties": {k: v for k, v in self.root.properties.items() if k not in ROOT_FIELDS},
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
            if name and not DNS_SUBDOMAIN.match(name):
                errors.append(FieldError("FieldValueInvalid", "metadata.name", name, DNS_SUBDOMAIN_MSG))
            elif len(name) > 253:
                errors.append(
                    FieldError("FieldValueInvalid", "metadata.name", name, "must be no more than 253 characters")
                )
        errors += object_meta_errors(obj.get("metadata") or {})
        body = {k: v for k, v in obj.items() if k not in ROOT_FIELDS}
        old_body: Any = {k: v for k, v in old.items() if k not in ROOT_FIELDS} if old is not None else OMIT
        if status_only:
            if self.status is not None and "status" in obj:
                old_status = old_body.get("status", OMIT) if isinstance(old_body, dict) else OMIT
                validate(obj["status"], self.status, "status", errors, old_status)
        else:
            validate(body, self.body, "", errors, old_body)
        validate_list_types(body, self.root, "", errors, old_body)
        if self.cel is not None:
            if any(e.type in _BLOCKING for e in errors):
                errors.append(FieldError("FieldValueInvalid", "<nil>", None, _NOT_CHECKED))
            else:
                run_rules(obj, self.root, "", errors, self.cel, old if old is not None else OMIT)
        return errors
