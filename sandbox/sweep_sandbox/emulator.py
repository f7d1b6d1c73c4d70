"""A Kubernetes API on 127.0.0.1 for the sandbox and the tests: kmock's emulator with its gaps closed.

Adds what kopf, kubectl and the kubernetes client rely on (metadata, resourceVersion watches, subresources, tables,
garbage collection, OpenAPI, server-side apply) and custom resources as strict as kube-apiserver (schema.py).
KubernetesApiEmulator holds its collaborators: the store (emulator_store.py), the admission chain
(emulator_admission.py), the write verbs (emulator_writes.py), the garbage collector (emulator_gc.py), RBAC (rbac.py)
and the routes (emulator_routes.py); EmulatorServer (emulator_server.py) serves it from a thread.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock._internal import rendering as kmock_rendering

from sweep_contracts.timestamps import parse_time

from .admission import Admission, UserInfo
from .container_logs import ContainerLogs
from .emulator_admission import AdmissionChain
from .emulator_gc import GarbageCollector
from .emulator_routes import SERVER_VERSION, ErrorInjector, InjectedError, RequestTarget, Routes, parse_resource_path
from .emulator_server import EmulatorServer, kubeconfig_document, make_api_client
from .emulator_store import (
    FOREGROUND_FINALIZER,
    NAMESPACE_FINALIZER,
    Change,
    ChangeLog,
    ObjectStore,
    ResourceVersionExpired,
    normalize_pod_quantities,
)
from .emulator_tables import (
    BUILTIN_RESOURCES,
    KOPF_PEERING_CRDS,
    STATUS_REASONS,
    ApiError,
    PrinterColumn,
    ResourceType,
    compiled_schema,
    human_age,
    json_path_get,
    minimal_crd,
    parse_field_selector,
    parse_label_selector,
    resource_key,
)
from .emulator_writes import ObjectWrites
from .kube_values import now_rfc3339, parse_rfc3339, random_suffix
from .kuberay_crds import KUBERAY_CRDS, kuberay_crd_dir, kuberay_crds
from .rbac import Rbac, RbacObjects

# The emulator's public names, wherever they live (its collaborators' modules, the server's; kuberay_crds): one
# import path.
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


@attrs.define(kw_only=True)
class KubernetesApiEmulator(kmock.KubernetesEmulator):
    """kmock's in-memory Kubernetes API, made faithful enough for kopf, kubectl and the kubernetes client.

    It serves every resource request itself through `routes` (kmock's reactions still answer other paths) and keeps
    objects in `self.objects` (kmock's ObjectsArray, for assertions) behind `store`. Everything runs in the server's
    event loop; from other threads, go through the API or `EmulatorServer.call()`.

    Subclasses may override `_remember` (each request, as kmock's request log records it) to observe the traffic.
    """

    history_limit: int = 10  # versions kept per object in `objects[...]` history (kmock keeps all)
    request_log_limit: int = 2_000  # requests kept in kmock's request log (`list(emulator)`); 0 keeps none
    # True: a namespaced create makes its Namespace; False, as the real server: 404 NotFound without it
    auto_create_namespaces: bool = True
    errors: ErrorInjector = attrs.field(factory=ErrorInjector)
    changes: ChangeLog = attrs.field(factory=ChangeLog)
    closing: bool = attrs.field(default=False, init=False)  # watches end when set (the server is stopping)
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
    # The collaborators, made in __attrs_post_init__ (each reaches the others through this emulator)
    store: ObjectStore = attrs.field(init=False)
    admission_chain: AdmissionChain = attrs.field(init=False)
    writes: ObjectWrites = attrs.field(init=False)
    gc: GarbageCollector = attrs.field(init=False)
    rbac: Rbac = attrs.field(init=False)
    routes: Routes = attrs.field(init=False)
    _gc_task: asyncio.Task[None] | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.store = ObjectStore(self)
        self.admission_chain = AdmissionChain(self, self.store)
        self.writes = ObjectWrites(self, self.store, self.admission_chain)
        self.gc = GarbageCollector(self, self.store)
        self.rbac = Rbac(self.store, self.writes.replace_object)
        self.routes = Routes(self, self.store)
        self.store.committed.append(self.rbac.committed)
        for resource_type in BUILTIN_RESOURCES:
            self.register(resource_type)
        self.rbac.bootstrap()  # the API server's default roles and bindings (rbac.py)

    # ---- registration

    def register(self, resource_type: ResourceType) -> None:
        """Serve a resource (discovery included).

        A new schema for a kind already served defaults its stored objects, as the apiserver defaults what it reads
        from etcd (customresource codec: structuraldefaulting.Default on decode); resourceVersions stay.
        """
        types = self.store.types
        previous = types.get(resource_type.key)
        types[resource_type.key] = resource_type
        self.resources[resource_type.key] = resource_type.info()
        if previous is not None and resource_type.schema is not None and previous.schema is not resource_type.schema:
            for key in self.store.live_keys.get(resource_type.key, ()):
                resource_type.schema.apply_defaults(self.objects[key].raw)

    def install_crd(self, crd: Mapping[str, Any]) -> None:
        """Register a CRD's resources and store the CRD object, as applying it to a real cluster would."""
        for resource_type in ResourceType.from_crd(crd):
            self.register(resource_type)
        crd_type = self.store.type_for("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        key = (crd_type.key, None, crd["metadata"]["name"])
        if key not in self.objects or self.objects[key].deleted:
            self.store.store_new(crd_type, None, self.store.stamp_new(crd_type, None, copy.deepcopy(dict(crd))))

    def resource_type(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self.store.resource_type(group, version, plural)

    # ---- lifecycle (entered by EmulatorServer inside its loop)

    async def __aenter__(self) -> KubernetesApiEmulator:
        await super().__aenter__()
        self.closing = False  # a stopped server can be started again, with its objects
        self.changes._wakeup = asyncio.Event()  # bind to this loop
        self.store.pending.wakeup = asyncio.Event()
        self._gc_task = asyncio.create_task(self.gc.run_forever(), name="emulator-gc")
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.stop_watches()
        if self._gc_task is not None:
            self._gc_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._gc_task
        await super().__aexit__(*exc)

    def stop_watches(self) -> None:
        """End every watch stream (the server is stopping)."""
        self.closing = True
        self.changes.wake_all()

    # ---- HTTP (the routes) and kmock's request log

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        return await self.routes.serve(raw)

    def _remember(
        self, raw: aiohttp.web.BaseRequest, body: bytes, target: RequestTarget | None, verb: str
    ) -> kmock_rendering.Request:
        """Record one request in kmock's request log (`list(emulator)`); the routes call it for every request."""
        return self.routes.remember(raw, body, target, verb)

    # ---- the API in-process (the collaborators' verbs, for tests and the sandbox's setup)

    async def create_object(self, resource_type: ResourceType, namespace: str | None, data: Obj, **options: Any) -> Obj:
        return await self.writes.create_object(resource_type, namespace, data, **options)

    def get_object(self, resource_type: ResourceType, namespace: str | None, name: str) -> Obj:
        return self.store.get_object(resource_type, namespace, name)

    def list_objects(
        self, resource_type: ResourceType, namespace: str | None, query: Mapping[str, str], table: bool = False
    ) -> Obj:
        return self.store.list_objects(resource_type, namespace, query, table)

    def replace_object(self, resource_type: ResourceType, old: Obj, new: Obj, dry_run: bool = False) -> Obj:
        return self.writes.replace_object(resource_type, old, new, dry_run=dry_run)

    def delete_object(
        self, resource_type: ResourceType, namespace: str | None, name: str, options: Mapping[str, Any] | None = None
    ) -> tuple[Obj, bool]:
        return self.writes.delete_object(resource_type, namespace, name, options)

    def ensure_namespace(self, namespace: str) -> None:
        self.writes.ensure_namespace(namespace)

    def collect_garbage(self, full: bool = False) -> int:
        return self.gc.collect(full)

    def rbac_objects(self) -> RbacObjects:
        return self.rbac.rbac_objects()

    def authorize_request(self, user: UserInfo, method: str, path: str, query: Mapping[str, str]) -> None:
        self.rbac.authorize_request(user, method, path, query)


# --------------------------------------------------------------------------------------------------------------------
# Setup


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
        emulator.ensure_namespace(namespace)
    return emulator
