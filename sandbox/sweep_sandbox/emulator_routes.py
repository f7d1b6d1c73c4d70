"""The emulator's routing: one HTTP entry point that serves discovery, OpenAPI, /version and every resource request
(the verbs, dry runs, field validation and managers, injected errors) and passes the rest to kmock (the routes that
KubernetesApiEmulator holds)."""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp.web
import kmock
import yaml
from kmock._internal import rendering as kmock_rendering

from . import openapi, protobuf
from . import schema_apply as managed_fields
from .admission import AdmissionDenied
from .emulator_store import ObjectStore, _foreground
from .emulator_tables import STATUS_REASONS, ApiError, ResourceType, _InvalidObject, render_table, resource_key
from .pod_logs import pod_log

if TYPE_CHECKING:
    from .emulator import KubernetesApiEmulator

Obj = dict[str, Any]

logger = logging.getLogger("sweep_sandbox.emulator")

SERVER_VERSION: Obj = {
    "major": "1",
    "minor": "33",
    "gitVersion": "v1.33.0-kmock",
    "gitCommit": "",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "python",
    "compiler": "kmock",
    "platform": "linux/amd64",
}


_MERGE_PATCHES = ("application/merge-patch+json", "application/strategic-merge-patch+json", "application/json")
_FIELD_VALIDATION = {"": "Warn", "Warn": "Warn", "Strict": "Strict", "Ignore": "Ignore"}


def _field_validation(query: Mapping[str, str]) -> str:
    """The fieldValidation directive; absent means Warn (apiserver handlers/rest.go fieldValidation)."""
    value = query.get("fieldValidation", "")
    if value not in _FIELD_VALIDATION:
        raise ApiError(
            400,
            "BadRequest",
            f"fieldValidation parameter unsupported: {value!r}; valid values are Ignore, Warn, or Strict",
        )
    return _FIELD_VALIDATION[value]


def _dry_run(query: Mapping[str, str]) -> bool:
    """dryRun=All (kubectl --dry-run=server): every stage but storage (handlers/rest.go dryRun validation)."""
    value = query.get("dryRun", "")
    if value not in ("", "All"):
        raise ApiError(400, "BadRequest", f"Invalid dry run value: {value!r}; valid values are: All")
    return value == "All"


def _field_manager(query: Mapping[str, str], raw: aiohttp.web.BaseRequest) -> str:
    """fieldManager, else the User-Agent's product (handlers/rest.go prefixFromUserAgent)."""
    if query.get("fieldManager"):
        return query["fieldManager"]
    agent = raw.headers.get("User-Agent", "")
    return agent.split("/", 1)[0][:128] if agent else "unknown"


def _warning_headers(warnings: list[str]) -> Any:
    """One `Warning: 299 - "<text>"` header per warning (RFC 7234 warn-code 299, as apiserver/pkg/warning)."""
    from multidict import CIMultiDict

    headers: CIMultiDict[str] = CIMultiDict()
    for text in dict.fromkeys(warnings):
        headers.add("Warning", "299 - " + json.dumps(text, ensure_ascii=False))
    return headers


