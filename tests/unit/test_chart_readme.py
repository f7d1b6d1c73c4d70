"""The chart README's tables say what the chart installs and grants, and what the operator exports: each is compared
with the rendered chart (every scenario's documents, by template folder; every rule of the operator's roles and of
the tenants' aggregated roles) or with the series the operator registers, so neither can drift from the other. And
the tenants' aggregated roles give a namespace's `edit` users their sweeps, never a sweep's status or a ledger."""

from __future__ import annotations

import functools
import re
from typing import Any

import yaml
from prometheus_client.metrics import MetricWrapperBase

from sweep_contracts.constants import LEDGER_RECORD_NAME
from sweep_operator.install_checks import check_kuberay_identity
from sweep_operator.metrics import OperatorMetrics
from sweep_operator.settings import Settings
from tests.unit.test_chart import (
    CHART,
    NAMESPACE,
    RELEASE,
    SCENARIOS,
    _chart,
    of_kind,
    render_values,
    tenant_roles,
)

FULLNAME = f"{RELEASE}-trainingsweep-operator"
# Beside test_chart's scenarios, what they leave off: the optional monitoring objects and the runner account.
EVERYTHING_ON = [
    *SCENARIOS.values(),
    {
        "monitoring": {"dashboard": {"enabled": True}, "prometheusRule": {"enabled": True}},
        "runner": {"serviceAccount": {"create": True}},
        "metrics": {"serviceMonitor": {"enabled": True}},
    },
]


