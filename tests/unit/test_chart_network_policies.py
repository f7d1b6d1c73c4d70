"""The chart's NetworkPolicies, evaluated as an enforcing CNI would in the namespaces they land in: the operator's own
Ray pods keep every connection their run needs (a policy that selects a pod isolates it), whether or not the
namespace denies ingress by default, and no other team's Ray pod is selected. The evaluator
(tests/support/network_policy.py) is tested on Kubernetes' documented cases first."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from sweep_contracts import constants
from sweep_operator.rendering import build_rayjob
from sweep_operator.validation import parse_sweep
from sweep_sandbox.kuberay.builders import DEFAULT_HEAD_PORTS, cluster_for, plan_pods, pod_body, submitter_job_for
from sweep_sandbox.submitter_pods import submitter_pod_body
from tests.support.factories import gpu_sweep
from tests.support.network_policy import NetworkPolicies, Pod, matches_selector
from tests.unit.test_chart import NAMESPACE, one, render_values

# --- the evaluator on Kubernetes' own cases ---------------------------------------------------------------------


def _policy(namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": namespace}, "spec": spec}


WEB = Pod("web", "prod", {"app": "web", "tier": "front"}, "10.0.1.5", {"http": (8080, "TCP")})
API_IN_PROD = Pod("api", "prod", {"app": "api"}, "10.0.1.6")
API_IN_DEV = Pod("api", "dev", {"app": "api"}, "10.0.2.6")
OUTSIDE = Pod("laptop", "prod", {}, "192.168.1.10")
NAMESPACES = {
    "prod": {"kubernetes.io/metadata.name": "prod", "env": "prod"},
    "dev": {"kubernetes.io/metadata.name": "dev"},
}


@dataclass(frozen=True)
class Case:
    policies: list[dict[str, Any]]
    source: Pod
    port: int
    admitted: bool
    protocol: str = "TCP"


ON_WEB = {"podSelector": {"matchLabels": {"app": "web"}}}
CASES = {
    "no policy: open": Case([], API_IN_DEV, 5432, True),
    "default deny isolates": Case(
        [_policy("prod", {"podSelector": {}, "policyTypes": ["Ingress"]})], API_IN_PROD, 80, False
    ),
    "policyTypes left out means Ingress": Case([_policy("prod", {"podSelector": {}})], API_IN_PROD, 80, False),
    "an Egress-only policy leaves ingress open": Case(
        [_policy("prod", {"podSelector": {}, "policyTypes": ["Egress"]})], API_IN_PROD, 80, True
    ),
    "a policy of another namespace does not apply": Case(
        [_policy("dev", {"podSelector": {}, "policyTypes": ["Ingress"]})], API_IN_PROD, 80, True
    ),
    "an empty rule admits everything": Case([_policy("prod", {**ON_WEB, "ingress": [{}]})], API_IN_DEV, 1, True),
    "ports without from: any source on that port": Case(
        [_policy("prod", {**ON_WEB, "ingress": [{"ports": [{"port": 80}]}]})], API_IN_DEV, 80, True
    ),
    "ports without from: other ports refused": Case(
        [_policy("prod", {**ON_WEB, "ingress": [{"ports": [{"port": 80}]}]})], API_IN_DEV, 81, False
    ),
    "the protocol defaults to TCP": Case(
        [_policy("prod", {**ON_WEB, "ingress": [{"ports": [{"port": 53}]}]})], API_IN_PROD, 53, False, "UDP"
    ),
    "a named port is the destination's container port": Case(
        [_policy("prod", {**ON_WEB, "ingress": [{"ports": [{"port": "http"}]}]})], API_IN_PROD, 8080, True
    ),
    "a named port is not another number": Case(
        [_policy("prod", {**ON_WEB, "ingress": [{"ports": [{"port": "http"}]}]})], API_IN_PROD, 80, False
    ),
    "a name the destination lacks admits nothing": Case(
        [_policy("prod", {**ON_WEB, "ingress": [{"ports": [{"port": "metrics"}]}]})], API_IN_PROD, 8080, False
    ),
    "endPort admits a range": Case(
        [_policy("prod", {**ON_WEB, "ingress": [{"ports": [{"port": 10002, "endPort": 19999}]}]})],
        API_IN_PROD,
        19999,
        True,
    ),
    "a podSelector alone means the policy's namespace": Case(
        [_policy("prod", {**ON_WEB, "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "api"}}}]}]})],
        API_IN_DEV,
        80,
        False,
    ),
    "namespaceSelector and podSelector in one peer: both": Case(
        [
            _policy(
                "prod",
                {
                    **ON_WEB,
                    "ingress": [
                        {
                            "from": [
                                {
                                    "namespaceSelector": {"matchLabels": {"env": "prod"}},
                                    "podSelector": {"matchLabels": {"app": "api"}},
                                }
                            ]
                        }
                    ],
                },
            )
        ],
        API_IN_DEV,
        80,
        False,
    ),
    "namespaceSelector and podSelector as two peers: either": Case(
        [
            _policy(
                "prod",
                {
                    **ON_WEB,
                    "ingress": [
                        {
                            "from": [
                                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "dev"}}},
                                {"podSelector": {"matchLabels": {"app": "nothing"}}},
                            ]
                        }
                    ],
                },
            )
        ],
        API_IN_DEV,
        80,
        True,
    ),
    "an empty namespaceSelector is every namespace": Case(
        [_policy("prod", {**ON_WEB, "ingress": [{"from": [{"namespaceSelector": {}}]}]})], API_IN_DEV, 80, True
    ),
    "policies are unioned": Case(
        [
            _policy("prod", {**ON_WEB, "ingress": [{"ports": [{"port": 80}]}]}),
            _policy("prod", {**ON_WEB, "ingress": [{"ports": [{"port": 443}]}]}),
        ],
        API_IN_PROD,
        443,
        True,
    ),
    "ipBlock with except": Case(
        [
            _policy(
                "prod",
                {
                    **ON_WEB,
                    "ingress": [{"from": [{"ipBlock": {"cidr": "192.168.0.0/16", "except": ["192.168.1.0/24"]}}]}],
                },
            )
        ],
        OUTSIDE,
        80,
        False,
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_the_evaluator_follows_kubernetes_network_policy_semantics(case: Case) -> None:
    world = NetworkPolicies(case.policies, NAMESPACES)
    assert world.admits(case.source, WEB, case.port, case.protocol) is case.admitted


def test_the_evaluators_selectors_follow_kubernetes_and_it_refuses_what_the_api_refuses() -> None:
    labels = {"app": "web", "tier": "front"}
    expression = "matchExpressions"
    assert matches_selector({}, labels)
    assert matches_selector({expression: [{"key": "env", "operator": "NotIn", "values": ["prod"]}]}, labels)
    assert not matches_selector({expression: [{"key": "app", "operator": "NotIn", "values": ["web"]}]}, labels)
    assert matches_selector({expression: [{"key": "app", "operator": "In", "values": ["db", "web"]}]}, labels)
    assert not matches_selector({expression: [{"key": "env", "operator": "In", "values": ["prod"]}]}, labels)
    assert matches_selector({expression: [{"key": "tier", "operator": "Exists"}]}, labels)
    assert not matches_selector({expression: [{"key": "tier", "operator": "DoesNotExist"}]}, labels)
    assert not matches_selector(
        {"matchLabels": {"app": "web"}, expression: [{"key": "x", "operator": "Exists"}]}, labels
    )
    for bad in (
        {expression: [{"key": "app", "operator": "Equals", "values": ["web"]}]},
        {expression: [{"key": "app", "operator": "In", "values": []}]},
        {expression: [{"key": "app", "operator": "Exists", "values": ["web"]}]},
        {"matchLabel": {"app": "web"}},
    ):
        with pytest.raises(ValueError):
            matches_selector(bad, labels)
    no_selector = _policy("prod", {**ON_WEB, "ingress": [{"from": [{}]}]})
    with pytest.raises(ValueError):
        NetworkPolicies([no_selector], NAMESPACES).admits(API_IN_PROD, WEB, 80)


# --- the chart's policies, in the namespaces they land in --------------------------------------------------------

KUBERAY_NAMESPACE = "kuberay-system"
# KubeRay's chart (helm-chart/kuberay-operator/templates/deployment.yaml): the operator pod's labels.
KUBERAY_POD_LABELS = {
    "app.kubernetes.io/name": "kuberay-operator",
    "app.kubernetes.io/instance": "kuberay-operator",
    "app.kubernetes.io/component": "kuberay-operator",
}
# What Ray listens on, head and workers alike: the GCS (head only), the dashboard and its agent, the client server,
# the raylet and object manager (random unless set) and the worker processes' range (10002-19999 by default).
RAY_PORTS = (6379, 8265, 10001, 52365, 37133, 41517, 10002, 14870, 19999)
RAY_METRICS_PORTS = (8080, 44217, 44227)
FOREIGN_LABELS = {"team": "b"}


def _ray_pods(cluster: Mapping[str, Any]) -> list[Pod]:
    """KubeRay's pods for a RayCluster (the stand-in's pod_body, which follows KubeRay v1.7.0's labels)."""
    pods = []
    for index, plan in enumerate(plan_pods(cluster, workers=2)):
        body = pod_body(cluster, plan)
        ports = {name: (port, "TCP") for name, port in DEFAULT_HEAD_PORTS.items()} if plan.node_type == "head" else {}
        ip = f"10.1.{len(cluster['metadata']['name'])}.{index + 10}"
        pods.append(Pod(body["metadata"]["name"], body["metadata"]["namespace"], body["metadata"]["labels"], ip, ports))
    return pods


