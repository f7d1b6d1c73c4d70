"""`GET /api/v1/namespaces/NS/pods/NAME/log`: a container's log as kube-apiserver and the kubelet serve it.

The apiserver's share (pkg/registry/core/pod/rest/log.go, pod/strategy.go LogLocation, validation
ValidatePodLogOptions): the pod must exist, the container is named or the only one, options are validated, and a pod
not bound to a node answers an empty log. The kubelet's share (kubelet_pods.go validateContainerLogStatus): a
container without a status, waiting, or terminated without an id has no log yet; `previous` needs a terminated
instance. Whoever "runs" a container (the KubeRay stand-in for the submitter pod) registers where its output is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .container_logs import ContainerLogs
from .emulator_tables import ApiError

Obj = dict[str, Any]


def _int_option(query: Mapping[str, str], name: str) -> int | None:
    if name not in query:
        return None
    try:
        return int(query[name])
    except ValueError:
        raise ApiError(400, "BadRequest", f"{name}: invalid value {query[name]!r}: not an integer") from None


def _flag(query: Mapping[str, str], name: str) -> bool:
    value = query.get(name, "false")
    if value not in ("true", "false", "1", "0"):
        raise ApiError(400, "BadRequest", f"{name}: invalid value {value!r}: not a boolean")
    return value in ("true", "1")


def _container_names(containers: list[Obj]) -> str:
    return " ".join(str(c.get("name", "")) for c in containers)


def _container(pod: Obj, name: str, wanted: str) -> str:
    """LogLocation: the named container (a regular or init one), else the pod's only container."""
    spec = pod.get("spec") or {}
    containers, init = spec.get("containers") or [], spec.get("initContainers") or []
    if not wanted:
        if len(containers) == 1:
            return str(containers[0].get("name", ""))
        if not containers:
            raise ApiError(400, "BadRequest", f"a container name must be specified for pod {name}")
        message = f"a container name must be specified for pod {name}, choose one of: [{_container_names(containers)}]"
        if init:
            message += f" or one of the init containers: [{_container_names(init)}]"
        raise ApiError(400, "BadRequest", message)
    if not any(c.get("name") == wanted for c in [*containers, *init]):
        raise ApiError(400, "BadRequest", f"container {wanted} is not valid for pod {name}")
    return wanted


def _validate(query: Mapping[str, str], name: str) -> tuple[int | None, int | None]:
    """ValidatePodLogOptions (422 Invalid PodLogOptions); (tailLines, limitBytes)."""
    tail, limit, since = (
        _int_option(query, "tailLines"),
        _int_option(query, "limitBytes"),
        _int_option(query, "sinceSeconds"),
    )
    causes = []
    if tail is not None and tail < 0:
        causes.append(("tailLines", f"Invalid value: {tail}: must be greater than or equal to 0"))
    if limit is not None and limit < 1:
        causes.append(("limitBytes", f"Invalid value: {limit}: must be greater than 0"))
    if since is not None and since < 1:
        causes.append(("sinceSeconds", f"Invalid value: {since}: must be greater than 0"))
    if since is not None and "sinceTime" in query:
        causes.append(("", "Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified"))
    if causes:
        text = ", ".join(f"{field}: {detail}" if field else detail for field, detail in causes)
        raise ApiError(422, "Invalid", f'PodLogOptions "{name}" is invalid: {text}')
    return tail, limit


def _kubelet_checks(pod: Obj, name: str, container: str, previous: bool) -> None:
    """validateContainerLogStatus: which instance of the container has a log, or why none has."""
    status = pod.get("status") or {}
    statuses = [*(status.get("containerStatuses") or []), *(status.get("initContainerStatuses") or [])]
    found = next((s for s in statuses if s.get("name") == container), None)
    if found is None:
        raise ApiError(400, "BadRequest", f'container "{container}" in pod "{name}" is not available')
    state, last = found.get("state") or {}, (found.get("lastState") or {}).get("terminated")
    if previous:
        if not last or not last.get("containerID"):
            raise ApiError(400, "BadRequest", f'previous terminated container "{container}" in pod "{name}" not found')
        return
    if state.get("running") is not None:
        if not found.get("containerID"):
            raise ApiError(500, "InternalError", f"emulator: running container {container} of pod {name} has no id")
        return
    terminated = state.get("terminated")
    if terminated is not None:
        if terminated.get("containerID") or (last and last.get("containerID")):
            return
        raise ApiError(400, "BadRequest", f'container "{container}" in pod "{name}" is terminated')
    if last is not None:
        if last.get("containerID"):
            return
        raise ApiError(400, "BadRequest", f'container "{container}" in pod "{name}" is terminated')
    waiting = state.get("waiting")
    if waiting is not None:
        reason = waiting.get("reason") or ""
        if reason == "ErrImagePull":
            reason = "image can't be pulled"
        elif reason == "ImagePullBackOff":
            reason = "trying and failing to pull image"
        raise ApiError(400, "BadRequest", f'container "{container}" in pod "{name}" is waiting to start: {reason}')
    raise ApiError(400, "BadRequest", f'container "{container}" in pod "{name}" is waiting to start - no logs yet')


def _tail(data: bytes, lines: int) -> bytes:
    if lines == 0:
        return b""
    parts = data.splitlines(keepends=True)
    return b"".join(parts[-lines:])


def pod_log(logs: ContainerLogs, pod: Obj, query: Mapping[str, str]) -> bytes:
    """The body of a pods/log GET for `pod` (already read: 404 is the caller's), or the ApiError the API answers.
    `follow`, `timestamps`, `sinceSeconds` and `sinceTime` are refused: the emulator keeps no times per line, and
    a client that needs them must not pass against it."""
    meta = pod.get("metadata") or {}
    name, namespace = str(meta.get("name", "")), str(meta.get("namespace", ""))
    tail, limit = _validate(query, name)
    container = _container(pod, name, query.get("container", ""))
    previous = _flag(query, "previous")
    for unmodelled in ("follow", "timestamps"):
        if _flag(query, unmodelled):
            raise ApiError(400, "BadRequest", f"{unmodelled}=true is not served by the Kubernetes API emulator")
    if "sinceSeconds" in query or "sinceTime" in query:
        raise ApiError(400, "BadRequest", "sinceSeconds and sinceTime are not served by the Kubernetes API emulator")
    if not (pod.get("spec") or {}).get("nodeName"):
        return b""  # LogLocation: a pod not assigned a host has an empty log location
    _kubelet_checks(pod, name, container, previous)
    if previous:
        return b""  # the emulator's containers never restart: a previous instance printed nothing it kept
    data = logs.read(namespace, name, container)
    if tail is not None:
        data = _tail(data, tail)
    if limit is not None:
        data = data[:limit]
    return data