def readme_table(heading: str) -> list[list[str]]:
    """The body rows (cells) of the first Markdown table from the line that starts with `heading` on."""
    lines = (CHART / "README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    rows: list[list[str]] = []
    for line in lines[start:]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            break
    _header, rule, *body = rows
    assert set(rule[0]) <= {"-", ":"}, f"{heading}: not a table"
    return body


def ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def placeholders(name: str) -> str:
    """A README name (`<fullname>-webhook-tls`, `<kuberay.serviceAccountName>`) as the default render spells it."""
    return name.replace("<fullname>", FULLNAME).replace("<kuberay.serviceAccountName>", "kuberay-operator")


# --- "What it installs" -----------------------------------------------------------------------------------------


@functools.cache
def rendered_kinds_by_folder() -> dict[str, set[str]]:
    """Template folder (`templates/manager/`) -> every kind it renders in some scenario."""
    kinds: dict[str, set[str]] = {}
    for values in EVERYTHING_ON:
        for path, text in _chart().render(values, name=RELEASE, namespace=NAMESPACE).items():
            if path.endswith("NOTES.txt"):
                continue
            folder = "/".join(path.split("/")[1:3]) + "/"
            for doc in yaml.safe_load_all(text):
                if doc:
                    kinds.setdefault(folder, set()).add(doc["kind"])
    return kinds


def test_what_it_installs_names_every_kind_each_template_folder_renders_and_every_crd() -> None:
    rendered = rendered_kinds_by_folder()
    crds = {doc["metadata"]["name"] for entry in _chart().crds for doc in yaml.safe_load_all(entry["data"]) if doc}
    covered: set[str] = set()
    for concern, templates, objects in readme_table("## What it installs"):
        folders = {t for t in ticked(templates) if t.startswith(("templates/", "crds/"))}
        covered |= folders
        if folders == {"crds/"}:
            assert {t for t in ticked(objects) if t.endswith((".sweeps.dev", ".kopf.dev"))} == crds
            continue
        named = {t for t in ticked(objects) if re.fullmatch(r"[A-Z][A-Za-z]+", t)}
        expected = set().union(*(rendered.get(folder, set()) for folder in folders))
        assert named == expected, f"{concern}: the README names {sorted(named)}, the chart renders {sorted(expected)}"
    assert set(rendered) <= covered, f"template folders missing from the table: {sorted(set(rendered) - covered)}"


# --- RBAC -------------------------------------------------------------------------------------------------------

Grant = tuple[str, str, str, str, str]  # (apiGroup, resource, resourceName or "", verb, where)


def operator_grants(docs: list[dict[str, Any]]) -> set[Grant]:
    """Every (group, resource, name, verb, where) the chart's bindings give the operator's ServiceAccount; where is
    `cluster` (a ClusterRoleBinding), `release` (a RoleBinding in the release namespace) or `watched` (one elsewhere)."""
    roles = {
        (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in of_kind(docs, "ClusterRole")
    }
    roles |= {(d["kind"], d["metadata"]["namespace"], d["metadata"]["name"]): d for d in of_kind(docs, "Role")}
    grants: set[Grant] = set()
    for binding in of_kind(docs, "ClusterRoleBinding") + of_kind(docs, "RoleBinding"):
        if not any(s.get("name") == FULLNAME and s.get("namespace") == NAMESPACE for s in binding["subjects"]):
            continue
        namespace = binding["metadata"].get("namespace")
        where = "cluster" if namespace is None else "release" if namespace == NAMESPACE else "watched"
        ref = binding["roleRef"]
        role = roles[(ref["kind"], namespace if ref["kind"] == "Role" else None, ref["name"])]
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for name in rule.get("resourceNames") or [""]:
                        grants |= {(group, resource, name, verb, where) for verb in rule["verbs"]}
    return grants


def groups_of(cell: str) -> list[str]:
    return ticked(cell) + ([""] if re.search(r"\bcore\b", cell) else [])


def readme_operator_grants() -> set[Grant]:
    grants: set[Grant] = set()
    for groups, resources, names, verbs, where, _why in readme_table("RBAC enumerates every resource and verb"):
        places = {
            place
            for place, phrase in (
                ("cluster", "cluster-wide"),
                ("watched", "watched namespace"),
                ("release", "release namespace"),
            )
            if phrase in where
        }
        assert places, f"unknown scope {where!r}"
        for group in groups_of(groups):
            for resource in ticked(resources):
                for name in [placeholders(n) for n in ticked(names)] or [""]:
                    grants |= {(group, resource, name, verb, place) for verb in verbs.split() for place in places}
    return grants


def test_the_rbac_table_is_every_rule_the_operator_is_granted_in_some_mode() -> None:
    rendered = set().union(*(operator_grants(render_values(values)) for values in EVERYTHING_ON))
    documented = readme_operator_grants()
    assert not rendered - documented, f"granted, not in the README: {sorted(rendered - documented)}"
    assert not documented - rendered, f"in the README, never granted: {sorted(documented - rendered)}"
    assert ("", "configmaps", LEDGER_RECORD_NAME, "update", "release") in rendered


Aggregated = tuple[str, frozenset[str], str, str, str]  # (ClusterRole, aggregated into, apiGroup, resource, verb)


def rendered_tenant_grants(docs: list[dict[str, Any]]) -> set[Aggregated]:
    grants: set[Aggregated] = set()
    for role in tenant_roles(docs):
        prefix = "rbac.authorization.k8s.io/aggregate-to-"
        into = frozenset(
            k.removeprefix(prefix)
            for k, v in role["metadata"]["labels"].items()
            if k.startswith(prefix) and v == "true"
        )
        for rule in role["rules"]:
            assert "resourceNames" not in rule
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    grants |= {(role["metadata"]["name"], into, group, resource, verb) for verb in rule["verbs"]}
    return grants


def test_the_tenants_table_is_every_role_aggregated_into_the_default_roles() -> None:
    documented: set[Aggregated] = set()
    for name, into, groups, resources, verbs in readme_table("What the namespaces' users get"):
        for group in groups_of(groups):
            for resource in ticked(resources):
                documented |= {
                    (placeholders(ticked(name)[0]), frozenset(ticked(into)), group, resource, verb)
                    for verb in verbs.split()
                }
    assert rendered_tenant_grants(render_values({})) == documented


def default_role(docs: list[dict[str, Any]], role: str) -> dict[tuple[str, str], set[str]]:
    """What Kubernetes' `view`, `edit` or `admin` ClusterRole gains from the chart: the rules of every ClusterRole
    labelled to aggregate into it (the built-in `view` carries aggregate-to-edit and `edit` aggregate-to-admin, so
    the chart's roles label each role they reach)."""
    table: dict[tuple[str, str], set[str]] = {}
    for _name, into, group, resource, verb in rendered_tenant_grants(docs):
        if role in into:
            table.setdefault((group, resource), set()).add(verb)
    return table


READ = {"get", "list", "watch"}


def test_a_namespace_editor_may_apply_change_and_delete_sweeps_but_never_write_their_status_nor_a_ledger() -> None:
    docs = render_values({})
    write = {"create", "delete", "patch", "update"}
    for role in ("edit", "admin"):
        assert default_role(docs, role) == {
            ("sweeps.dev", "trainingsweeps"): READ | write,
            ("sweeps.dev", "trainingsweeps/status"): READ,
            ("sweeps.dev", "gpuhourledgers"): READ,
        }, role
    assert default_role(docs, "view") == {
        ("sweeps.dev", "trainingsweeps"): READ,
        ("sweeps.dev", "trainingsweeps/status"): READ,
        ("sweeps.dev", "gpuhourledgers"): READ,
    }
    off = render_values({"rbac": {"aggregateToDefaultRoles": False}})
    assert default_role(off, "edit") == {("sweeps.dev", "gpuhourledgers"): READ}


# --- metrics ----------------------------------------------------------------------------------------------------


def registered_series() -> dict[str, tuple[str, frozenset[str] | None]]:
    """Every series the operator registers (a counter as `<name>_total`) -> its type and, where the registry knows
    them before any sample, its label names (the state gauges get theirs at each scrape)."""
    metrics = OperatorMetrics()
    settings = Settings(kuberay_service_account="kuberay-system/kuberay-operator")
    check_kuberay_identity(settings, lambda namespace, name: True, metrics.registry)
    # prometheus_client's metric objects hold their label names before any sample; the state collector does not.
    labels = {
        collector._name: frozenset(collector._labelnames)
        for collector in metrics.registry._collector_to_names
        if isinstance(collector, MetricWrapperBase)
    }
    return {
        f"{family.name}_total" if family.type == "counter" else family.name: (family.type, labels.get(family.name))
        for family in metrics.registry.collect()
    }


def test_the_metrics_table_is_every_series_the_operator_registers() -> None:
    registered = registered_series()
    documented = {}
    for name, kind, labels, _what in readme_table("The operator serves Prometheus metrics"):
        (series,) = ticked(name)
        known = registered.get(series, (kind, None))[1]
        documented[series] = (kind, None if known is None else frozenset(re.findall(r"[a-z_]+", labels)))
    assert documented == registered