def our_run(namespace: str) -> tuple[list[Pod], Pod]:
    """The Ray pods and the submitter pod of one of our sweeps' runs, from the RayJob the operator renders."""
    rayjob = build_rayjob(parse_sweep(gpu_sweep("digits", namespace)), "abc123", deadline_at=1900000000)
    rayjob["metadata"]["uid"] = "rayjob-uid"  # the API server's, on create
    cluster = cluster_for(rayjob, f"{rayjob['metadata']['name']}-raycluster")
    cluster["metadata"]["uid"] = "cluster-uid"
    job = submitter_job_for(rayjob, cluster)
    job["metadata"]["uid"] = "job-uid"
    submitter = submitter_pod_body(job)
    meta = submitter["metadata"]
    return _ray_pods(cluster), Pod(meta["name"], meta["namespace"], meta["labels"], "10.1.0.99")


def another_teams_cluster(namespace: str) -> list[Pod]:
    """A RayCluster another team made by hand in the same namespace: KubeRay's labels, none of ours."""
    template = {"metadata": {"labels": dict(FOREIGN_LABELS)}, "spec": {"containers": [{"name": "ray", "image": "r"}]}}
    cluster = {
        "apiVersion": constants.RAY_API_VERSION,
        "kind": constants.RAYCLUSTER_KIND,
        "metadata": {"name": "their-ray", "namespace": namespace, "uid": "their-uid", "labels": {}},
        "spec": {
            "headGroupSpec": {"template": template},
            "workerGroupSpecs": [{"groupName": "cpu", "replicas": 2, "template": template}],
        },
    }
    return _ray_pods(cluster)


