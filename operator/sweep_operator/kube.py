"""The operator's Kubernetes I/O: a thin, retrying wrapper over the official client (injected, never global).

Transient answers (409 on patches, 429, 5xx, connection errors) are retried with a short bounded
backoff; anything left is raised for the caller's next reconcile to converge.
"""

from __future__ import annotations

import datetime
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import orjson
import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.client.rest import RESTResponse

from sweep_contracts import constants

log = logging.getLogger(__name__)
T = TypeVar("T")
RETRY_STATUSES = frozenset({409, 429, 500, 502, 503, 504})
EVENT_NAME_PREFIX = "kopf-event-"  # kopf's posting.event_name_prefix: Events keep the names they always had


def custom_object(answer: object) -> dict[str, Any]:
    """A CustomObjectsApi answer as what it is: the client annotates it `-> object`, and with preloaded content (the
    default) it returns the decoded JSON object."""
    return cast("dict[str, Any]", answer)


PLURALS = {
    constants.KIND: constants.PLURAL,
    constants.RAYJOB_KIND: constants.RAYJOB_PLURAL,
    constants.RAYCLUSTER_KIND: constants.RAYCLUSTER_PLURAL,
}

# One pooled connection per handler thread (urllib3 otherwise keeps 10 and re-dials past them).
CONNECTION_POOL_SIZE = 32


def api_client_for_url(url: str) -> k8s.ApiClient:
    """A client for an API server at `url` without credentials (the sandbox's emulator on loopback)."""
    configuration = k8s.Configuration(host=url)
    configuration.verify_ssl = False
    configuration.connection_pool_maxsize = CONNECTION_POOL_SIZE
    return k8s.ApiClient(configuration)


def api_client_from_environment(kubeconfig: str | None = None) -> k8s.ApiClient:
    """In-cluster service account when running in a pod, else the kubeconfig (explicit path or $KUBECONFIG)."""
    from kubernetes import config

    configuration = k8s.Configuration()
    configuration.connection_pool_maxsize = CONNECTION_POOL_SIZE
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)
    else:
        config.load_kube_config(
            config_file=kubeconfig or os.environ.get("KUBECONFIG"), client_configuration=configuration
        )
    if configuration.refresh_api_key_hook is not None:
        configuration.refresh_api_key_hook = ThrottledRefresh(configuration.refresh_api_key_hook)
    return k8s.ApiClient(configuration)


class ThrottledRefresh:
    """The config loaders' credential refresh, at most once per `every` seconds. Their hook runs before every request
    and re-applies the whole configuration each time (the `host` setter alone scans the environment for proxies): a
    twentieth of the operator's CPU in a burst. Both loaders refresh a token only near its expiry (a minute for an
    in-cluster token, the exec plugin's own for a kubeconfig), so a second of throttling changes no credential.
    The loaders' hook re-installs itself when it runs; the throttle goes back in front of it."""

    def __init__(self, hook: Callable[[Any], None], every: float = 1.0) -> None:
        self.hook, self.every = hook, every
        self._last = float("-inf")
        self._lock = threading.Lock()

    def __call__(self, configuration: Any) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._last < self.every:
                return
            self._last = now
            self.hook(configuration)
            if configuration.refresh_api_key_hook is not self:
                self.hook, configuration.refresh_api_key_hook = configuration.refresh_api_key_hook, self


@functools.lru_cache(maxsize=8)
def _origin(host_url: str) -> tuple[str, str, int | None, str]:
    """(scheme, host, port, path prefix) of the client's `host` (a proxy in front of the API server may serve it
    under a path). PoolManager.request parses the whole URL on every request to find the pool; a fifth of a
    request's client CPU here."""
    parsed = urllib3.util.parse_url(host_url)
    return parsed.scheme or "http", parsed.host or "", parsed.port, (parsed.path or "").rstrip("/")


class Conflict(Exception):
    """A conditional write found a newer resourceVersion: re-read and decide again."""


@dataclass(frozen=True)
class Retry:
    attempts: int = 6
    first_delay: float = 0.05
    max_delay: float = 1.0


