"""The OpenAPI documents kubectl reads: /openapi/v3 (a root and one document per group-version) and /openapi/v2.

Built as apiextensions-apiserver's controller/openapi/builder does for CRDs (kubectl checks a PATCH operation
with the kind's x-kubernetes-group-version-kind and a fieldValidation parameter before it leaves validation to
the server); built-in kinds get an open schema with the same operations.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable
from typing import Any

Obj = dict[str, Any]
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
LIST_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta"
STATUS = "io.k8s.apimachinery.pkg.apis.meta.v1.Status"
_META_DESCRIPTION = (
    "Standard object's metadata. More info: "
    "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"
)
_API_VERSION = (
    "APIVersion defines the versioned schema of this representation of an object. Servers should convert "
    "recognized schemas to the latest internal value, and may reject unrecognized values."
)
_KIND = "Kind is a string value representing the REST resource this object represents."

# Query parameters of a PATCH as the apiserver documents them (kubectl looks for fieldValidation by name).
_PATCH_PARAMETERS = (
    ("dryRun", "When present, indicates that modifications should not be persisted."),
    ("fieldManager", "fieldManager is a name associated with the actor or entity that is making these changes."),
    (
        "fieldValidation",
        "fieldValidation instructs the server on how to handle objects in the request (POST/PUT/"
        "PATCH) containing unknown or duplicate fields. Valid values are: Ignore, Warn (the default) "
        "and Strict.",
    ),
    (
        "force",
        'Force is going to "force" Apply requests. It means user will re-acquire conflicting fields owned '
        "by other people.",
    ),
)


def definition_name(group: str, version: str, kind: str) -> str:
    """The schema name the apiserver publishes: the group reversed (`dev.sweeps.v1alpha1.TrainingSweep`)."""
    if not group:
        return f"io.k8s.api.core.{version}.{kind}"
    if group.endswith(".k8s.io") or "." not in group:
        short = group.removesuffix(".k8s.io")
        return f"io.k8s.api.{short}.{version}.{kind}"
    return ".".join(reversed(group.split("."))) + f".{version}.{kind}"


def _gvk(group: str, version: str, kind: str) -> Obj:
    return {"group": group, "kind": kind, "version": version}


def _object_meta() -> Obj:
    strings = (
        "name",
        "generateName",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "deletionTimestamp",
        "selfLink",
    )
    properties: Obj = {key: {"type": "string"} for key in strings}
    properties["name"]["description"] = "Name must be unique within a namespace."
    properties["namespace"]["description"] = "Namespace defines the space within which each name must be unique."
    properties.update(
        {
            "generation": {"type": "integer", "format": "int64"},
            "deletionGracePeriodSeconds": {"type": "integer", "format": "int64"},
            "labels": {
                "type": "object",
                "additionalProperties": {"type": "string", "default": ""},
                "description": "Map of string keys and values that can be used to organize and categorize objects.",
            },
            "annotations": {
                "type": "object",
                "additionalProperties": {"type": "string", "default": ""},
                "description": "Annotations is an unstructured key value map stored with a resource.",
            },
            "finalizers": {
                "type": "array",
                "items": {"type": "string", "default": ""},
                "x-kubernetes-list-type": "set",
            },
            "ownerReferences": {
                "type": "array",
                "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["uid"],
            },
            "managedFields": {
                "type": "array",
                "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            },
        }
    )
    return {
        "type": "object",
        "description": "ObjectMeta is metadata that all persisted resources must have.",
        "properties": properties,
    }


def _published_schema(schema: Obj | None, group: str, version: str, kind: str, ref_prefix: str) -> Obj:
    """A CRD version's openAPIV3Schema as published: metadata a reference to ObjectMeta, the GVK extension."""
    published = copy.deepcopy(schema) if schema else {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    published.setdefault("type", "object")
    properties = published.setdefault("properties", {})
    properties["apiVersion"] = {"type": "string", "description": _API_VERSION}
    properties["kind"] = {"type": "string", "description": _KIND}
    properties["metadata"] = {"allOf": [{"$ref": f"{ref_prefix}{OBJECT_META}"}], "description": _META_DESCRIPTION}
    published["x-kubernetes-group-version-kind"] = [_gvk(group, version, kind)]
    return published


def _list_schema(group: str, version: str, kind: str, ref_prefix: str) -> Obj:
    item = definition_name(group, version, kind)
    return {
        "type": "object",
        "required": ["items"],
        "description": f"{kind}List is a list of {kind}",
        "properties": {
            "apiVersion": {"type": "string", "description": _API_VERSION},
            "kind": {"type": "string", "description": _KIND},
            "items": {"type": "array", "items": {"$ref": f"{ref_prefix}{item}"}},
            "metadata": {"allOf": [{"$ref": f"{ref_prefix}{LIST_META}"}]},
        },
        "x-kubernetes-group-version-kind": [_gvk(group, version, f"{kind}List")],
    }


def _operations(resource: Any, ref_prefix: str, v3: bool) -> Obj:
    """Path items of one resource: list/create on the collection, get/put/patch/delete on an object (+/status)."""
    group, version, kind, plural = resource.group, resource.version, resource.kind, resource.plural
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    scope = "/namespaces/{namespace}" if resource.namespaced else ""
    gvk = _gvk(group, version, kind)
    ident = "".join(p.capitalize() for p in (group.replace(".", " ").replace("-", " ").split() or ["core"]))
    ident += version.capitalize()
    ref = {"$ref": f"{ref_prefix}{definition_name(group, version, kind)}"}

    def response(schema: Obj) -> Obj:
        if v3:
            return {"description": "OK", "content": {"application/json": {"schema": schema}}}
        return {"description": "OK", "schema": schema}

    def parameter(name: str, description: str) -> Obj:
        if v3:
            return {
                "name": name,
                "in": "query",
                "description": description,
                "schema": {"type": "string", "uniqueItems": True},
            }
        return {"name": name, "in": "query", "description": description, "type": "string", "uniqueItems": True}

    def operation(action: str, verb: str, schema: Obj, body: bool = False, suffix: str = "") -> Obj:
        op: Obj = {
            "operationId": f"{verb}{ident}{'Namespaced' if resource.namespaced else ''}{kind}{suffix}",
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": gvk,
            "responses": {"200": response(schema)},
        }
        if action in ("patch", "put", "post"):
            op["parameters"] = [parameter(n, d) for n, d in _PATCH_PARAMETERS if action == "patch" or n != "force"]
        if body:
            content_types = (
                ["application/apply-patch+yaml", "application/json-patch+json", "application/merge-patch+json"]
                if action == "patch"
                else ["application/json"]
            )
            if v3:
                op["requestBody"] = {
                    "content": {t: {"schema": ref if action != "patch" else {"type": "object"}} for t in content_types},
                    "required": True,
                }
            else:
                op["consumes"] = content_types
        return op

    list_ref = {"$ref": f"{ref_prefix}{definition_name(group, version, kind + 'List')}"}
    paths: Obj = {
        f"{base}{scope}/{plural}": {
            "get": operation("list", "list", list_ref),
            "post": operation("post", "create", ref, body=True),
        },
        f"{base}{scope}/{plural}/{{name}}": {
            "get": operation("get", "read", ref),
            "put": operation("put", "replace", ref, body=True),
            "patch": operation("patch", "patch", ref, body=True),
            "delete": operation("delete", "delete", {"$ref": f"{ref_prefix}{STATUS}"}),
        },
    }
    if "status" in resource.subresources:
        paths[f"{base}{scope}/{plural}/{{name}}/status"] = {
            "get": operation("get", "read", ref, suffix="Status"),
            "put": operation("put", "replace", ref, body=True, suffix="Status"),
            "patch": operation("patch", "patch", ref, body=True, suffix="Status"),
        }
    return paths


def _common_schemas() -> Obj:
    return {
        OBJECT_META: _object_meta(),
        LIST_META: {
            "type": "object",
            "description": "ListMeta describes metadata that synthetic resources must have.",
            "properties": {
                "continue": {"type": "string"},
                "resourceVersion": {"type": "string"},
                "remainingItemCount": {"type": "integer", "format": "int64"},
            },
        },
        STATUS: {
            "type": "object",
            "description": "Status is a return value for calls that don't return other objects.",
            "x-kubernetes-preserve-unknown-fields": True,
        },
    }


def group_version_document(resources: Iterable[Any]) -> Obj:
    """/openapi/v3/apis/<group>/<version> (or api/v1): OpenAPI 3.0 paths and component schemas."""
    prefix = "#/components/schemas/"
    paths: Obj = {}
    schemas = _common_schemas()
    for resource in resources:
        paths.update(_operations(resource, prefix, v3=True))
        name = definition_name(resource.group, resource.version, resource.kind)
        schemas[name] = _published_schema(resource.openapi, resource.group, resource.version, resource.kind, prefix)
        schemas[name + "List"] = _list_schema(resource.group, resource.version, resource.kind, prefix)
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def _v2_schema(schema: Any) -> Any:
    """OpenAPI 3 schema to Swagger 2.0: component references and allOf-wrapped references rewritten."""
    if isinstance(schema, dict):
        result = {}
        for key, value in schema.items():
            if key == "$ref" and isinstance(value, str):
                result[key] = value.replace("#/components/schemas/", "#/definitions/")
            elif key == "nullable":
                continue  # not Swagger 2.0 (the apiserver drops it from v2 too)
            else:
                result[key] = _v2_schema(value)
        return result
    if isinstance(schema, list):
        return [_v2_schema(v) for v in schema]
    return schema


def swagger_document(resources: Iterable[Any]) -> Obj:
    """/openapi/v2 as JSON (the real server also speaks protobuf; kubectl reads v3 first)."""
    prefix = "#/definitions/"
    paths: Obj = {}
    definitions: Obj = {k: _v2_schema(v) for k, v in _common_schemas().items()}
    for resource in resources:
        paths.update(_operations(resource, prefix, v3=False))
        name = definition_name(resource.group, resource.version, resource.kind)
        definitions[name] = _v2_schema(
            _published_schema(resource.openapi, resource.group, resource.version, resource.kind, prefix)
        )
        definitions[name + "List"] = _list_schema(resource.group, resource.version, resource.kind, prefix)
    return {
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": paths,
        "definitions": definitions,
    }


def group_version_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def digest(document: Obj) -> str:
    """The ?hash= of a group-version document (the apiserver's ETag: a content digest)."""
    return hashlib.sha512(json.dumps(document, sort_keys=True).encode()).hexdigest()[:64].upper()