@dataclass
class World:
    """The chart's policies (and a namespace administrator's), the namespaces they land in and the pods there."""

    ours: list[dict[str, Any]]
    network: NetworkPolicies
    operator: Pod
    kuberay: Pod
    scraper: Pod
    runs: dict[str, tuple[list[Pod], Pod]]  # runner namespace -> our Ray pods, our submitter
    foreign: dict[str, list[Pod]]  # runner namespace -> another team's Ray pods


def build_world(values: dict[str, Any], *, default_deny: bool = False) -> World:
    docs = render_values(values)
    ours = [d for d in docs if d["kind"] == "NetworkPolicy"]
    runner_namespaces = sorted({d["metadata"]["namespace"] for d in docs if d["kind"] == "ResourceQuota"})
    assert runner_namespaces, "the chart renders a ResourceQuota in each runner namespace"
    kuberay_namespace = (values.get("kuberay") or {}).get("namespace", KUBERAY_NAMESPACE)
    deployment = one(docs, "Deployment")
    operator = Pod("operator", NAMESPACE, deployment["spec"]["template"]["metadata"]["labels"], "10.9.0.2")
    kuberay = Pod("kuberay-operator", kuberay_namespace, KUBERAY_POD_LABELS, "10.9.0.3")
    scraper = Pod("prometheus", "monitoring", {"app.kubernetes.io/name": "prometheus"}, "10.9.0.4")
    admin: list[dict[str, Any]] = []
    if default_deny:  # the namespace administrator's own policy, beside ours
        admin = [_policy(ns, {"podSelector": {}, "policyTypes": ["Ingress"]}) for ns in runner_namespaces]
    namespaces = {NAMESPACE, kuberay_namespace, "monitoring", "elsewhere", "ingress-nginx", *runner_namespaces}
    return World(
        ours,
        NetworkPolicies.of(ours + admin, namespaces),
        operator,
        kuberay,
        scraper,
        {ns: our_run(ns) for ns in runner_namespaces},
        {ns: another_teams_cluster(ns) for ns in runner_namespaces},
    )