class KubeApi:
    """Typed-enough access to TrainingSweeps, RayJobs, RayClusters, pods and events."""

    def __init__(self, api_client: k8s.ApiClient, retry: Retry = Retry()):
        self.api_client = api_client
        self.custom = k8s.CustomObjectsApi(api_client)
        self.core = k8s.CoreV1Api(api_client)
        self.retry = retry

    # ----------------------------------------------------------------------------- plumbing
    def _send(self, method: str, path: str, body: Any, content_type: str = "application/json") -> dict[str, Any]:
        """One JSON request through the client's own connection pool, credentials (its refresh hook included) and
        headers, without its per-call model layer: argument validation, sanitising the body, json.dumps, building
        the answer. That layer cost as much CPU as the HTTP itself on the writes every sweep makes (docs/benchmarks.md);
        errors are the client's own ApiException, so callers and `_call` see what the generated methods raise."""
        client = self.api_client
        headers = {**client.default_headers, "Accept": "application/json", "Content-Type": content_type}
        client.update_params_for_auth(headers, [], ["BearerToken"], path, method, body)
        manager, data = client.rest_client.pool_manager, orjson.dumps(body)
        if type(manager) is urllib3.PoolManager:  # no proxy: straight to the API server's pool, as its urlopen does
            scheme, host, port, prefix = _origin(client.configuration.host)
            response = manager.connection_from_host(host, port, scheme).urlopen(
                method, prefix + path, body=data, headers=headers, assert_same_host=False, redirect=False
            )
        else:
            response = manager.request(method, client.configuration.host + path, body=data, headers=headers)
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(
                http_resp=RESTResponse(response), body=response.data.decode("utf-8", "replace"), data=None
            )
        return cast("dict[str, Any]", orjson.loads(response.data))

    def _call(self, fn: Callable[[], T], *, retry_conflict: bool = True) -> T:
        delay = self.retry.first_delay
        for attempt in range(self.retry.attempts):
            try:
                return fn()
            except ApiException as exc:
                retriable = exc.status in RETRY_STATUSES and (retry_conflict or exc.status != 409)
                if not retriable or attempt == self.retry.attempts - 1:
                    raise
                log.debug("retrying after HTTP %s (attempt %d)", exc.status, attempt + 1)
            except (ConnectionError, OSError) as exc:  # urllib3 wraps into these
                if attempt == self.retry.attempts - 1:
                    raise
                log.debug("retrying after %s (attempt %d)", exc, attempt + 1)
            time.sleep(delay)
            delay = min(delay * 2, self.retry.max_delay)
        raise AssertionError("unreachable")

    def _get(self, fn: Callable[[], Any], *, retry_conflict: bool = True) -> dict[str, Any] | None:
        try:
            return self._call(fn, retry_conflict=retry_conflict)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    # ----------------------------------------------------------------------- TrainingSweeps
    def get_sweep(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(
            lambda: self.custom.get_namespaced_custom_object(
                constants.GROUP, constants.VERSION, namespace, constants.PLURAL, name
            )
        )

    def list_sweeps(self, namespace: str) -> list[dict[str, Any]]:
        result = self._call(
            lambda: self.custom.list_namespaced_custom_object(
                constants.GROUP, constants.VERSION, namespace, constants.PLURAL
            )
        )
        return list(custom_object(result).get("items") or [])

    def patch_sweep_status(
        self, namespace: str, name: str, status: dict[str, Any], *, resource_version: str | None = None
    ) -> dict[str, Any] | None:
        """Merge-patch the status; with `resource_version`, only onto that version (else `Conflict`).
        Returns the patched sweep (None when it is gone)."""
        body: dict[str, Any] = {"status": status}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}

        path = f"/apis/{constants.GROUP}/{constants.VERSION}/namespaces/{namespace}/{constants.PLURAL}/{name}/status"

        def call() -> Any:
            return self._send("PATCH", path, body, "application/merge-patch+json")

        try:
            # A conditional write's 409 is an answer (re-read and decide again), never retried as it is.
            return self._get(call, retry_conflict=resource_version is None)
        except ApiException as exc:
            if exc.status == 409 and resource_version is not None:
                raise Conflict(
                    f"TrainingSweep {namespace}/{name} changed after resourceVersion {resource_version}"
                ) from None
            raise

    # ------------------------------------------------------------------------------ RayJobs
    def get_rayjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(
            lambda: self.custom.get_namespaced_custom_object(
                constants.RAY_GROUP, constants.RAY_VERSION_API, namespace, constants.RAYJOB_PLURAL, name
            )
        )

    def list_rayjobs(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        result = self._call(
            lambda: self.custom.list_namespaced_custom_object(
                constants.RAY_GROUP,
                constants.RAY_VERSION_API,
                namespace,
                constants.RAYJOB_PLURAL,
                label_selector=label_selector,
            )
        )
        return list(custom_object(result).get("items") or [])

    def list_workloads(self, namespace: str) -> list[dict[str, Any]]:
        """Kueue's Workloads in `namespace` (Kueue mode: the one a RayJob controls says where Kueue has it)."""
        result = self._call(
            lambda: self.custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", namespace, "workloads")
        )
        return list(custom_object(result).get("items") or [])

    # ------------------------------------------------------------------------- GPUHourLedgers
    def get_ledger(self, namespace: str) -> dict[str, Any] | None:
        return self._get(
            lambda: self.custom.get_namespaced_custom_object(
                constants.GROUP, constants.VERSION, namespace, constants.LEDGER_PLURAL, constants.LEDGER_NAME
            )
        )

    def write_ledger(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create the namespace's ledger (no resourceVersion) or replace it at the resourceVersion it carries;
        `Conflict` when another write came first (re-read and decide again: the reservation's atomicity)."""
        namespace = body["metadata"]["namespace"]
        if body["metadata"].get("resourceVersion"):

            def call() -> Any:
                return self.custom.replace_namespaced_custom_object(
                    constants.GROUP, constants.VERSION, namespace, constants.LEDGER_PLURAL, constants.LEDGER_NAME, body
                )

        else:

            def call() -> Any:
                return self.custom.create_namespaced_custom_object(
                    constants.GROUP, constants.VERSION, namespace, constants.LEDGER_PLURAL, body
                )

        try:
            return custom_object(self._call(call, retry_conflict=False))
        except ApiException as exc:
            if exc.status in (409, 404):  # changed, created by another, or deleted since the read
                raise Conflict(f"GPUHourLedger {namespace}/{constants.LEDGER_NAME} changed since it was read") from None
            raise

    # ------------------------------------------------------------- the record of the ledgers created
    def get_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(lambda: _json(self.core.read_namespaced_config_map(name, namespace, _preload_content=False)))

    def write_config_map(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create (no resourceVersion) or replace at the resourceVersion the body carries; `Conflict` when another
        write came first."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        path = f"/api/v1/namespaces/{namespace}/configmaps"
        replace = bool(body["metadata"].get("resourceVersion"))
        try:
            if replace:
                return self._call(lambda: self._send("PUT", f"{path}/{name}", body), retry_conflict=False)
            return self._call(lambda: self._send("POST", path, body), retry_conflict=False)
        except ApiException as exc:
            if exc.status == 409 or (replace and exc.status == 404):
                raise Conflict(f"ConfigMap {namespace}/{name} changed since it was read") from None
            raise

    def namespace_uid(self, name: str) -> str | None:
        """The namespace's uid; None where it is gone or the operator may not read namespaces (watched-namespaces
        installs grant no such right)."""
        try:
            found = self._get(lambda: _json(self.core.read_namespace(name, _preload_content=False)))
        except ApiException as exc:
            if exc.status == 403:
                return None
            raise
        return str((found or {}).get("metadata", {}).get("uid") or "") or None

    def create_rayjob(self, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Create; on AlreadyExists return the existing one. Returns (object, created)."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            path = f"/apis/{constants.RAY_GROUP}/{constants.RAY_VERSION_API}/namespaces/{namespace}/{constants.RAYJOB_PLURAL}"
            created = self._call(lambda: self._send("POST", path, body), retry_conflict=False)
            return custom_object(created), True
        except ApiException as exc:
            if exc.status != 409:
                raise
        existing = self.get_rayjob(namespace, name)
        if existing is None:
            raise RuntimeError(f"RayJob {namespace}/{name} reported as existing but cannot be read")
        return existing, False

    def patch_rayjob(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any] | None:
        return self._get(
            lambda: self.custom.patch_namespaced_custom_object(
                constants.RAY_GROUP, constants.RAY_VERSION_API, namespace, constants.RAYJOB_PLURAL, name, patch
            )
        )

    def delete_rayjob(self, namespace: str, name: str) -> bool:
        return self._delete(constants.RAYJOB_PLURAL, namespace, name)

    # -------------------------------------------------------------------------- RayClusters
    def get_raycluster(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(
            lambda: self.custom.get_namespaced_custom_object(
                constants.RAY_GROUP, constants.RAY_VERSION_API, namespace, constants.RAYCLUSTER_PLURAL, name
            )
        )

    def list_rayclusters(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        result = self._call(
            lambda: self.custom.list_namespaced_custom_object(
                constants.RAY_GROUP,
                constants.RAY_VERSION_API,
                namespace,
                constants.RAYCLUSTER_PLURAL,
                label_selector=label_selector,
            )
        )
        return list(custom_object(result).get("items") or [])

    def patch_raycluster(
        self, namespace: str, name: str, patch: dict[str, Any], *, retry_conflict: bool = True
    ) -> dict[str, Any] | None:
        """None: the cluster is gone. `retry_conflict=False` for a patch whose resourceVersion is a precondition
        (sending it again cannot succeed)."""
        return self._get(
            lambda: self.custom.patch_namespaced_custom_object(
                constants.RAY_GROUP, constants.RAY_VERSION_API, namespace, constants.RAYCLUSTER_PLURAL, name, patch
            ),
            retry_conflict=retry_conflict,
        )

    def _delete(self, plural: str, namespace: str, name: str) -> bool:
        try:
            self._call(
                lambda: self.custom.delete_namespaced_custom_object(
                    constants.RAY_GROUP,
                    constants.RAY_VERSION_API,
                    namespace,
                    plural,
                    name,
                    body=k8s.V1DeleteOptions(propagation_policy="Background"),
                )
            )
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    # ----------------------------------------------------------------------------- finalizers
    def add_finalizer(self, obj: dict[str, Any], finalizer: str = constants.FINALIZER) -> dict[str, Any] | None:
        """The object as it carries `finalizer` (`obj` itself when it already did, else the patched or re-read
        copy); None when it is gone or being deleted.

        A conditional merge patch (resourceVersion) so no other finalizer is lost; re-read and retry on conflict.
        """
        group, version = obj["apiVersion"].split("/")
        plural = PLURALS[obj["kind"]]
        meta = obj["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        current: dict[str, Any] = obj
        for _ in range(self.retry.attempts):
            finalizers = list(meta.get("finalizers") or [])
            if finalizer in finalizers:
                return current
            if meta.get("deletionTimestamp"):
                return None  # the API server refuses new finalizers on an object being deleted
            patch = {
                "metadata": {"finalizers": [*finalizers, finalizer], "resourceVersion": meta.get("resourceVersion")}
            }
            try:
                path = f"/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}"
                return self._send("PATCH", path, patch, "application/merge-patch+json")
            except ApiException as exc:
                if exc.status == 404:
                    return None
                if exc.status not in RETRY_STATUSES:
                    raise
            fresh = self._get(lambda: self.custom.get_namespaced_custom_object(group, version, namespace, plural, name))
            if fresh is None:
                return None
            current, meta = fresh, fresh["metadata"]
        return None

    def remove_finalizer(self, obj: dict[str, Any], finalizer: str = constants.FINALIZER) -> bool:
        """Take `finalizer` off `obj`: True once it is off (or the object is gone). A JSON patch that tests the
        finalizer at its index, so no other finalizer is lost and no resourceVersion is needed: the guard decided
        on S3, not on the object's other fields (KubeRay's status writes move the resourceVersion constantly)."""
        group, version = obj["apiVersion"].split("/")
        plural = PLURALS[obj["kind"]]
        meta = obj["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        for _ in range(self.retry.attempts):
            finalizers = list(meta.get("finalizers") or [])
            if finalizer not in finalizers:
                return True
            index = finalizers.index(finalizer)
            patch = [
                {"op": "test", "path": f"/metadata/finalizers/{index}", "value": finalizer},
                {"op": "remove", "path": f"/metadata/finalizers/{index}"},
            ]
            try:
                self.custom.patch_namespaced_custom_object(
                    group, version, namespace, plural, name, patch, _content_type="application/json-patch+json"
                )
                return True
            except ApiException as exc:
                if exc.status == 404:
                    return True
                if exc.status not in (*RETRY_STATUSES, 422):  # 422: the test failed, the list moved
                    raise
            fresh = self._get(lambda: self.custom.get_namespaced_custom_object(group, version, namespace, plural, name))
            if fresh is None or fresh["metadata"].get("uid") != meta.get("uid"):
                return True  # gone, or another object of the same name: ours is not held any more
            meta = fresh["metadata"]
        return False

    def get_object(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A TrainingSweep, RayJob or RayCluster by kind (the guard's pipeline reads each kind the same way)."""
        group, version = (
            (constants.GROUP, constants.VERSION)
            if kind == constants.KIND
            else (constants.RAY_GROUP, constants.RAY_VERSION_API)
        )
        return self._get(
            lambda: self.custom.get_namespaced_custom_object(group, version, namespace, PLURALS[kind], name)
        )

    # ---------------------------------------------------------------------- pods and events
    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        result = self._call(
            lambda: self.core.list_namespaced_pod(namespace, label_selector=label_selector, _preload_content=False)
        )
        return list(_json(result).get("items") or [])

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(lambda: _json(self.core.read_namespaced_pod(name, namespace, _preload_content=False)))

    def get_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A Service (a RayCluster's head Service, checked before the operator sends a request to its head)."""
        return self._get(lambda: _json(self.core.read_namespaced_service(name, namespace, _preload_content=False)))

    def delete_pod(self, namespace: str, name: str) -> bool:
        """Delete a pod (a held RayCluster's worker: KubeRay no longer reconciles that cluster); False if gone."""
        try:
            self._call(lambda: self.core.delete_namespaced_pod(name, namespace))
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    def post_event(
        self, involved: Mapping[str, Any], type_: str, reason: str, message: str, *, component: str, instance: str
    ) -> None:
        """A core/v1 Event on `involved`, the body kopf's poster writes (kopf/_cogs/clients/events.py post_event:
        generateName, the object reference, `source.component` for kubectl's From column, the timestamps)."""
        meta = involved.get("metadata") or {}
        namespace = meta.get("namespace") or "default"
        reference = {"apiVersion": involved.get("apiVersion"), "kind": involved.get("kind"), "name": meta.get("name")}
        reference |= {"uid": meta.get("uid"), "namespace": namespace}
        now = datetime.datetime.now(datetime.UTC).isoformat()
        body = {
            "metadata": {"namespace": namespace, "generateName": EVENT_NAME_PREFIX},
            "action": "Action?",
            "type": type_,
            "reason": reason,
            "message": message,
            "reportingComponent": component,
            "reportingInstance": instance,
            "source": {"component": component},
            "involvedObject": {key: value for key, value in reference.items() if value},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "eventTime": now,
        }
        self._call(lambda: self._send("POST", f"/api/v1/namespaces/{namespace}/events", body), retry_conflict=False)

    def list_events(self, namespace: str) -> list[dict[str, Any]]:
        result = self._call(lambda: self.core.list_namespaced_event(namespace, _preload_content=False))
        return list(_json(result).get("items") or [])


def _json(response: Any) -> dict[str, Any]:
    import json

    data = response.data if hasattr(response, "data") else response
    return json.loads(data) if isinstance(data, (bytes, str)) else dict(data)
