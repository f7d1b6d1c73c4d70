"""What kube-apiserver checks of a custom resource's metadata (ValidateObjectMeta): its name, label keys and values,
annotation keys and total size, finalizer names."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .schema_errors import OMIT, FieldError

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_SUBDOMAIN_MSG = (
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
    elif prefix and (len(prefix) > 253 or not DNS_SUBDOMAIN.match(prefix)):
        errors.append(FieldError("FieldValueInvalid", path, value, "prefix part " + DNS_SUBDOMAIN_MSG))
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
                OMIT,
                f"may not be more than {_TOTAL_ANNOTATION_SIZE} bytes",
            )
        )
    for index, finalizer in enumerate(meta.get("finalizers") or []):
        errors += _qualified_name_errors(str(finalizer), f"metadata.finalizers[{index}]")
    return errors
