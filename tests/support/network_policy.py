"""Which connections a set of NetworkPolicies admits, as an enforcing CNI decides it (networking.k8s.io/v1 ingress).

The semantics are Kubernetes' own (`pkg/apis/networking/types.go`, the NetworkPolicy concept page): a pod selected
by any policy whose policyTypes include Ingress is isolated for ingress, and then admits a connection only when some
rule of some policy selecting it admits it (rules and policies are unioned; order never matters). A rule with no
`ports` admits every port, with no `from` every source; the peers of one rule are alternatives, while a peer holding
both a namespaceSelector and a podSelector needs both. A podSelector alone selects pods of the policy's own namespace;
a namespaceSelector selects whole namespaces by their labels (`kubernetes.io/metadata.name` among them). Ports match
by number, by a range (`endPort`) or by the name of a container port of the destination pod; the protocol defaults to
TCP. Anything the API would refuse (an unknown selector operator, a peer with no selector) raises rather than guesses.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set on every namespace by the API server (1.21+)


@dataclass(frozen=True)
class Pod:
    """A pod as NetworkPolicies see it: its namespace, labels, IP and named container ports."""

    name: str
    namespace: str
    labels: Mapping[str, str] = field(default_factory=dict)
    ip: str = "10.0.0.1"
    ports: Mapping[str, tuple[int, str]] = field(default_factory=dict)  # port name -> (number, protocol)


def matches_selector(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector: every matchLabels pair and every matchExpressions requirement holds; {} matches all."""
    if selector is None:
        raise ValueError("a missing selector is not an empty one: the caller decides what its absence means")
    unknown = set(selector) - {"matchLabels", "matchExpressions"}
    if unknown:
        raise ValueError(f"unknown selector fields {sorted(unknown)}")
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for requirement in selector.get("matchExpressions") or []:
        key, operator, values = requirement["key"], requirement["operator"], requirement.get("values") or []
        if operator == "In":
            if not values:
                raise ValueError(f"{key}: In needs values")
            ok = key in labels and labels[key] in values
        elif operator == "NotIn":
            if not values:
                raise ValueError(f"{key}: NotIn needs values")
            ok = key not in labels or labels[key] not in values  # an absent key satisfies NotIn
        elif operator == "Exists":
            if values:
                raise ValueError(f"{key}: Exists takes no values")
            ok = key in labels
        elif operator == "DoesNotExist":
            if values:
                raise ValueError(f"{key}: DoesNotExist takes no values")
            ok = key not in labels
        else:
            raise ValueError(f"{key}: unknown selector operator {operator!r}")
        if not ok:
            return False
    return True


def policy_types(policy: Mapping[str, Any]) -> list[str]:
    """spec.policyTypes, or the API's default when it is unset: Ingress, plus Egress when egress rules exist."""
    spec = policy["spec"]
    if spec.get("policyTypes"):
        return list(spec["policyTypes"])
    return ["Ingress", "Egress"] if spec.get("egress") else ["Ingress"]


def selects(policy: Mapping[str, Any], pod: Pod) -> bool:
    """The policy applies to the pod's ingress: same namespace, its podSelector matches, Ingress among its types."""
    return (
        policy["metadata"]["namespace"] == pod.namespace
        and "Ingress" in policy_types(policy)
        and matches_selector(policy["spec"]["podSelector"], pod.labels)
    )


def _peer_admits(
    peer: Mapping[str, Any], policy_namespace: str, source: Pod, namespace_labels: Mapping[str, Mapping[str, str]]
) -> bool:
    if "ipBlock" in peer:
        if set(peer) != {"ipBlock"}:
            raise ValueError("an ipBlock peer holds nothing else")
        block = peer["ipBlock"]
        address = ipaddress.ip_address(source.ip)
        if address not in ipaddress.ip_network(block["cidr"], strict=False):
            return False
        return not any(address in ipaddress.ip_network(e, strict=False) for e in block.get("except") or [])
    if "podSelector" not in peer and "namespaceSelector" not in peer:
        raise ValueError(f"a peer needs a podSelector, a namespaceSelector or an ipBlock: {dict(peer)}")
    if "namespaceSelector" in peer:
        labels = namespace_labels.get(source.namespace)
        if labels is None:
            raise ValueError(f"namespace {source.namespace} is not in the world: its labels are unknown")
        if not matches_selector(peer["namespaceSelector"], labels):
            return False
    elif source.namespace != policy_namespace:
        return False  # a podSelector alone means the policy's own namespace
    return "podSelector" not in peer or matches_selector(peer["podSelector"], source.labels)


def _port_admits(entry: Mapping[str, Any], destination: Pod, port: int, protocol: str) -> bool:
    if entry.get("protocol", "TCP") != protocol:
        return False
    if "port" not in entry:
        return True  # every port of that protocol
    wanted = entry["port"]
    if isinstance(wanted, str):
        if "endPort" in entry:
            raise ValueError("endPort needs a numeric port")
        named = destination.ports.get(wanted)
        return named is not None and named == (port, protocol)
    end = entry.get("endPort", wanted)
    if end < wanted:
        raise ValueError(f"endPort {end} is below port {wanted}")
    return bool(wanted <= port <= end)


def _rule_admits(
    rule: Mapping[str, Any],
    policy_namespace: str,
    source: Pod,
    destination: Pod,
    port: int,
    protocol: str,
    namespace_labels: Mapping[str, Mapping[str, str]],
) -> bool:
    ports = rule.get("ports") or []
    if ports and not any(_port_admits(entry, destination, port, protocol) for entry in ports):
        return False
    peers = rule.get("from") or []
    return not peers or any(_peer_admits(peer, policy_namespace, source, namespace_labels) for peer in peers)


@dataclass(frozen=True)
class NetworkPolicies:
    """The policies of a cluster and its namespaces' labels; answers whether a connection is admitted."""

    policies: Sequence[Mapping[str, Any]]
    namespace_labels: Mapping[str, Mapping[str, str]]

    @classmethod
    def of(cls, policies: Iterable[Mapping[str, Any]], namespaces: Iterable[str]) -> NetworkPolicies:
        """Namespaces labelled as the API server labels them (their name only)."""
        return cls(list(policies), {name: {NAMESPACE_NAME_LABEL: name} for name in namespaces})

    def selecting(self, pod: Pod) -> list[Mapping[str, Any]]:
        return [p for p in self.policies if selects(p, pod)]

    def isolated(self, pod: Pod) -> bool:
        return bool(self.selecting(pod))

    def admits(self, source: Pod, destination: Pod, port: int, protocol: str = "TCP") -> bool:
        """Whether `source` may open a connection to `destination` on `port` (ingress side only)."""
        selecting = self.selecting(destination)
        if not selecting:
            return True
        return any(
            _rule_admits(
                rule, policy["metadata"]["namespace"], source, destination, port, protocol, self.namespace_labels
            )
            for policy in selecting
            for rule in policy["spec"].get("ingress") or []
        )
