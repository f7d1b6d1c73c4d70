"""The KubeRay stand-in's calls to the Kubernetes API: ray.io objects through CustomObjectsApi, core/v1 as plain JSON,
Events as client-go's recorder writes them."""

from __future__ import annotations

import json
import logging
from typing import Any

from sweep_contracts import constants

from ..controllers import Obj, event_body
from .rayjob_types import KUBERAY_POD, RAYJOB_CONTROLLER, USER_AGENT

logger = logging.getLogger(__name__)


class RayApi:
    """The stand-in's API calls: ray.io objects through CustomObjectsApi, core/v1 as plain JSON, Events."""

    def __init__(self, api_client: Any) -> None:
        import kubernetes.client

        api_client.user_agent = USER_AGENT  # lets tests aim injected errors at the stand-in (or away from it)
        self.api_client = api_client
        self.custom = kubernetes.client.CustomObjectsApi(api_client)
        self.ApiException = kubernetes.client.ApiException

    def create(self, plural: str, namespace: str, body: Obj) -> Obj:
        return dict(
            self.custom.create_namespaced_custom_object(
                constants.RAY_GROUP, constants.RAY_VERSION_API, namespace, plural, body
            )
        )

    def get(self, plural: str, namespace: str, name: str) -> Obj | None:
        try:
            return dict(
                self.custom.get_namespaced_custom_object(
                    constants.RAY_GROUP, constants.RAY_VERSION_API, namespace, plural, name
                )
            )
        except self.ApiException as e:
            if e.status == 404:
                return None
            raise

    def delete(self, plural: str, namespace: str, name: str) -> None:
        self.custom.delete_namespaced_custom_object(
            constants.RAY_GROUP, constants.RAY_VERSION_API, namespace, plural, name
        )

    def patch(self, plural: str, obj: Obj, patch: Obj, *, status: bool = False, guarded: bool = False) -> Obj:
        """A merge patch; `guarded` adds obj's resourceVersion, so a stale write fails with 409 as KubeRay's Update."""
        meta = obj["metadata"]
        if guarded:
            patch = {**patch, "metadata": {**patch.get("metadata", {}), "resourceVersion": meta["resourceVersion"]}}
        call = (
            self.custom.patch_namespaced_custom_object_status if status else self.custom.patch_namespaced_custom_object
        )
        return dict(
            call(constants.RAY_GROUP, constants.RAY_VERSION_API, meta["namespace"], plural, meta["name"], patch)
        )

    def core(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        """A core/v1 call with plain JSON: the typed client validates pod templates stricter than the API server."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        _, url, headers, payload, _ = self.api_client.param_serialize(
            method, path, query_params=query or [], header_params=headers, body=body
        )
        response = self.api_client.call_api(method, url, header_params=headers, body=payload)
        response.read()
        if not 200 <= response.status < 300:
            raise self.ApiException(http_resp=response)
        return dict(json.loads(response.data))

    def event(
        self,
        involved: Obj,
        type_: str,
        reason: str,
        message: str,
        component: str = RAYJOB_CONTROLLER,
        host: str | None = None,
        action: str | None = None,
    ) -> None:
        body = event_body(involved, type_, reason, message, component, host, action, instance=KUBERAY_POD)
        try:
            self.core("POST", f"/api/v1/namespaces/{body['metadata']['namespace']}/events", body)
        except self.ApiException as e:  # events are best effort, as client-go's recorder
            logger.debug("event %s on %s not recorded: %r", reason, involved["metadata"]["name"], e)