def cut_off(world: World) -> list[str]:
    """Every Ray pod selected by a policy of ours that refuses its own cluster's pods on a Ray port, or KubeRay on a
    head's dashboard: what an enforcing CNI would break."""
    ours = NetworkPolicies(world.ours, world.network.namespace_labels)
    problems = []
    for namespace, (pods, _) in world.runs.items():
        for pod in pods + world.foreign[namespace]:
            if not ours.isolated(pod):
                continue
            cluster = pod.labels[constants.RAY_LABEL_CLUSTER]
            peers = [p for p in pods + world.foreign[namespace] if p.labels[constants.RAY_LABEL_CLUSTER] == cluster]
            for peer in peers:
                for port in RAY_PORTS:
                    if peer is not pod and not world.network.admits(peer, pod, port):
                        problems.append(f"{peer.name} -> {pod.name}:{port}")
            if pod.labels[constants.RAY_LABEL_NODE_TYPE] == "head" and not world.network.admits(
                world.kuberay, pod, 8265
            ):
                problems.append(f"KubeRay -> {pod.name}:8265")
    return problems


SCENARIOS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "watched namespaces": {"watchNamespaces": ["team-a", "team-b"]},
    "runner namespaces of their own": {"runner": {"serviceAccount": {"perNamespace": {"team-c": {}}}}},
    "KubeRay elsewhere, scrapers narrowed": {
        "kuberay": {"namespace": "ray-system"},
        "watchNamespaces": ["team-a"],
        "networkPolicy": {
            "metricsFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
        },
    },
}


@pytest.mark.parametrize("default_deny", [False, True], ids=["open namespace", "default-deny namespace"])
@pytest.mark.parametrize("values", SCENARIOS.values(), ids=list(SCENARIOS))
def test_no_ray_pod_is_cut_off_from_its_cluster_or_kuberay_and_other_teams_ray_pods_are_never_selected(
    values: dict[str, Any], default_deny: bool
) -> None:
    world = build_world(values, default_deny=default_deny)
    assert not cut_off(world)
    ours = NetworkPolicies(world.ours, world.network.namespace_labels)
    for namespace, (pods, submitter) in world.runs.items():
        assert not [p.name for p in world.foreign[namespace] if ours.isolated(p)], "another team's Ray pods"
        (head,) = [p for p in pods if p.labels[constants.RAY_LABEL_NODE_TYPE] == "head"]
        assert all(ours.isolated(p) for p in pods), "the chart's policy covers our Ray pods (not vacuous)"
        assert not ours.isolated(submitter)  # it only calls out
        # Whatever else the namespace says: the graceful stop, the submitter and the scrapers reach the head.
        assert world.network.admits(world.operator, head, 8265)
        assert world.network.admits(submitter, head, 8265)
        assert all(world.network.admits(world.scraper, p, port) for p in pods for port in RAY_METRICS_PORTS)
        # What nothing asked for stays out of our Ray pods once they are isolated.
        stranger = Pod("stranger", "elsewhere", {"app": "curl"}, "10.9.0.9")
        assert not world.network.admits(stranger, head, 6379)
        assert not world.network.admits(stranger, head, 8265)
        neighbour = Pod("neighbour", namespace, {"app": "notebook"}, "10.1.0.50")
        assert not world.network.admits(neighbour, head, 10001)


def test_the_operators_own_policy_never_selects_a_ray_pod() -> None:
    world = build_world({"watchNamespaces": ["team-a"]})
    (operator_policy,) = [p for p in world.ours if p["metadata"]["namespace"] == NAMESPACE]
    only = NetworkPolicies([operator_policy], world.network.namespace_labels)
    pods, submitter = world.runs["team-a"]
    assert not [p for p in [*pods, submitter, *world.foreign["team-a"]] if only.isolated(p)]
    assert only.isolated(world.operator)


def test_with_the_ray_policy_off_no_ray_pod_is_selected_and_extra_rules_admit_more() -> None:
    off = build_world({"watchNamespaces": ["team-a"], "networkPolicy": {"rayDashboard": False}})
    ours = NetworkPolicies(off.ours, off.network.namespace_labels)
    pods, _ = off.runs["team-a"]
    assert not [p for p in pods + off.foreign["team-a"] if ours.isolated(p)]

    ingress_controller = Pod("nginx", "ingress-nginx", {"app.kubernetes.io/name": "ingress-nginx"}, "10.9.0.7")
    extra = [
        {
            "ports": [{"port": 8265, "protocol": "TCP"}],
            "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}],
        }
    ]
    for rules, admitted in (([], False), (extra, True)):
        world = build_world({"watchNamespaces": ["team-a"], "networkPolicy": {"rayExtraIngress": rules}})
        (head,) = [p for p in world.runs["team-a"][0] if p.labels[constants.RAY_LABEL_NODE_TYPE] == "head"]
        assert world.network.admits(ingress_controller, head, 8265) is admitted
        assert not world.network.admits(ingress_controller, head, 6379)
