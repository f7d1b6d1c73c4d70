"""KubeApi's hot writes (`_send`: the RayJob create, the sweep's status and finalizer patches) go through the official
client's connection pool and credentials without its model layer, and answer exactly as the generated methods do:
the decoded object, or the client's ApiException with the API server's status and body."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException, ConflictException, NotFoundException

from sweep_operator.kube import KubeApi, Retry


class FakeResponse:
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status, self.reason = (
            status,
            {200: "OK", 201: "Created", 404: "Not Found", 409: "Conflict"}.get(status, ""),
        )
        self.data = json.dumps(body).encode()
        self.headers = {"Content-Type": "application/json"}


class FakePool:
    """Stands for urllib3's PoolManager: records each request, answers from a script."""

    def __init__(self, *answers: FakeResponse) -> None:
        self.answers = list(answers)
        self.requests: list[dict[str, Any]] = []

    def request(self, method: str, url: str, body: bytes | None = None, headers: Any = None, **kw: Any) -> Any:
        self.requests.append({"method": method, "url": url, "body": body, "headers": dict(headers or {}), **kw})
        return self.answers.pop(0)


def _kube(pool: FakePool, tokens: list[str] | None = None) -> KubeApi:
    """`tokens`: what the refresh hook hands out, one per call (the last one kept)."""
    tokens = tokens or ["t"]
    configuration = k8s.Configuration(host="https://api.example:6443")
    configuration.api_key = {"authorization": "first"}
    configuration.api_key_prefix = {"authorization": "Bearer"}

    def refresh(config: Any) -> None:  # kubeconfig exec plugins and in-cluster token files refresh through this
        config.api_key["authorization"] = tokens.pop(0) if len(tokens) > 1 else tokens[0]

    configuration.refresh_api_key_hook = refresh
    client = k8s.ApiClient(configuration)
    client.rest_client.pool_manager = pool
    return KubeApi(client, Retry(attempts=3, first_delay=0.0, max_delay=0.0))


def test_a_status_patch_is_a_merge_patch_with_the_clients_credentials_and_its_answer_decoded() -> None:
    answer = {"metadata": {"name": "s", "resourceVersion": "8"}, "status": {"phase": "Running"}}
    pool = FakePool(FakeResponse(200, answer))
    kube = _kube(pool, ["refreshed"])
    assert kube.patch_sweep_status("ml", "s", {"phase": "Running"}, resource_version="7") == answer
    (sent,) = pool.requests
    assert sent["method"] == "PATCH"
    assert sent["url"] == "https://api.example:6443/apis/sweeps.dev/v1alpha1/namespaces/ml/trainingsweeps/s/status"
    assert json.loads(sent["body"]) == {"status": {"phase": "Running"}, "metadata": {"resourceVersion": "7"}}
    assert sent["headers"]["Content-Type"] == "application/merge-patch+json"
    assert sent["headers"]["authorization"] == "Bearer refreshed"  # the refresh hook ran, as for generated calls
    assert sent["headers"]["User-Agent"] == kube.api_client.user_agent


def test_a_create_posts_the_rayjob_and_an_existing_one_is_read_instead() -> None:
    rayjob = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "r", "namespace": "ml"}, "spec": {}}
    pool = FakePool(FakeResponse(201, {**rayjob, "metadata": {**rayjob["metadata"], "resourceVersion": "3"}}))
    made, created = _kube(pool, ["t"]).create_rayjob(rayjob)
    assert created and made["metadata"]["resourceVersion"] == "3"
    assert pool.requests[0]["method"] == "POST"
    assert pool.requests[0]["url"].endswith("/apis/ray.io/v1/namespaces/ml/rayjobs")
    assert pool.requests[0]["headers"]["Content-Type"] == "application/json"
    assert json.loads(pool.requests[0]["body"]) == rayjob


