"""The emulator's write verbs: create, update and patch (merge, JSON and strategic patches, server-side apply),
replace with the server-owned metadata kept, and delete with its propagation policies."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import jsonpatch
from kmock._internal import dicts as kmock_dicts

from . import schema_apply as managed_fields
from .admission import UserInfo
from .emulator_admission import AdmissionChain
from .emulator_routes import _MERGE_PATCHES, RequestTarget
from .emulator_store import (
    FOREGROUND_FINALIZER,
    ObjectStore,
    _json_copy,
    _namespace_terminating,
    _strip_directives,
    _without,
    normalize_pod_quantities,
)
from .emulator_tables import ApiError, ResourceType, _InvalidObject
from .kube_values import now_rfc3339
from .schema_errors import FieldError, GoLiteral, invalid_status

if TYPE_CHECKING:
    from .emulator import KubernetesApiEmulator

Obj = dict[str, Any]


class ObjectWrites:
    """Each write runs decoding, admission (the chain) and the strategies' checks, then commits to the store."""

    def __init__(self, api: KubernetesApiEmulator, store: ObjectStore, chain: AdmissionChain) -> None:
        self.api = api
        self.store = store
        self.chain = chain

    async def create_object(
        self,
        resource_type: ResourceType,
        namespace: str | None,
        data: Obj,
        *,
        directive: str = "Warn",
        warnings: list[str] | None = None,
        manager: str = "",
        applied_by: Obj | None = None,
        dry_run: bool = False,
        user: UserInfo | None = None,
    ) -> Obj:
        """Create an object; `applied_by` is the managedFields entry of a server-side apply that creates it."""
        data = _json_copy(data)
        if resource_type.schema is not None:
            self.chain.decode(resource_type, data, directive, warnings)
        body_ns = (data.get("metadata") or {}).get("namespace")
        if resource_type.namespaced:
            if namespace and body_ns and body_ns != namespace:
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on the request",
                )
            namespace = namespace or body_ns or "default"
        else:
            namespace = None
        if (data.get("metadata") or {}).get("resourceVersion"):
            # storage/etcd3/store.go Create, surfaced as an internal error by the generic registry
            raise ApiError(500, "InternalError", "resourceVersion should not be set on objects to be created")
        self.chain.refuse_in_terminating_namespace(
            resource_type, namespace, (data.get("metadata") or {}).get("name") or ""
        )
        review = self.chain.request(resource_type, "CREATE", namespace, data, None, user, None, dry_run)
        if review is not None:  # handlers/create.go: mutating admission before the registry's BeforeCreate
            mutated = await self.chain.mutate(review)
            if mutated is not data:
                data = mutated
                if resource_type.schema is not None:  # a mutated custom resource is pruned and defaulted again
                    self.chain.decode(resource_type, data, "Ignore", None)
        obj = self.store.stamp_new(resource_type, namespace, data)
        name = obj["metadata"]["name"]
        if self.store.current(resource_type, namespace, name) is not None:
            details = {"name": name, "group": resource_type.group, "kind": resource_type.plural}
            raise ApiError(409, "AlreadyExists", f'{resource_type.qualified} "{name}" already exists', details)
        if resource_type.schema is None:
            self.chain.admit_meta(resource_type, obj)
        if resource_type.schema is not None:
            self.chain.admit(resource_type, obj, None)
            if applied_by is not None:
                obj["metadata"]["managedFields"] = [applied_by]
            elif manager:
                managed_fields.record(obj, None, manager, resource_type.api_version)
        if review is not None:
            review.object, review.name = obj, name
            await self.chain.validate(review, warnings)
            if self.store.current(resource_type, namespace, name) is not None:  # created while the webhooks answered
                details = {"name": name, "group": resource_type.group, "kind": resource_type.plural}
                raise ApiError(409, "AlreadyExists", f'{resource_type.qualified} "{name}" already exists', details)
        if dry_run:
            return obj  # dryRun=All: admitted, named and stamped, never stored
        if namespace is not None and self.api.auto_create_namespaces:
            self.ensure_namespace(namespace)
        return self.store.store_new(resource_type, namespace, obj)

    def ensure_namespace(self, namespace: str) -> None:
        self.store.ensure(self.store.type_for("", "v1", "namespaces"), {"metadata": {"name": namespace}})

    async def update(
        self,
        resource_type: ResourceType,
        target: RequestTarget,
        data: Any,
        mode: str,
        **options: Any,
    ) -> Obj:
        """An update or patch; redone on the object as it is now when another write landed while the admission
        webhooks answered (registry/store.go Update's GuaranteedUpdate retries on a conflict it did not ask for)."""
        for _ in range(10):
            result = await self._update_once(resource_type, target, data, mode, **options)
            if result is not None:
                return result
        raise ApiError(409, "Conflict", "the object kept changing during admission; please retry")

    async def _update_once(
        self,
        resource_type: ResourceType,
        target: RequestTarget,
        data: Any,
        mode: str,
        *,
        directive: str = "Warn",
        warnings: list[str] | None = None,
        manager: str = "",
        force: bool = False,
        dry_run: bool = False,
        user: UserInfo | None = None,
    ) -> Obj | None:
        namespace = target.namespace if resource_type.namespaced else None
        name = target.name or ""
        if target.subresource not in (None, "status"):
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({target.subresource})")
        if (
            mode == "application/apply-patch+yaml"
            and self.store.current(resource_type, namespace, name) is None
            and target.subresource is None
        ):
            return await self._apply_create(
                resource_type, namespace, name, data, manager, directive, warnings, dry_run, user
            )
        old = self.store.get_object(resource_type, namespace, name)
        if mode == "application/apply-patch+yaml":
            new = self._server_side_apply(
                resource_type, old, data, manager, force, target.subresource, directive, warnings
            )
        else:
            new = self._changed(resource_type, old, data, mode, target, directive, warnings)
        if target.subresource is None and "status" in resource_type.subresources:
            new = (
                {**new, "status": old["status"]} if "status" in old else {k: v for k, v in new.items() if k != "status"}
            )
        elif target.subresource == "status":
            new = (
                {**old, "status": new["status"]} if "status" in new else {k: v for k, v in old.items() if k != "status"}
            )
            new["metadata"] = {**old["metadata"], "managedFields": (new.get("metadata") or {}).get("managedFields")}
            if new["metadata"]["managedFields"] is None:
                del new["metadata"]["managedFields"]
        review = self.chain.request(
            resource_type, "UPDATE", namespace, new, old, user, target.subresource, dry_run, name
        )
        if review is not None:  # handlers/update.go and patch.go: mutating admission, then validation
            mutated = await self.chain.mutate(review)
            if mutated is not new:
                new = mutated
                if resource_type.schema is not None:
                    self.chain.decode(resource_type, new, "Ignore", None, status_only=target.subresource == "status")
        if resource_type.schema is None and new.get("metadata") != old.get("metadata"):
            self.chain.admit_meta(resource_type, new)
        merged = self._merged_metadata(resource_type, old, new)
        if resource_type.schema is not None:
            if mode != "application/apply-patch+yaml" and manager:
                managed_fields.record(new, old, manager, resource_type.api_version, target.subresource)
            merged = self._merged_metadata(resource_type, old, new)
            self.chain.admit(resource_type, merged, old, status_only=target.subresource == "status")
        if review is not None:
            review.object = merged
            await self.chain.validate(review, warnings)
            current = self.store.current(resource_type, namespace, name)
            if current is None or current["metadata"].get("resourceVersion") != old["metadata"].get("resourceVersion"):
                return None  # changed (or gone) while the webhooks answered: start over from what is stored
        return self.replace_object(resource_type, old, new, dry_run=dry_run)

    def _changed(
        self,
        resource_type: ResourceType,
        old: Obj,
        data: Any,
        mode: str,
        target: RequestTarget,
        directive: str,
        warnings: list[str] | None,
    ) -> Obj:
        """A replace or patch applied to the stored object, decoded (pruned, defaulted) as the request body is."""
        new = self._apply_change(resource_type, old, data, mode)
        if resource_type.schema is None:
            return new
        status_only = target.subresource == "status"
        touched = None
        if mode in _MERGE_PATCHES and isinstance(data, dict) and None not in data.values():
            # the stored object is decoded already: only what the patch reaches needs it again
            touched = {"status"} if status_only else set(data) - {"apiVersion", "kind"}
        elif mode != "replace":
            touched = {"status"} if status_only else None
        if mode != "replace":  # a merged object shares parts with the stored one: decode a copy
            new = (
                {**new, **{k: _json_copy(new[k]) for k in touched if k in new}}
                if touched is not None
                else _json_copy(new)
            )
        patched = None
        if mode != "replace" and directive == "Strict":  # what a strict refusal of a patch quotes
            patched = json.dumps(
                {**new, "metadata": {k: v for k, v in new["metadata"].items() if k != "managedFields"}},
                sort_keys=True,
                separators=(",", ":"),
            )
        self.chain.decode(
            resource_type, new, directive, warnings, status_only=status_only, keys=touched, patched=patched
        )
        return new

    async def _apply_create(
        self,
        resource_type: ResourceType,
        namespace: str | None,
        name: str,
        data: Any,
        manager: str,
        directive: str,
        warnings: list[str] | None,
        dry_run: bool = False,
        user: UserInfo | None = None,
    ) -> Obj:
        """An apply to a missing object creates it, the applier owning what it sent (handlers/patch.go)."""
        if not isinstance(data, dict):
            raise ApiError(400, "BadRequest", "the apply patch must be a YAML or JSON object")
        applied = copy.deepcopy(data)
        applied.setdefault("metadata", {})["name"] = applied["metadata"].get("name") or name
        if resource_type.schema is not None:
            self.chain.decode(resource_type, applied, directive, warnings, defaults=False)
        owned = managed_fields.scoped_paths(applied, None)
        entry = {
            "manager": manager,
            "operation": "Apply",
            "apiVersion": resource_type.api_version,
            "time": now_rfc3339(),
            "fieldsType": "FieldsV1",
            "fieldsV1": managed_fields.fields_v1(owned),
        }
        return await self.create_object(
            resource_type,
            namespace,
            applied,
            directive=directive,
            warnings=warnings,
            applied_by=entry,
            dry_run=dry_run,
            user=user,
        )

    def _merged_metadata(self, resource_type: ResourceType, old: Obj, new: Obj) -> Obj:
        """`new` with the server-owned metadata replace_object will restore (validation sees the stored name)."""
        meta = dict(new.get("metadata") or {})
        for owned in ("name", "namespace", "uid", "creationTimestamp", "generation"):
            if owned in old["metadata"]:
                meta[owned] = old["metadata"][owned]
        return {**new, "metadata": meta}

    def _server_side_apply(
        self,
        resource_type: ResourceType,
        old: Obj,
        data: Any,
        manager: str,
        force: bool,
        subresource: str | None,
        directive: str,
        warnings: list[str] | None,
    ) -> Obj:
        """An apply patch (application/apply-patch+yaml), merged by field ownership; see managed_fields.apply."""
        if not isinstance(data, dict):
            raise ApiError(400, "BadRequest", "the apply patch must be a YAML or JSON object")
        if not manager:
            raise ApiError(
                422,
                "Invalid",
                'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch',
            )
        applied = copy.deepcopy(data)
        if resource_type.schema is not None:
            self.chain.decode(resource_type, applied, directive, warnings, defaults=False)
        return managed_fields.apply(
            old, applied, manager, resource_type.api_version, force, subresource, defaults=resource_type.schema
        )

    def _apply_change(self, resource_type: ResourceType, old: Obj, data: Any, mode: str) -> Obj:
        if mode == "application/json-patch+json":
            if not isinstance(data, list):
                raise ApiError(400, "BadRequest", "a JSON patch must be a list of operations")
            try:
                return jsonpatch.apply_patch(copy.deepcopy(old), data, in_place=False)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
                raise ApiError(
                    422, "Invalid", f"the server rejected our request due to an error in our request: {e}"
                ) from e
        if not isinstance(data, dict):
            raise ApiError(400, "BadRequest", "the request body must be a JSON object")
        self._check_precondition(resource_type, old, data)
        if mode == "replace":
            if resource_type.custom and not (data.get("metadata") or {}).get("resourceVersion"):
                # customresource/strategy.go AllowUnconditionalUpdate is false: registry/store.go Update refuses
                error = FieldError(
                    "FieldValueInvalid",
                    "metadata.resourceVersion",
                    GoLiteral("0x0"),
                    "must be specified for an update",
                )
                raise _InvalidObject(
                    invalid_status(resource_type.plural, resource_type.group, old["metadata"]["name"], [error])
                )
            return copy.deepcopy(data)  # server-owned metadata is restored by replace_object (managedFields kept)
        if mode == "application/strategic-merge-patch+json" and resource_type.custom:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: "
                "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
            )
        if mode not in ("application/merge-patch+json", "application/strategic-merge-patch+json", "application/json"):
            raise ApiError(415, "UnsupportedMediaType", f"the emulator does not support {mode} (server-side apply)")
        try:
            return dict(kmock_dicts.merge_patch_dict(old, _strip_directives(data)))
        except ValueError as e:
            raise ApiError(422, "Invalid", str(e)) from e

    def _check_precondition(self, resource_type: ResourceType, old: Obj, data: Obj) -> None:
        wanted = (data.get("metadata") or {}).get("resourceVersion")
        if wanted and str(wanted) != old["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {resource_type.qualified} "{old["metadata"]["name"]}": '
                "the object has been modified; please apply your changes to the latest version and try again",
                {"name": old["metadata"]["name"], "group": resource_type.group, "kind": resource_type.plural},
            )

    def replace_object(self, resource_type: ResourceType, old: Obj, new: Obj, dry_run: bool = False) -> Obj:
        """Commit `new` in place of `old`, keeping server-owned metadata; finish a released deletion.

        `dry_run` (dryRun=All) stops short of the commit: the answer is what would be stored.
        """
        meta = dict(new.get("metadata") or {})
        old_meta = old["metadata"]
        for owned in (
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "resourceVersion",
        ):
            if owned in old_meta:
                meta[owned] = old_meta[owned]
            else:
                meta.pop(owned, None)
        if not meta.get("finalizers"):
            meta.pop("finalizers", None)
        if old_meta.get("deletionTimestamp"):
            added = [f for f in meta.get("finalizers", []) if f not in old_meta.get("finalizers", [])]
            if added:
                raise ApiError(
                    422,
                    "Invalid",
                    f'{resource_type.kind} "{old_meta["name"]}" is invalid: metadata.finalizers: Forbidden: '
                    f"no new finalizers can be added if the object is being deleted, found new finalizers {added}",
                )
        new = {**new, "apiVersion": resource_type.api_version, "kind": resource_type.kind, "metadata": meta}
        if resource_type.kind == "Pod" and resource_type.group == "":
            new = normalize_pod_quantities(new)
        if new == old:
            return old  # a no-op changes nothing: same resourceVersion, no watch event
        excluded = ("metadata", "status") if "status" in resource_type.subresources else ("metadata",)
        if _without(new, *excluded) != _without(old, *excluded):
            # customresource/strategy.go PrepareForUpdate: only a change outside metadata (and status, with the
            # status subresource) moves the generation
            meta["generation"] = int(old_meta.get("generation", 1)) + 1
        namespace = meta.get("namespace") if resource_type.namespaced else None
        if dry_run:
            return new
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and not _namespace_terminating(new):
            self.store.commit(resource_type, namespace, None, {**new})
            return new
        self.store.commit(resource_type, namespace, new, old)
        return new

    # ---- deleting and garbage collection

    def delete_object(
        self, resource_type: ResourceType, namespace: str | None, name: str, options: Mapping[str, Any] | None = None
    ) -> tuple[Obj, bool]:
        """Delete (or mark for deletion) one object; returns (its last state, whether it is gone)."""
        options = options or {}
        namespace = namespace if resource_type.namespaced else None
        obj = self.store.get_object(resource_type, namespace, name)
        preconditions = options.get("preconditions") or {}
        for field_name in ("uid", "resourceVersion"):
            if preconditions.get(field_name) and preconditions[field_name] != obj["metadata"].get(field_name):
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {resource_type.qualified} "{name}": Precondition failed: '
                    f"{field_name} in precondition: {preconditions[field_name]}, "
                    f"{field_name} in object meta: {obj['metadata'].get(field_name)}",
                )
        if obj["metadata"].get("deletionTimestamp"):
            return obj, False
        policy = str(options.get("propagationPolicy") or "Background")
        if policy == "Orphan" or options.get("orphanDependents") is True:
            self.api.gc.orphan_dependents(obj["metadata"]["uid"])
        finalizers = list(obj["metadata"].get("finalizers", []))
        if (
            policy == "Foreground"
            and self.api.gc.dependents(obj["metadata"]["uid"])
            and FOREGROUND_FINALIZER not in finalizers
        ):
            finalizers.append(FOREGROUND_FINALIZER)
        is_namespace = resource_type.group == "" and resource_type.plural == "namespaces"
        if not finalizers and not is_namespace:
            self.store.commit(resource_type, namespace, None, obj)
            return obj, True
        meta = {**obj["metadata"], "deletionTimestamp": now_rfc3339(), "deletionGracePeriodSeconds": 0}
        if meta.get("generation"):  # registry/generic/registry/store.go markAsDeleting
            meta["generation"] = int(meta["generation"]) + 1
        if finalizers:
            meta["finalizers"] = finalizers
        marked = {**obj, "metadata": meta}
        if is_namespace:
            marked["status"] = {**obj.get("status", {}), "phase": "Terminating"}
        self.store.commit(resource_type, namespace, marked, obj)
        return marked, False

    def delete_collection(self, resource_type: ResourceType, target: RequestTarget, query: Mapping[str, str]) -> Obj:
        listed = self.store.list_objects(resource_type, target.namespace, query)
        for obj in listed["items"]:
            self.delete_object(resource_type, obj["metadata"].get("namespace"), obj["metadata"]["name"])
        return listed
