"""A Kubernetes API on 127.0.0.1 for the sandbox and the tests: kmock's emulator with its gaps closed.

Adds what kopf, kubectl and the kubernetes client rely on (metadata, resourceVersion watches, subresources, tables,
garbage collection, OpenAPI, server-side apply) and custom resources as strict as kube-apiserver (schema.py).
KubernetesApiEmulator keeps the state, the write verbs and admission here; its routing (emulator_routes.py), storage
and watches (emulator_store.py) are mixins, and the resource model and tables live in emulator_tables.py.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import copy
import datetime
import json
import logging
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock
import yaml
from kmock._internal import dicts as kmock_dicts

from sweep_contracts.timestamps import parse_time

from . import schema_apply as managed_fields
from .admission import ADMISSION_GROUP, Admission, AdmissionDenied, AdmissionRequest, UserInfo, namespace_object
from .container_logs import ContainerLogs
from .emulator_routes import (
    _MERGE_PATCHES,
    SERVER_VERSION,
    ErrorInjector,
    InjectedError,
    RequestTarget,
    RoutesMixin,
    parse_resource_path,
)
from .emulator_store import (
    FOREGROUND_FINALIZER,
    NAMESPACE_FINALIZER,
    Change,
    ChangeLog,
    ResourceVersionExpired,
    StoreMixin,
    _json_copy,
    _namespace_terminating,
    _strip_directives,
    _without,
    normalize_pod_quantities,
)
from .emulator_tables import (
    BUILTIN_RESOURCES,
    KOPF_PEERING_CRDS,
    STATUS_REASONS,
    ApiError,
    PrinterColumn,
    ResourceType,
    _InvalidObject,
    compiled_schema,
    human_age,
    json_path_get,
    minimal_crd,
    parse_field_selector,
    parse_label_selector,
    resource_key,
)
from .kube_values import now_rfc3339, parse_rfc3339, random_suffix
from .kuberay_crds import KUBERAY_CRDS, kuberay_crd_dir, kuberay_crds
from .object_meta import object_meta_errors
from .rbac import RbacMixin
from .schema_errors import FieldError, GoLiteral, invalid_status
from .schema_validation import unknown_field_messages

log = logging.getLogger(__name__)

# The emulator's public names, wherever they live (emulator_routes, _store, _tables; kuberay_crds): one import path.
__all__ = [
    "BUILTIN_RESOURCES",
    "FOREGROUND_FINALIZER",
    "KOPF_PEERING_CRDS",
    "KUBERAY_CRDS",
    "NAMESPACE_FINALIZER",
    "SERVER_VERSION",
    "STATUS_REASONS",
    "ApiError",
    "Change",
    "ChangeLog",
    "EmulatorServer",
    "ErrorInjector",
    "InjectedError",
    "KubernetesApiEmulator",
    "PrinterColumn",
    "RequestTarget",
    "ResourceType",
    "ResourceVersionExpired",
    "build_emulator",
    "compiled_schema",
    "human_age",
    "json_path_get",
    "kubeconfig_document",
    "kuberay_crd_dir",
    "kuberay_crds",
    "ledger_crd",
    "make_api_client",
    "minimal_crd",
    "normalize_pod_quantities",
    "now_rfc3339",
    "parse_field_selector",
    "parse_label_selector",
    "parse_resource_path",
    "parse_rfc3339",
    "parse_time",
    "random_suffix",
    "resource_key",
    "sweep_crd",
]

Obj = dict[str, Any]
ObjectKey = tuple[kmock.resource, str | None, str]  # (resource, namespace, name), as kmock's ObjectsArray keys


# --------------------------------------------------------------------------------------------------------------------
# The emulator


@attrs.define(kw_only=True)
class KubernetesApiEmulator(RoutesMixin, RbacMixin, StoreMixin, kmock.KubernetesEmulator):
    """kmock's in-memory Kubernetes API, made faithful enough for kopf, kubectl and the kubernetes client.

    It serves every resource request itself (kmock's reactions still answer other paths) and keeps objects in
    `self.objects` (kmock's ObjectsArray, for assertions). Everything runs in the server's event loop; from other
    threads, go through the API or `EmulatorServer.call()`.
    """

    history_limit: int = 10  # versions kept per object in `objects[...]` history (kmock keeps all)
    request_log_limit: int = 2_000  # requests kept in kmock's request log (`list(emulator)`); 0 keeps none
    # True: a namespaced create makes its Namespace; False, as the real server: 404 NotFound without it
    auto_create_namespaces: bool = True
    errors: ErrorInjector = attrs.field(factory=ErrorInjector)
    changes: ChangeLog = attrs.field(factory=ChangeLog)
    _types: dict[kmock.resource, ResourceType] = attrs.field(factory=dict, init=False)
    _uids: dict[str, ObjectKey] = attrs.field(factory=dict, init=False)  # live objects by uid
    _live_keys: dict[kmock.resource, set[ObjectKey]] = attrs.field(factory=dict, init=False)
    _dependents_of: dict[str, set[ObjectKey]] = attrs.field(factory=dict, init=False)  # owner uid -> dependents
    _gc_candidates: set[ObjectKey] = attrs.field(factory=set, init=False)  # dependents to look at
    _gc_owners: set[str] = attrs.field(factory=set, init=False)  # foreground owners to look at
    _terminating: set[str] = attrs.field(factory=set, init=False)  # namespaces being drained
    _gc_wakeup: asyncio.Event | None = attrs.field(default=None, init=False)
    _gc_task: asyncio.Task[None] | None = attrs.field(default=None, init=False)
    _closing: bool = attrs.field(default=False, init=False)
    _openapi_cache: tuple[Any, dict[str, tuple[str, bytes]], bytes] | None = attrs.field(default=None, init=False)
    # (resource, field path) of every unknown field a write sent and the server pruned (Warn or Ignore), newest
    # last: a test can assert its component writes nothing a real server would drop
    unknown_fields: collections.deque[tuple[str, str]] = attrs.field(
        factory=lambda: collections.deque(maxlen=1000), init=False
    )
    # Validating admission webhooks (a stand-in registers its own, e.g. Kueue's vrayjob.kb.io): each is called with
    # ("group/plural", old or None, new) and returns (webhook name, denials); any denial refuses the write with 403.
    validating_webhooks: list[Callable[[str, Obj | None, Obj], tuple[str, list[str]]]] = attrs.field(
        factory=list, init=False
    )
    # Users by bearer token, and the API server's admission chain over the stored ValidatingAdmissionPolicies,
    # their bindings and the Mutating/ValidatingWebhookConfigurations (admission.py)
    admission: Admission = attrs.field(factory=Admission, init=False)
    # What each container printed, served by pods/log (pod_logs.py): whoever runs a container registers its output
    container_logs: ContainerLogs = attrs.field(factory=ContainerLogs, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for resource_type in BUILTIN_RESOURCES:
            self.register(resource_type)
        self.bootstrap_rbac()  # the API server's default roles and bindings (rbac.py)

    # ---- registration

    def register(self, resource_type: ResourceType) -> None:
        """Serve a resource (discovery included).

        A new schema for a kind already served defaults its stored objects, as the apiserver defaults what it reads
        from etcd (customresource codec: structuraldefaulting.Default on decode); resourceVersions stay.
        """
        previous = self._types.get(resource_type.key)
        self._types[resource_type.key] = resource_type
        self.resources[resource_type.key] = resource_type.info()
        if previous is not None and resource_type.schema is not None and previous.schema is not resource_type.schema:
            for key in self._live_keys.get(resource_type.key, ()):
                resource_type.schema.apply_defaults(self.objects[key].raw)

    def install_crd(self, crd: Mapping[str, Any]) -> None:
        """Register a CRD's resources and store the CRD object, as applying it to a real cluster would."""
        for resource_type in ResourceType.from_crd(crd):
            self.register(resource_type)
        crd_type = self._type_for("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        key = (crd_type.key, None, crd["metadata"]["name"])
        if key not in self.objects or self.objects[key].deleted:
            self._store_new(crd_type, None, self._stamp_new(crd_type, None, copy.deepcopy(dict(crd))))

    def resource_type(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._types.get(resource_key(group, version, plural))

    def _type_for(self, group: str, version: str, plural: str) -> ResourceType:
        resource_type = self.resource_type(group, version, plural)
        if resource_type is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return resource_type

    # ---- lifecycle (entered by EmulatorServer inside its loop)

    async def __aenter__(self) -> KubernetesApiEmulator:
        await super().__aenter__()
        self._closing = False  # a stopped server can be started again, with its objects
        self.changes._wakeup = asyncio.Event()  # bind to this loop
        self._gc_wakeup = asyncio.Event()
        self._gc_task = asyncio.create_task(self._collect_garbage_forever(), name="emulator-gc")
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._closing = True
        self.changes.wake_all()
        if self._gc_task is not None:
            self._gc_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._gc_task
        await super().__aexit__(*exc)

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
            self._decode(resource_type, data, directive, warnings)
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
        self._refuse_in_terminating_namespace(resource_type, namespace, (data.get("metadata") or {}).get("name") or "")
        review = self._admission_request(resource_type, "CREATE", namespace, data, None, user, None, dry_run)
        if review is not None:  # handlers/create.go: mutating admission before the registry's BeforeCreate
            mutated = await self._mutating_admission(review)
            if mutated is not data:
                data = mutated
                if resource_type.schema is not None:  # a mutated custom resource is pruned and defaulted again
                    self._decode(resource_type, data, "Ignore", None)
        obj = self._stamp_new(resource_type, namespace, data)
        name = obj["metadata"]["name"]
        if self._current(resource_type, namespace, name) is not None:
            details = {"name": name, "group": resource_type.group, "kind": resource_type.plural}
            raise ApiError(409, "AlreadyExists", f'{resource_type.qualified} "{name}" already exists', details)
        if resource_type.schema is None:
            self._admit_meta(resource_type, obj)
        if resource_type.schema is not None:
            self._admit(resource_type, obj, None)
            if applied_by is not None:
                obj["metadata"]["managedFields"] = [applied_by]
            elif manager:
                managed_fields.record(obj, None, manager, resource_type.api_version)
        if review is not None:
            review.object, review.name = obj, name
            await self._validating_admission(review, warnings)
            if self._current(resource_type, namespace, name) is not None:  # created while the webhooks answered
                details = {"name": name, "group": resource_type.group, "kind": resource_type.plural}
                raise ApiError(409, "AlreadyExists", f'{resource_type.qualified} "{name}" already exists', details)
        if dry_run:
            return obj  # dryRun=All: admitted, named and stamped, never stored
        if namespace is not None and self.auto_create_namespaces:
            self._ensure_namespace(namespace)
        return self._store_new(resource_type, namespace, obj)

    # ---- admission of custom resources: decoding (prune, default) and validation

    def _decode(
        self,
        resource_type: ResourceType,
        data: Obj,
        directive: str,
        warnings: list[str] | None,
        *,
        defaults: bool = True,
        status_only: bool = False,
        keys: set[str] | None = None,
        patched: str | None = None,
    ) -> None:
        """Prune and default a request's object in place as the CR codec does; Strict refuses unknown fields.

        apiserver/pkg/endpoints/handlers/create.go (and update.go, patch.go): a strict decoding error is a 400
        BadRequest through transformDecodeError; Warn sends one `Warning: 299` header per field.
        """
        assert resource_type.schema is not None
        pruned = resource_type.schema.decode(data, defaults=defaults, status_only=status_only, keys=keys)
        if not pruned:
            return
        if directive != "Strict":
            self.unknown_fields.extend((resource_type.qualified, path) for path in pruned)
        if directive == "Ignore":
            return
        messages = unknown_field_messages(pruned)
        if directive == "Strict" and patched is not None:
            # handlers/patch.go jsonPatcher.applyPatchToCurrentObject: NewInvalid with no kind or name, one cause
            # on the field `patch` quoting the patched object
            error = FieldError("FieldValueInvalid", "patch", patched, f"strict decoding error: {', '.join(messages)}")
            raise _InvalidObject(invalid_status("", "", "", [error]))
        if directive == "Strict":
            raise ApiError(
                400,
                "BadRequest",
                f"{resource_type.kind} in version {json.dumps(resource_type.version)} cannot be handled as a "
                f"{resource_type.kind}: strict decoding error: {', '.join(messages)}",
            )
        if warnings is not None:
            warnings.extend(messages)

    def _admit(self, resource_type: ResourceType, obj: Obj, old: Obj | None, status_only: bool = False) -> None:
        """customresource/strategy.go Validate/ValidateUpdate (status_strategy.go for /status): 422 Invalid."""
        assert resource_type.schema is not None
        errors = resource_type.schema.errors(obj, old, status_only=status_only)
        if errors:
            name = obj["metadata"].get("name", "")
            raise _InvalidObject(invalid_status(resource_type.kind, resource_type.group, name, errors))
        for webhook in () if status_only else list(self.validating_webhooks):
            hook, denials = webhook(f"{resource_type.group}/{resource_type.plural}", old, obj)
            if denials:  # field.ErrorList.ToAggregate(): one error as is, several as [a, b]
                text = denials[0] if len(denials) == 1 else f"[{', '.join(denials)}]"
                raise ApiError(403, "Forbidden", f'admission webhook "{hook}" denied the request: {text}')

    # ---- the admission chain: users, ValidatingAdmissionPolicies, mutating and validating webhooks (admission.py)

    def _admission_request(
        self,
        resource_type: ResourceType,
        operation: str,
        namespace: str | None,
        obj: Obj | None,
        old: Obj | None,
        user: UserInfo | None,
        subresource: str | None,
        dry_run: bool,
        name: str = "",
    ) -> AdmissionRequest | None:
        """The request the admission chain sees, or None where nothing could act on it: the admission
        configuration kinds themselves (never sent to webhooks or policies, as in the real server) or no
        policy binding and no webhook configuration stored. `obj` is None on a DELETE (of `old`)."""
        if resource_type.group == ADMISSION_GROUP or not self._admission_configured():
            return None
        stored_namespace = (
            self._current(self._type_for("", "v1", "namespaces"), None, namespace)
            if namespace and resource_type.namespaced
            else None
        )
        return AdmissionRequest(
            operation,
            resource_type.group,
            resource_type.version,
            resource_type.plural,
            resource_type.kind,
            namespace,
            name or str(((obj if obj is not None else old) or {}).get("metadata", {}).get("name") or ""),
            user or self.admission.authenticate(None),
            obj,
            old,
            subresource=subresource or "",
            dry_run=dry_run,
            namespaced=resource_type.namespaced,
            namespace_object=namespace_object(stored_namespace) if stored_namespace is not None else None,
        )

    async def admit_delete(
        self, resource_type: ResourceType, namespace: str | None, name: str, user: UserInfo | None, dry_run: bool
    ) -> None:
        """A DELETE through validating admission, as the registry's deleteValidation runs it (handlers/delete.go:
        policies and validating webhooks see `oldObject`, `object` null; mutating webhooks are not called)."""
        namespace = namespace if resource_type.namespaced else None
        old = self.get_object(resource_type, namespace, name)
        review = self._admission_request(resource_type, "DELETE", namespace, None, old, user, None, dry_run, name)
        if review is not None:
            await self._validating_admission(review, None)

    def controller_may_delete(self, resource_type: ResourceType, obj: Obj, username: str) -> bool:
        """Whether the ValidatingAdmissionPolicies let a controller of kube-controller-manager (the namespace
        controller, the garbage collector) delete `obj`: they delete through the API server, so a policy that
        refuses keeps the object (and a terminating namespace waits for it, as a real one does)."""
        namespace = obj["metadata"].get("namespace") if resource_type.namespaced else None
        user = UserInfo(
            username, ("system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated")
        )
        review = self._admission_request(
            resource_type, "DELETE", namespace, None, obj, user, None, False, obj["metadata"]["name"]
        )
        bindings = self._admission_objects("validatingadmissionpolicybindings") if review is not None else []
        if review is None or not bindings:
            return True
        labels = self._namespace_labels(namespace)
        policies = self._admission_objects("validatingadmissionpolicies")
        try:
            self.admission.check_policies(review, policies, bindings, labels, None)
        except AdmissionDenied as denied:
            log.info(
                "emulator: %s may not delete %s %s: %s", username, resource_type.kind, obj["metadata"]["name"], denied
            )
            return False
        return True

    def _admission_objects(self, plural: str) -> list[Obj]:
        resource_type = self.resource_type(ADMISSION_GROUP, "v1", plural)
        if resource_type is None:
            return []
        return [obj for obj in self._live(resource_type, None) if not obj["metadata"].get("deletionTimestamp")]

    def _admission_configured(self) -> bool:
        return any(
            self._live_keys.get(resource_key(ADMISSION_GROUP, "v1", plural))
            for plural in (
                "validatingadmissionpolicybindings",
                "validatingwebhookconfigurations",
                "mutatingwebhookconfigurations",
            )
        )

    def _namespace_labels(self, namespace: str | None) -> dict[str, str]:
        if not namespace:
            return {}
        stored = self._current(self._type_for("", "v1", "namespaces"), None, namespace)
        return dict(((stored or {}).get("metadata") or {}).get("labels") or {})

    async def _mutating_admission(self, review: AdmissionRequest) -> Obj:
        hooks = Admission.webhooks(self._admission_objects("mutatingwebhookconfigurations"), mutating=True)
        if not hooks:
            return review.object
        return await self.admission.mutate(hooks, review, self._namespace_labels(review.namespace))

    async def _validating_admission(self, review: AdmissionRequest, warnings: list[str] | None) -> None:
        """The ValidatingAdmissionPolicy plugin, then the ValidatingAdmissionWebhook plugin (the default plugin
        order, kube-apiserver's options/plugins.go)."""
        labels = self._namespace_labels(review.namespace)
        bindings = self._admission_objects("validatingadmissionpolicybindings")
        if bindings:
            policies = self._admission_objects("validatingadmissionpolicies")
            self.admission.check_policies(review, policies, bindings, labels, warnings)
        hooks = Admission.webhooks(self._admission_objects("validatingwebhookconfigurations"), mutating=False)
        if hooks:
            await self.admission.validate(hooks, review, labels)

    def _admit_meta(self, resource_type: ResourceType, obj: Obj) -> None:
        """The ObjectMeta checks every built-in kind's strategy runs (labels, annotations, finalizers)."""
        errors = object_meta_errors(obj.get("metadata") or {})
        if errors:
            name = obj["metadata"].get("name", "")
            raise _InvalidObject(invalid_status(resource_type.kind, resource_type.group, name, errors))

    def _refuse_in_terminating_namespace(self, resource_type: ResourceType, namespace: str | None, name: str) -> None:
        """The NamespaceLifecycle admission plugin, first in the chain: no create in a namespace being deleted
        (k8s.io/apiserver/pkg/admission/plugin/namespace/lifecycle/admission.go `Admit`: a Forbidden with the
        NamespaceTerminating cause; deletes and updates pass). Every kind, Events included."""
        if namespace is None:
            return
        stored = self._current(self._type_for("", "v1", "namespaces"), None, namespace)
        if stored is None and not self.auto_create_namespaces:  # lifecycle/admission.go: the namespace must exist
            raise ApiError(
                404, "NotFound", f'namespaces "{namespace}" not found', {"name": namespace, "kind": "namespaces"}
            )
        if stored is None or not _namespace_terminating(stored):
            return
        qualified = resource_type.qualified
        subject = f'{qualified} "{name}"' if name else qualified
        why = f"unable to create new content in namespace {namespace} because it is being terminated"
        cause = {"type": "NamespaceTerminating", "message": f"namespace {namespace} is being terminated",
                 "field": "metadata.namespace"}  # fmt: skip
        details = {"name": name, "group": resource_type.group, "kind": resource_type.plural, "causes": [cause]}
        raise ApiError(403, "Forbidden", f"{subject} is forbidden: {why}", details)

    def _ensure_namespace(self, namespace: str) -> None:
        ns_type = self._type_for("", "v1", "namespaces")
        if self._current(ns_type, None, namespace) is None:
            self._store_new(ns_type, None, self._stamp_new(ns_type, None, {"metadata": {"name": namespace}}))

    async def _update(
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
            and self._current(resource_type, namespace, name) is None
            and target.subresource is None
        ):
            return await self._apply_create(
                resource_type, namespace, name, data, manager, directive, warnings, dry_run, user
            )
        old = self.get_object(resource_type, namespace, name)
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
        review = self._admission_request(
            resource_type, "UPDATE", namespace, new, old, user, target.subresource, dry_run, name
        )
        if review is not None:  # handlers/update.go and patch.go: mutating admission, then validation
            mutated = await self._mutating_admission(review)
            if mutated is not new:
                new = mutated
                if resource_type.schema is not None:
                    self._decode(resource_type, new, "Ignore", None, status_only=target.subresource == "status")
        if resource_type.schema is None and new.get("metadata") != old.get("metadata"):
            self._admit_meta(resource_type, new)
        merged = self._merged_metadata(resource_type, old, new)
        if resource_type.schema is not None:
            if mode != "application/apply-patch+yaml" and manager:
                managed_fields.record(new, old, manager, resource_type.api_version, target.subresource)
            merged = self._merged_metadata(resource_type, old, new)
            self._admit(resource_type, merged, old, status_only=target.subresource == "status")
        if review is not None:
            review.object = merged
            await self._validating_admission(review, warnings)
            current = self._current(resource_type, namespace, name)
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
        self._decode(resource_type, new, directive, warnings, status_only=status_only, keys=touched, patched=patched)
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
            self._decode(resource_type, applied, directive, warnings, defaults=False)
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
            self._decode(resource_type, applied, directive, warnings, defaults=False)
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
            self._commit(resource_type, namespace, None, {**new})
            return new
        self._commit(resource_type, namespace, new, old)
        return new

    # ---- deleting and garbage collection

    def delete_object(
        self, resource_type: ResourceType, namespace: str | None, name: str, options: Mapping[str, Any] | None = None
    ) -> tuple[Obj, bool]:
        """Delete (or mark for deletion) one object; returns (its last state, whether it is gone)."""
        options = options or {}
        namespace = namespace if resource_type.namespaced else None
        obj = self.get_object(resource_type, namespace, name)
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
            self._orphan_dependents(obj["metadata"]["uid"])
        finalizers = list(obj["metadata"].get("finalizers", []))
        if (
            policy == "Foreground"
            and self._dependents(obj["metadata"]["uid"])
            and FOREGROUND_FINALIZER not in finalizers
        ):
            finalizers.append(FOREGROUND_FINALIZER)
        is_namespace = resource_type.group == "" and resource_type.plural == "namespaces"
        if not finalizers and not is_namespace:
            self._commit(resource_type, namespace, None, obj)
            return obj, True
        meta = {**obj["metadata"], "deletionTimestamp": now_rfc3339(), "deletionGracePeriodSeconds": 0}
        if meta.get("generation"):  # registry/generic/registry/store.go markAsDeleting
            meta["generation"] = int(meta["generation"]) + 1
        if finalizers:
            meta["finalizers"] = finalizers
        marked = {**obj, "metadata": meta}
        if is_namespace:
            marked["status"] = {**obj.get("status", {}), "phase": "Terminating"}
        self._commit(resource_type, namespace, marked, obj)
        return marked, False

    def _delete_collection(self, resource_type: ResourceType, target: RequestTarget, query: Mapping[str, str]) -> Obj:
        listed = self.list_objects(resource_type, target.namespace, query)
        for obj in listed["items"]:
            self.delete_object(resource_type, obj["metadata"].get("namespace"), obj["metadata"]["name"])
        return listed


# --------------------------------------------------------------------------------------------------------------------
# Setup and the server


def sweep_crd() -> Obj:
    """Our CRD as the operator package builds it (no repo file needed)."""
    from sweep_operator.crd import build_crd

    return build_crd()


def ledger_crd() -> Obj:
    """The GPUHourLedger CRD (the namespaces' GPU-hour ledgers), as the operator package builds it."""
    from sweep_operator.crd import build_ledger_crd

    return build_ledger_crd()


def build_emulator(**options: Any) -> KubernetesApiEmulator:
    """An emulator serving the built-in kinds, the TrainingSweep and GPUHourLedger CRDs, KubeRay's RayJob/RayCluster and kopf peering."""
    emulator = KubernetesApiEmulator(**options)
    for crd in (sweep_crd(), ledger_crd(), *kuberay_crds(), *KOPF_PEERING_CRDS):
        emulator.install_crd(crd)
    for namespace in ("default", "kube-system"):
        emulator._ensure_namespace(namespace)
    return emulator


def make_api_client(url: str, token: str | None = None, ca_file: str | None = None) -> Any:
    """A kubernetes.client.ApiClient for `url` from an explicit Configuration (no kubeconfig, no environment),
    authenticating with `token` when given (the emulator's users: admission.py), trusting `ca_file` for https."""
    import kubernetes.client

    configuration = kubernetes.client.Configuration(host=url)
    configuration.verify_ssl = ca_file is not None
    configuration.ssl_ca_cert = ca_file
    client = kubernetes.client.ApiClient(configuration)
    if token:
        client.set_default_header("Authorization", f"Bearer {token}")
    return client


def kubeconfig_document(
    url: str,
    context: str = "sandbox",
    namespace: str = "default",
    users: Mapping[str, str] | None = None,
    ca_pem: bytes | None = None,
) -> Obj:
    """A kubeconfig whose current context is `context` (token `sandbox`: the emulator's administrator); `users`
    adds a context per user (context name -> token) on the same cluster and namespace. kubectl sends a token over
    TLS only (clientcmd DirectClientConfig.ClientConfig): `ca_pem` is the certificate of an https `url`."""
    tokens = {context: "sandbox", **(users or {})}
    cluster: Obj = {"server": url}
    if ca_pem is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": cluster}],
        "users": [{"name": name, "user": {"token": token}} for name, token in tokens.items()],
        "contexts": [
            {"name": name, "context": {"cluster": context, "user": name, "namespace": namespace}} for name in tokens
        ],
        "current-context": context,
        "preferences": {},
    }


def _self_signed_server(host: str) -> tuple[bytes, Any]:
    """A certificate for `host` (an IP address SAN) signed by its own key, and a server context serving it."""
    import ipaddress
    import ssl

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes-api-emulator")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host)), x509.DNSName("localhost")]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with tempfile.TemporaryDirectory() as folder:  # load_cert_chain reads files only
        (Path(folder) / "tls.crt").write_bytes(cert_pem)
        (Path(folder) / "tls.key").write_bytes(key_pem)
        context.load_cert_chain(Path(folder) / "tls.crt", Path(folder) / "tls.key")
    return cert_pem, context


class EmulatorServer:
    """Runs a KubernetesApiEmulator on 127.0.0.1 in a background thread with its own event loop.

    with EmulatorServer() as server:          # or server.start() ... server.stop()
        server.write_kubeconfig(path)
        api = server.api_client()
    """

    def __init__(
        self,
        emulator: KubernetesApiEmulator | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        tls: bool = False,
    ) -> None:
        """`tls`: serve https with a self-signed certificate for 127.0.0.1 (`ca_pem`), which a kubeconfig with
        tokens needs: kubectl sends them over TLS only."""
        self.emulator = emulator if emulator is not None else build_emulator()
        self.host = host
        self.port = port
        self.ca_pem: bytes | None = None
        self.ca_file: str | None = None  # ca_pem in a file, for clients that read one
        self._ssl: Any = None
        if tls:
            self.ca_pem, self._ssl = _self_signed_server(host)
            self._ca_dir = tempfile.TemporaryDirectory(prefix="emulator-ca-")
            self.ca_file = str(Path(self._ca_dir.name) / "ca.crt")
            Path(self.ca_file).write_bytes(self.ca_pem)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None

    @property
    def url(self) -> str:
        if not self._ready.is_set():
            raise RuntimeError("the emulator server is not running")
        return f"{'https' if self._ssl is not None else 'http'}://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, timeout: float = 10.0) -> str:
        """Start serving; returns the URL (http://127.0.0.1:<port>)."""
        if self._thread is not None:
            raise RuntimeError("the emulator server is already running")
        self._thread = threading.Thread(target=self._run, name="kubernetes-api-emulator", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("the emulator server did not start in time")
        if self._failure is not None:
            raise RuntimeError("the emulator server failed to start") from self._failure
        return self.url

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving: watch streams end, the port closes, the thread exits."""
        if self._thread is None or self._loop is None:
            return
        if self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError("the emulator server did not stop in time")
        self._thread = None
        self._ready.clear()

    def __enter__(self) -> EmulatorServer:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def call(self, fn: Callable[[], Any], timeout: float = 10.0) -> Any:
        """Run `fn()` in the server's loop (safe access to `emulator.objects` and friends) and return its result."""
        if self._loop is None:
            raise RuntimeError("the emulator server is not running")

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def history(self, group: str, version: str, plural: str, namespace: str | None, name: str) -> list[Obj]:
        """Every retained state of one object, oldest first (a DELETED change contributes its last state)."""
        key = resource_key(group, version, plural)
        return self.call(lambda: [copy.deepcopy(c.obj) for c in self.emulator.changes.of(key, namespace, name)])

    def write_kubeconfig(
        self, path: str | Path, namespace: str = "default", users: Mapping[str, str] | None = None
    ) -> Path:
        """`users`: a context per user, context name -> token (see kubeconfig_document)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        document = kubeconfig_document(self.url, namespace=namespace, users=users, ca_pem=self.ca_pem)
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        return path

    def api_client(self, token: str | None = None) -> Any:
        return make_api_client(self.url, token, self.ca_file)

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as e:  # reported to start(); the thread must not die silently
            self._failure = e
            self._ready.set()
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stopping = asyncio.Event()
        async with self.emulator:
            server = aiohttp.web.Server(self.emulator, handler_cancellation=True)
            runner = aiohttp.web.ServerRunner(server, shutdown_timeout=1.0)
            await runner.setup()
            site = aiohttp.web.TCPSite(runner, self.host, self.port, ssl_context=self._ssl)
            await site.start()
            self.port = runner.addresses[0][1]
            self._ready.set()
            try:
                await self._stopping.wait()
            finally:
                self.emulator._closing = True
                self.emulator.changes.wake_all()
                await runner.cleanup()
                await self.emulator.admission.close()
