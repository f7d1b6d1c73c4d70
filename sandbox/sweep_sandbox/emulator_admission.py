"""The emulator's admission of a write: custom resources decoded (pruned, defaulted) and validated against their
schema, ObjectMeta checked, the NamespaceLifecycle plugin, then the chain over the stored admission objects."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from .admission import ADMISSION_GROUP, Admission, AdmissionDenied, AdmissionRequest, UserInfo, namespace_object
from .emulator_store import ObjectStore, _namespace_terminating
from .emulator_tables import ApiError, ResourceType, _InvalidObject, resource_key
from .object_meta import object_meta_errors
from .schema_errors import FieldError, invalid_status
from .schema_validation import unknown_field_messages

if TYPE_CHECKING:
    from .emulator import KubernetesApiEmulator

log = logging.getLogger("sweep_sandbox.emulator")

Obj = dict[str, Any]


class AdmissionChain:
    """What the API server runs on a request's object between decoding and storage; users, policies and webhook
    calls themselves are the emulator's `admission` (admission.py)."""

    def __init__(self, api: KubernetesApiEmulator, store: ObjectStore) -> None:
        self.api = api
        self.store = store

    # ---- admission of custom resources: decoding (prune, default) and validation

    def decode(
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
            self.api.unknown_fields.extend((resource_type.qualified, path) for path in pruned)
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

    def admit(self, resource_type: ResourceType, obj: Obj, old: Obj | None, status_only: bool = False) -> None:
        """customresource/strategy.go Validate/ValidateUpdate (status_strategy.go for /status): 422 Invalid."""
        assert resource_type.schema is not None
        errors = resource_type.schema.errors(obj, old, status_only=status_only)
        if errors:
            name = obj["metadata"].get("name", "")
            raise _InvalidObject(invalid_status(resource_type.kind, resource_type.group, name, errors))
        for webhook in () if status_only else list(self.api.validating_webhooks):
            hook, denials = webhook(f"{resource_type.group}/{resource_type.plural}", old, obj)
            if denials:  # field.ErrorList.ToAggregate(): one error as is, several as [a, b]
                text = denials[0] if len(denials) == 1 else f"[{', '.join(denials)}]"
                raise ApiError(403, "Forbidden", f'admission webhook "{hook}" denied the request: {text}')

    # ---- the admission chain: users, ValidatingAdmissionPolicies, mutating and validating webhooks (admission.py)

    def request(
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
        if resource_type.group == ADMISSION_GROUP or not self.configured():
            return None
        stored_namespace = (
            self.store.current(self.store.type_for("", "v1", "namespaces"), None, namespace)
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
            user or self.api.admission.authenticate(None),
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
        old = self.store.get_object(resource_type, namespace, name)
        review = self.request(resource_type, "DELETE", namespace, None, old, user, None, dry_run, name)
        if review is not None:
            await self.validate(review, None)

    def controller_may_delete(self, resource_type: ResourceType, obj: Obj, username: str) -> bool:
        """Whether the ValidatingAdmissionPolicies let a controller of kube-controller-manager (the namespace
        controller, the garbage collector) delete `obj`: they delete through the API server, so a policy that
        refuses keeps the object (and a terminating namespace waits for it, as a real one does)."""
        namespace = obj["metadata"].get("namespace") if resource_type.namespaced else None
        user = UserInfo(
            username, ("system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated")
        )
        review = self.request(resource_type, "DELETE", namespace, None, obj, user, None, False, obj["metadata"]["name"])
        bindings = self.objects("validatingadmissionpolicybindings") if review is not None else []
        if review is None or not bindings:
            return True
        labels = self.namespace_labels(namespace)
        policies = self.objects("validatingadmissionpolicies")
        try:
            self.api.admission.check_policies(review, policies, bindings, labels, None)
        except AdmissionDenied as denied:
            log.info(
                "emulator: %s may not delete %s %s: %s", username, resource_type.kind, obj["metadata"]["name"], denied
            )
            return False
        return True

    def objects(self, plural: str) -> list[Obj]:
        resource_type = self.store.resource_type(ADMISSION_GROUP, "v1", plural)
        if resource_type is None:
            return []
        return [obj for obj in self.store.live(resource_type, None) if not obj["metadata"].get("deletionTimestamp")]

    def configured(self) -> bool:
        return any(
            self.store.live_keys.get(resource_key(ADMISSION_GROUP, "v1", plural))
            for plural in (
                "validatingadmissionpolicybindings",
                "validatingwebhookconfigurations",
                "mutatingwebhookconfigurations",
            )
        )

    def namespace_labels(self, namespace: str | None) -> dict[str, str]:
        if not namespace:
            return {}
        stored = self.store.current(self.store.type_for("", "v1", "namespaces"), None, namespace)
        return dict(((stored or {}).get("metadata") or {}).get("labels") or {})

    async def mutate(self, review: AdmissionRequest) -> Obj:
        hooks = Admission.webhooks(self.objects("mutatingwebhookconfigurations"), mutating=True)
        if not hooks:
            return review.object
        return await self.api.admission.mutate(hooks, review, self.namespace_labels(review.namespace))

    async def validate(self, review: AdmissionRequest, warnings: list[str] | None) -> None:
        """The ValidatingAdmissionPolicy plugin, then the ValidatingAdmissionWebhook plugin (the default plugin
        order, kube-apiserver's options/plugins.go)."""
        labels = self.namespace_labels(review.namespace)
        bindings = self.objects("validatingadmissionpolicybindings")
        if bindings:
            policies = self.objects("validatingadmissionpolicies")
            self.api.admission.check_policies(review, policies, bindings, labels, warnings)
        hooks = Admission.webhooks(self.objects("validatingwebhookconfigurations"), mutating=False)
        if hooks:
            await self.api.admission.validate(hooks, review, labels)

    def admit_meta(self, resource_type: ResourceType, obj: Obj) -> None:
        """The ObjectMeta checks every built-in kind's strategy runs (labels, annotations, finalizers)."""
        errors = object_meta_errors(obj.get("metadata") or {})
        if errors:
            name = obj["metadata"].get("name", "")
            raise _InvalidObject(invalid_status(resource_type.kind, resource_type.group, name, errors))

    def refuse_in_terminating_namespace(self, resource_type: ResourceType, namespace: str | None, name: str) -> None:
        """The NamespaceLifecycle admission plugin, first in the chain: no create in a namespace being deleted
        (k8s.io/apiserver/pkg/admission/plugin/namespace/lifecycle/admission.go `Admit`: a Forbidden with the
        NamespaceTerminating cause; deletes and updates pass). Every kind, Events included."""
        if namespace is None:
            return
        stored = self.store.current(self.store.type_for("", "v1", "namespaces"), None, namespace)
        if stored is None and not self.api.auto_create_namespaces:  # lifecycle/admission.go: the namespace must exist
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
