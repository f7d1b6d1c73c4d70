"""sweep_contracts.runtime_env.decode: the one reader of spec.runtimeEnvYAML, as strict as KubeRay v1.7.0's
utils/dashboardclient/dashboard_httpclient.go UnmarshalRuntimeEnvYAML (sigs.k8s.io/yaml into map[string]any)."""

from __future__ import annotations

import pytest

from sweep_contracts import constants, runtime_env
from sweep_contracts.runspec import RunSpec
from sweep_operator.rendering import build_rayjob
from sweep_operator.validation import parse_sweep
from tests.support.factories import cpu_sweep


@pytest.mark.parametrize("text", [None, "", "~", "null\n", "# only a comment\n"])
def test_an_empty_or_null_document_is_an_empty_runtime_env(text: str | None) -> None:
    assert runtime_env.decode(text) == {}


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("env_vars: [unclosed", "runtimeEnvYAML is not YAML"),
        ("a: 1\n b: 2", "runtimeEnvYAML is not YAML"),
        ("just words", "runtimeEnvYAML must be a YAML mapping, not str"),
        ("- env_vars", "runtimeEnvYAML must be a YAML mapping, not list"),
        ("7", "runtimeEnvYAML must be a YAML mapping, not int"),
    ],
)
def test_what_kuberay_cannot_unmarshal_is_refused_naming_the_field(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        runtime_env.decode(text)


def test_keys_come_back_as_strings_as_kuberays_yaml_to_json_makes_them() -> None:
    assert runtime_env.decode("1: one\nenv_vars: {A: '1'}\n") == {"1": "one", "env_vars": {"A": "1"}}


def test_env_vars_reads_through_decode_and_is_empty_for_what_decode_refuses() -> None:
    assert runtime_env.env_vars("env_vars: {A: 1, B: x}\n") == {"A": "1", "B": "x"}
    assert runtime_env.env_vars("- env_vars") == {}
    assert runtime_env.env_vars("env_vars: [unclosed") == {}
    assert runtime_env.env_vars("env_vars: [a]\n") == {}


def test_decode_reads_what_the_renderer_writes() -> None:
    rayjob = build_rayjob(parse_sweep(cpu_sweep()), "z9y8x7", deadline_at=1_796_000_000)
    doc = runtime_env.decode(rayjob["spec"]["runtimeEnvYAML"])
    assert set(doc) == {"env_vars"}
    assert doc["env_vars"][constants.ENV_DEADLINE_AT] == "1796000000"
    assert RunSpec.from_json(doc["env_vars"][constants.ENV_RUN_SPEC]) == runtime_env.run_spec_of(rayjob)


def _alias_bomb(levels: int, run_spec: str = "{}") -> str:
    """A few hundred characters of nested aliases that stand for 9**levels strings once written out in full."""
    lines = ["a0: &a0 [" + ", ".join(['"xxxxxxxxxx"'] * 9) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels + 1)]
    lines.append(f"env_vars: {{{constants.ENV_RUN_SPEC}: '{run_spec}', X: *a{levels}}}")
    return "\n".join(lines) + "\n"


def test_a_tenants_alias_bomb_in_the_runtime_env_is_never_written_out() -> None:
    """Anyone who may edit the RayJob may rewrite runtimeEnvYAML: a value that is not a scalar is left out, not
    turned into text (6 levels: 0.5 s and 140 MB to write out; 7 exhaust the operator's 512 MiB)."""
    bomb = _alias_bomb(6)
    assert len(bomb) < 600
    assert runtime_env.env_vars(bomb) == {constants.ENV_RUN_SPEC: "{}"}
    assert runtime_env.env_vars(_alias_bomb(9)) == {constants.ENV_RUN_SPEC: "{}"}
    rayjob = {"spec": {"runtimeEnvYAML": _alias_bomb(9, run_spec="not json")}}
    assert runtime_env.run_spec_of(rayjob) is None


def test_a_runtime_env_too_long_too_deep_or_keyed_by_a_structure_is_unreadable() -> None:
    too_long = "env_vars: {A: '" + "x" * runtime_env.MAX_RUNTIME_ENV_CHARS + "'}\n"
    with pytest.raises(ValueError, match="characters long"):
        runtime_env.decode(too_long)
    assert runtime_env.env_vars(too_long) == {}
    with pytest.raises(ValueError, match="unhashable key"):
        runtime_env.decode("a: &a [1, 2]\n? *a\n: x\n")
    deep = "env_vars: " + "[" * 100_000 + "]" * 100_000 + "\n"
    assert runtime_env.env_vars(deep) == {}