def test_errors_are_the_clients_exceptions_and_transient_ones_are_retried() -> None:
    gone = {"kind": "Status", "code": 404, "reason": "NotFound", "message": 'trainingsweeps "s" not found'}
    kube = _kube(FakePool(FakeResponse(404, gone), FakeResponse(404, gone)))
    with pytest.raises(NotFoundException) as caught:
        kube._send("PATCH", "/apis/sweeps.dev/v1alpha1/namespaces/ml/trainingsweeps/s", {}, "application/json")
    assert caught.value.status == 404 and json.loads(caught.value.body) == gone
    assert kube.patch_sweep_status("ml", "s", {"phase": "x"}) is None  # 404 read as gone, as before
    busy = {"kind": "Status", "code": 500, "message": "etcd timeout"}
    ok = {"metadata": {"name": "s"}, "status": {"phase": "x"}}
    pool = FakePool(FakeResponse(500, busy), FakeResponse(200, ok))
    assert _kube(pool, ["t", "t"]).patch_sweep_status("ml", "s", {"phase": "x"}) == ok
    assert len(pool.requests) == 2
    conflict = {"kind": "Status", "code": 409, "reason": "Conflict", "message": "the object has been modified"}
    with pytest.raises(ApiException) as refused:
        _kube(FakePool(FakeResponse(409, conflict)), ["t"])._send("PATCH", "/x", {}, "application/json")
    assert isinstance(refused.value, ConflictException)


def test_the_credential_refresh_runs_at_most_once_a_second_and_stays_throttled(monkeypatch: pytest.MonkeyPatch) -> None:
    """kubernetes.config's loaders install a hook that re-applies the whole configuration before every request and
    installs itself again each time it runs (kube_config.py/incluster_config.py `_set_config`)."""
    from sweep_operator import kube

    clock = [100.0]
    monkeypatch.setattr(kube.time, "monotonic", lambda: clock[0])
    configuration = k8s.Configuration(host="https://api.example:6443")
    runs: list[float] = []

    def loader_hook(config: Any) -> None:  # as the loaders do it
        runs.append(clock[0])
        config.api_key["BearerToken"] = f"token-{len(runs)}"
        config.refresh_api_key_hook = loader_hook

    configuration.refresh_api_key_hook = kube.ThrottledRefresh(loader_hook)
    tokens = []
    for step in (0.0, 0.3, 0.9, 1.0, 1.5, 3.0):
        clock[0] = 100.0 + step
        tokens.append(configuration.get_api_key_with_prefix("BearerToken"))
    assert runs == [100.0, 101.0, 103.0]
    assert tokens == ["token-1", "token-1", "token-1", "token-2", "token-2", "token-3"]
    assert isinstance(configuration.refresh_api_key_hook, kube.ThrottledRefresh)


def test_without_a_proxy_the_request_goes_to_the_api_servers_pool_under_its_path_prefix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PoolManager.request parses the whole URL to find the host's pool on every request; `_send` asks the manager
    for that pool itself and sends the path (a proxy manager keeps the manager's own request: the tests above)."""
    import urllib3

    answer = {"metadata": {"name": "s", "resourceVersion": "8"}}
    origins: list[tuple[str, str, int | None]] = []
    sent: list[dict[str, Any]] = []

    class HostPool:
        def urlopen(self, method: str, url: str, body: bytes | None = None, headers: Any = None, **kw: Any) -> Any:
            sent.append({"method": method, "url": url, "body": body, "headers": dict(headers or {}), **kw})
            return FakeResponse(200, answer)

    configuration = k8s.Configuration(host="https://api.example:6443/k8s/clusters/c-1/")
    client = k8s.ApiClient(configuration)
    manager = urllib3.PoolManager()
    client.rest_client.pool_manager = manager

    def pool_for(host: str, port: int | None, scheme: str) -> HostPool:
        origins.append((scheme, host, port))
        return HostPool()

    monkeypatch.setattr(manager, "connection_from_host", pool_for)
    kube = KubeApi(client, Retry(attempts=1))
    assert kube.patch_sweep_status("ml", "s", {"phase": "Running"}) == answer
    assert origins == [("https", "api.example", 6443)]
    (request,) = sent
    assert request["url"] == "/k8s/clusters/c-1/apis/sweeps.dev/v1alpha1/namespaces/ml/trainingsweeps/s/status"
    assert (request["method"], request["redirect"], request["assert_same_host"]) == ("PATCH", False, False)
    assert request["headers"]["Content-Type"] == "application/merge-patch+json"
