"""Helpers shared by sweepctl subcommands: exit codes, reading manifests, printing problems."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input the user can fix (missing file, malformed YAML); printed without a traceback, exit 2."""


def load_documents(path: str) -> list[Any]:
    """Every YAML document in `path` ('-' for stdin), empty documents skipped."""
    import sys

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise UsageError(f"{path} is not valid YAML: {exc}") from None
    if not docs:
        raise UsageError(f"{path} holds no YAML document")
    return docs


def load_limits(path: str | None) -> Any:
    """OperatorLimits from a YAML file of camelCase keys (default limits when `path` is None)."""
    from ..settings import OperatorLimits, SettingsError

    if path is None:
        return OperatorLimits()
    (data, *_) = load_documents(path)
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping of limits (maxWorkersPerSweep: 8, ...)")
    try:
        return OperatorLimits.from_mapping(data, where=path)
    except SettingsError as exc:
        raise UsageError(str(exc)) from None


def load_sweep(path: str, limits: Any) -> Any:
    """The one TrainingSweep in `path`, parsed and checked against `limits`; UsageError listing every problem."""
    from sweep_contracts.problems import SpecError

    from ..validation import parse_sweep

    docs = load_documents(path)
    if len(docs) != 1:
        raise UsageError(f"{path}: expected one TrainingSweep, found {len(docs)} documents")
    try:
        return parse_sweep(docs[0], limits)
    except SpecError as exc:
        raise UsageError("invalid TrainingSweep\n" + "\n".join(f"{path}: {p}" for p in exc.problems)) from None


def api_error_text(exc: Any, name: str, resource: str = "") -> str:
    """An API error as kubectl prints it: `Error from server (NotFound): trainingsweeps.sweeps.dev "NAME" not found`
    (the Status's reason and message; a 404 worded as kubectl words it whatever the server's message)."""
    import json

    from sweep_contracts import constants

    resource = resource or f"{constants.PLURAL}.{constants.GROUP}"
    try:
        doc = json.loads(getattr(exc, "body", "") or "")
    except (TypeError, ValueError):
        doc = {}
    doc = doc if isinstance(doc, dict) else {}
    if getattr(exc, "status", None) == 404:
        return f'Error from server (NotFound): {resource} "{name}" not found'
    reason = doc.get("reason") or getattr(exc, "reason", "") or "Unknown"
    message = doc.get("message") or f"{resource} {name!r}: HTTP {getattr(exc, 'status', '?')}"
    return f"Error from server ({reason}): {message}"


def run_id_from(value: str | None) -> str:
    """`--run-id` checked, or a fresh run id."""
    from ..rendering import check_run_id, new_run_id

    try:
        return check_run_id(value) if value else new_run_id()
    except ValueError as exc:
        raise UsageError(f"--run-id: {exc}") from None


def kube_connection(kubeconfig: str | None, context: str | None, namespace: str | None) -> tuple[Any, str, str]:
    """(api client, namespace, kubeconfig user) as kubectl resolves them: `--kubeconfig`, else $KUBECONFIG, else
    ~/.kube/config, the named or current context and its namespace; in a pod with no kubeconfig, the pod's
    service account. UsageError when no kubeconfig works or the context does not exist."""
    import os

    import kubernetes
    from kubernetes import config

    if not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        config.load_incluster_config()
        return kubernetes.client.ApiClient(), namespace or "default", ""
    try:
        contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
        if context:
            active = next((c for c in contexts if c.get("name") == context), None)
            if active is None:
                raise UsageError(f"--context {context!r}: no such context in the kubeconfig")
        api_client = config.new_client_from_config(config_file=kubeconfig, context=context)
    except (config.ConfigException, OSError, TypeError) as exc:
        raise UsageError(f"no usable kubeconfig: {exc}") from None
    settings = (active or {}).get("context", {})
    return api_client, namespace or settings.get("namespace") or "default", settings.get("user") or ""