def _yaml_body(body: bytes) -> Any:
    """An apply patch's body: YAML (JSON is YAML)."""
    try:
        return yaml.load(body.decode("utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as e:
        raise ApiError(400, "BadRequest", f"error decoding YAML: {e}") from e


# --------------------------------------------------------------------------------------------------------------------
# Injected errors


@dataclass
class InjectedError:
    """Answer the next `times` requests that match with `code` instead of serving them (None: every request)."""

    code: int
    times: int | None = 1
    verb: str | None = None  # get, list, watch, create, update (PUT), patch, delete, deletecollection
    plural: str | None = None
    subresource: str | None = None
    name: str | None = None
    namespace: str | None = None
    path: str | None = None  # a regex searched in the URL path
    user_agent: str | None = None  # a regex searched in the User-Agent (kopf's, the stand-in's, kubectl's)
    reason: str = ""
    message: str = ""
    retry_after: int | None = None
    hits: int = 0

    def matches(self, verb: str, path: str, target: RequestTarget | None, user_agent: str = "") -> bool:
        if self.verb is not None and self.verb != verb:
            return False
        if self.path is not None and not re.search(self.path, path):
            return False
        if self.user_agent is not None and not re.search(self.user_agent, user_agent):
            return False
        wanted = (self.plural, self.subresource, self.name, self.namespace)
        if all(w is None for w in wanted):
            return True
        if target is None:
            return False
        return all(
            w is None or w == have
            for w, have in zip(wanted, (target.plural, target.subresource, target.name, target.namespace), strict=True)
        )

    def error(self) -> ApiError:
        reason = self.reason or STATUS_REASONS.get(self.code, "InternalError")
        message = self.message or f"injected error {self.code} ({reason}) by the emulator"
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else {}
        details = {"retryAfterSeconds": self.retry_after} if self.retry_after is not None else None
        return ApiError(self.code, reason, message, details, headers)


class ErrorInjector:
    """Thread-safe: tests add rules from their own thread while the server answers in its loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[InjectedError] = []

    def inject(self, code: int, times: int | None = 1, **criteria: Any) -> InjectedError:
        """E.g. `inject(409, times=2, verb="patch", plural="trainingsweeps", subresource="status")`."""
        rule = InjectedError(code=code, times=times, **criteria)
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def withdraw(self, rule: InjectedError) -> None:
        """Stop answering with `rule` (its hits stay readable)."""
        with self._lock:
            rule.times = 0

    @property
    def pending(self) -> list[InjectedError]:
        with self._lock:
            return [r for r in self._rules if r.times is None or r.times > 0]

    def take(self, verb: str, path: str, target: RequestTarget | None, user_agent: str = "") -> ApiError | None:
        with self._lock:
            for rule in self._rules:
                if (rule.times is None or rule.times > 0) and rule.matches(verb, path, target, user_agent):
                    rule.hits += 1
                    if rule.times is not None:
                        rule.times -= 1
                    return rule.error()
        return None


# --------------------------------------------------------------------------------------------------------------------
# Request targets


@dataclass(frozen=True)
class RequestTarget:
    """What a resource URL addresses: /api/v1/namespaces/ns/pods/name/status and the like."""

    group: str
    version: str
    plural: str
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None


def parse_resource_path(path: str) -> RequestTarget | None:
    """The target of a resource URL, or None for discovery and other paths."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 3 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    if rest[0] == "namespaces":
        if len(rest) == 1:
            return RequestTarget(group, version, "namespaces")
        if len(rest) == 2 or (len(rest) == 3 and rest[2] in ("status", "finalize")):
            if group == "":  # the Namespace object itself (core API only)
                return RequestTarget(group, version, "namespaces", None, rest[1], rest[2] if len(rest) == 3 else None)
            return None
        namespace, rest = rest[1], rest[2:]
    else:
        namespace = None
    plural = rest[0]
    name = rest[1] if len(rest) > 1 else None
    subresource = "/".join(rest[2:]) or None
    return RequestTarget(group, version, plural, namespace, name, subresource)


def _verb(method: str, target: RequestTarget | None, query: Mapping[str, str]) -> str:
    named = target is not None and target.name is not None
    if method == "GET":
        if query.get("watch") in ("true", "1"):
            return "watch"
        return "get" if named else "list"
    return {
        ("POST", False): "create",
        ("PUT", True): "update",
        ("PATCH", True): "patch",
        ("DELETE", True): "delete",
        ("DELETE", False): "deletecollection",
    }.get((method, named), method.lower())


class Routes:
    """The HTTP side of KubernetesApiEmulator: parse a request, check it, dispatch to the store and the write verbs."""

    def __init__(self, api: KubernetesApiEmulator, store: ObjectStore) -> None:
        self.api = api
        self.store = store
        self._openapi_cache: tuple[Any, dict[str, tuple[str, bytes]], bytes] | None = None

    # ---- HTTP entry point

    async def serve(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        body = await raw.read()
        target = parse_resource_path(raw.path)
        query = dict(raw.query)
        verb = _verb(raw.method, target, query)
        request = self.api._remember(raw, body, target, verb)
        try:
            injected = self.api.errors.take(verb, raw.path, target, raw.headers.get("User-Agent", ""))
            if injected is not None:
                raise injected
            # the authorization filter (rbac.py), before the body is read as an object
            user = self.api.admission.authenticate(raw.headers.get("Authorization"))
            self.api.rbac.authorize_request(user, raw.method, raw.path, query)
            if target is not None:
                return await self._serve_resource(raw, request, target, verb, query)
            return await self._serve_other(raw, request)
        except ApiError as e:
            return aiohttp.web.json_response(e.body(), status=e.code, headers=e.headers)
        except _InvalidObject as e:
            return aiohttp.web.json_response(e.status, status=422)
        except AdmissionDenied as e:
            return aiohttp.web.json_response(e.status(), status=e.code)
        except managed_fields.ApplyConflict as e:
            return aiohttp.web.json_response(e.status(), status=409)
        except kmock.KubernetesError as e:
            error = ApiError(e.status, e.reason or STATUS_REASONS.get(e.status, "InternalError"), e.message or "")
            return aiohttp.web.json_response(error.body(), status=error.code)
        except Exception as e:  # an emulator bug must reach the client as a 500, never as a hang
            logger.exception("emulator failed on %s %s", raw.method, raw.path_qs)
            error = ApiError(500, "InternalError", f"emulator error: {e!r}")
            return aiohttp.web.json_response(error.body(), status=500)

    def remember(
        self, raw: aiohttp.web.BaseRequest, body: bytes, target: RequestTarget | None, verb: str
    ) -> kmock_rendering.Request:
        try:
            data = json.loads(body) if body else None
        except ValueError:
            data = None
        actions = {
            "list": kmock.action.LIST,
            "watch": kmock.action.WATCH,
            "get": kmock.action.FETCH,
            "create": kmock.action.CREATE,
            "patch": kmock.action.UPDATE,
            "delete": kmock.action.DELETE,
        }
        request = kmock_rendering.Request(
            id=len(self.api._requests),
            raw_request=raw,
            url=raw.url,
            method=raw.method,
            params=dict(raw.query),
            headers=dict(raw.headers),
            body=body,
            text=body.decode("utf-8", errors="replace"),
            data=data,
            action=actions.get(verb),
            resource=resource_key(target.group, target.version, target.plural) if target else None,
            namespace=target.namespace if target else None,
            name=target.name if target else None,
            subresource=target.subresource if target else None,
        )
        if self.api.request_log_limit > 0:
            self.api._requests.append(request)
            if len(self.api._requests) > self.api.request_log_limit:
                del self.api._requests[: self.api.request_log_limit // 2]
        return request

    async def _serve_other(
        self, raw: aiohttp.web.BaseRequest, request: kmock_rendering.Request
    ) -> aiohttp.web.StreamResponse:
        """Discovery (with core /api/v1 fixed) and version; anything else goes to kmock's reactions."""
        path = "/" + raw.path.strip("/")
        if raw.method == "GET":
            if path == "/":
                return aiohttp.web.json_response(await self.api._serve_root(request))
            if path == "/version":
                return aiohttp.web.json_response(SERVER_VERSION)
            if path == "/api":
                return aiohttp.web.json_response({"kind": "APIVersions", "versions": ["v1"]})
            if path == "/apis":
                return aiohttp.web.json_response(self._group_list())
            if match := re.fullmatch(r"/api/([^/]+)", path):
                return aiohttp.web.json_response(self._resource_list("", match[1]))
            if match := re.fullmatch(r"/apis/([^/]+)/([^/]+)", path):
                return aiohttp.web.json_response(self._resource_list(match[1], match[2]))
            if match := re.fullmatch(r"/apis/([^/]+)", path):
                return aiohttp.web.json_response(self._group(match[1]))
            if path.startswith("/openapi"):
                return self._serve_openapi(raw, path)
        try:
            return await kmock.RawHandler._handle(self.api, request)
        except NotImplementedError as e:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})") from e

    def _openapi_documents(self) -> dict[str, tuple[str, bytes]]:
        """Group-version path -> (hash, JSON), rebuilt only when the registered kinds change."""
        key = tuple((t.key, id(t.openapi)) for t in self.store.types.values())
        if self._openapi_cache is None or self._openapi_cache[0] != key:
            by_gv: dict[str, list[ResourceType]] = {}
            for t in self.store.types.values():
                by_gv.setdefault(openapi.group_version_path(t.group, t.version), []).append(t)
            documents = {}
            for gv, types in by_gv.items():
                document = openapi.group_version_document(types)
                documents[gv] = (openapi.digest(document), json.dumps(document).encode())
            swagger = json.dumps(openapi.swagger_document(list(self.store.types.values()))).encode()
            self._openapi_cache = (key, documents, swagger)
        return self._openapi_cache[1]

    def _serve_openapi(self, raw: aiohttp.web.BaseRequest, path: str) -> aiohttp.web.StreamResponse:
        """/openapi/v3, /openapi/v3/<group-version> and /openapi/v2 (JSON; a protobuf-only Accept gets 406)."""
        documents = self._openapi_documents()
        if path == "/openapi/v3":
            paths = {gv: {"serverRelativeURL": f"/openapi/v3/{gv}?hash={h}"} for gv, (h, _) in documents.items()}
            return aiohttp.web.json_response({"paths": paths})
        if path.startswith("/openapi/v3/"):
            entry = documents.get(path.removeprefix("/openapi/v3/"))
            if entry is None:
                raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
            headers = {"ETag": json.dumps(entry[0])}
            return aiohttp.web.Response(body=entry[1], content_type="application/json", headers=headers)
        if path == "/openapi/v2":
            accept = raw.headers.get("Accept", "")
            if accept and "json" not in accept and "*/*" not in accept:
                raise ApiError(406, "NotAcceptable", "only application/json is served for /openapi/v2 by the emulator")
            assert self._openapi_cache is not None
            return aiohttp.web.Response(body=self._openapi_cache[2], content_type="application/json")
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")

    def _group(self, group: str) -> Obj:
        versions = list(dict.fromkeys(t.version for t in self.store.types.values() if t.group == group))
        if not group or not versions:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({group})")
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": group,
            "versions": entries,
            "preferredVersion": entries[0],
        }

    def _group_list(self) -> Obj:
        groups = dict.fromkeys(t.group for t in self.store.types.values() if t.group)
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [self._group(g) for g in groups]}

    def _resource_list(self, group: str, version: str) -> Obj:
        types = [t for t in self.store.types.values() if t.group == group and t.version == version]
        if not types:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({group}/{version})")
        resources = []
        for t in types:
            info = t.info()
            resources.append(
                {
                    "name": t.plural,
                    "singularName": info.singular,
                    "namespaced": t.namespaced,
                    "kind": t.kind,
                    "verbs": sorted(info.verbs),
                    "shortNames": list(t.short_names),
                    "categories": list(t.categories),
                }
            )
            for sub in t.subresources:
                resources.append(
                    {
                        "name": f"{t.plural}/{sub}",
                        "singularName": "",
                        "namespaced": t.namespaced,
                        "kind": t.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": resources,
        }

    # ---- resource requests

    def _serve_get(
        self, resource_type: ResourceType, target: RequestTarget, query: dict[str, str], table: bool
    ) -> aiohttp.web.Response:
        """One object, its status, or a pod's log (the only other subresource the emulator serves)."""
        if target.subresource == "log" and resource_type.kind == "Pod" and resource_type.group == "":
            pod = self.store.get_object(resource_type, target.namespace, target.name or "")
            body = pod_log(self.api.container_logs, pod, query)
            return aiohttp.web.Response(body=body, content_type="text/plain")
        if target.subresource not in (None, "status"):
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({target.subresource})")
        obj = self.store.get_object(resource_type, target.namespace, target.name or "")
        return aiohttp.web.json_response(
            render_table([obj], resource_type, query, self.api.changes.rv) if table else obj
        )

    async def _serve_resource(
        self,
        raw: aiohttp.web.BaseRequest,
        request: kmock_rendering.Request,
        target: RequestTarget,
        verb: str,
        query: dict[str, str],
    ) -> aiohttp.web.StreamResponse:
        resource_type = self.store.type_for(target.group, target.version, target.plural)
        table = "as=Table" in raw.headers.get("Accept", "")
        if verb == "watch":
            return await self.store.serve_watch(raw, resource_type, target, query, table)
        if verb == "list":
            return aiohttp.web.json_response(self.store.list_objects(resource_type, target.namespace, query, table))
        user = self.api.admission.authenticate(raw.headers.get("Authorization"))
        if verb == "deletecollection":
            # handlers/delete.go DeleteCollection: each object through validating admission, as its own delete
            listed = self.store.list_objects(resource_type, target.namespace, query)
            for item in listed["items"]:
                await self.api.admission_chain.admit_delete(
                    resource_type, item["metadata"].get("namespace"), item["metadata"]["name"], user, False
                )
            return aiohttp.web.json_response(self.api.writes.delete_collection(resource_type, target, query))
        data = request.data
        if verb in ("create", "update") and protobuf.is_protobuf(raw.headers.get("Content-Type")):
            data = protobuf.decode_body(request.body, resource_type.api_version, resource_type.kind)
        directive = _field_validation(query)
        dry_run = _dry_run(query)
        warnings: list[str] = []
        if verb == "get":
            return self._serve_get(resource_type, target, query, table)
        if verb == "create":
            if not isinstance(data, dict):
                raise ApiError(400, "BadRequest", "the request body must be a JSON object")
            created = await self.api.writes.create_object(
                resource_type,
                target.namespace,
                data,
                directive=directive,
                warnings=warnings,
                manager=_field_manager(query, raw),
                dry_run=dry_run,
                user=user,
            )
            return aiohttp.web.json_response(created, status=201, headers=_warning_headers(warnings))
        if verb in ("patch", "update"):
            content_type = raw.headers.get("Content-Type", "application/json").split(";")[0].strip()
            if content_type == "application/apply-patch+yaml":
                data = _yaml_body(request.body)
            obj = await self.api.writes.update(
                resource_type,
                target,
                data,
                content_type if verb == "patch" else "replace",
                directive=directive,
                warnings=warnings,
                manager=_field_manager(query, raw),
                force=query.get("force") in ("true", "1"),
                dry_run=dry_run,
                user=user,
            )
            return aiohttp.web.json_response(obj, headers=_warning_headers(warnings))
        if verb == "delete":
            options = dict(data) if isinstance(data, dict) else {}
            for key in ("propagationPolicy", "gracePeriodSeconds"):
                if key in query:
                    options.setdefault(key, query[key])
            dry_run = dry_run or "All" in (options.get("dryRun") or [])  # DeleteOptions carry it in the body
            await self.api.admission_chain.admit_delete(
                resource_type, target.namespace, target.name or "", user, dry_run
            )
            if dry_run:
                return aiohttp.web.json_response(
                    self.store.get_object(resource_type, target.namespace, target.name or "")
                )
            obj, gone = self.api.writes.delete_object(resource_type, target.namespace, target.name or "", options)
            waits_for_dependents = not gone and _foreground(options)
            return aiohttp.web.json_response(obj, status=202 if waits_for_dependents else 200)
        raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
