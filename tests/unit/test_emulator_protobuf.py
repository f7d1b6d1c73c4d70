"""The emulator's protobuf request bodies: what kubectl v1.37 sends for `kubectl create namespace` and `configmap`
(bytes captured from it), decoded into the JSON object the same request would carry as JSON
(k8s.io/apimachinery runtime/serializer/protobuf/protobuf.go: the `k8s\\0` prefix and runtime.Unknown; field numbers
from k8s.io/api core/v1 and rbac/v1 generated.proto); the refusals of what it cannot decode."""

from __future__ import annotations

import pytest

from sweep_sandbox.emulator_tables import ApiError
from sweep_sandbox.protobuf import decode_body

# `kubectl create namespace ml-team` and `kubectl create configmap c --from-literal=a=b -n ml-team`, as sent
NAMESPACE = (
    b'k8s\x00\n\x0f\n\x02v1\x12\tNamespace\x12\x1f\n\x17\n\x07ml-team\x12\x00\x1a\x00"\x00*\x002\x008\x00B\x00'
    b'\x12\x00\x1a\x02\n\x00\x1a\x00"\x00'
)
CONFIGMAP = (
    b'k8s\x00\n\x0f\n\x02v1\x12\tConfigMap\x12"\n\x18\n\x01c\x12\x00\x1a\x07ml-team"\x00*\x002\x008\x00B\x00'
    b'\x12\x06\n\x01a\x12\x01b\x1a\x00"\x00'
)


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64s are ten-byte two's complement
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number: int, value: bytes | int | str) -> bytes:
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    data = value.encode() if isinstance(value, str) else value
    return varint(number << 3 | 2) + varint(len(data)) + data


def envelope(api_version: str, kind: str, raw: bytes) -> bytes:
    return b"k8s\x00" + field(1, field(1, api_version) + field(2, kind)) + field(2, raw)


def test_kubectls_namespace_and_configmap_decode_to_their_json() -> None:
    # Go's JSON omits the empty strings and the zero time proto carries; a struct field is an object even empty
    assert decode_body(NAMESPACE, "v1", "Namespace") == {
        "kind": "Namespace",
        "apiVersion": "v1",
        "metadata": {"name": "ml-team"},
        "spec": {},
        "status": {},
    }
    assert decode_body(CONFIGMAP, "v1", "ConfigMap") == {
        "kind": "ConfigMap",
        "apiVersion": "v1",
        "metadata": {"name": "c", "namespace": "ml-team"},
        "data": {"a": "b"},
    }


def test_rbac_kinds_secrets_and_pointer_fields_decode_with_go_json_semantics() -> None:
    meta = field(1, field(1, "sweepers") + field(3, "ml") + field(11, field(1, "team") + field(2, "a")) + field(7, 0))
    subject = field(1, "ServiceAccount") + field(3, "runner") + field(4, "ml")
    binding = meta + field(2, subject) + field(3, field(2, "Role") + field(3, "sweeper"))  # roleRef without apiGroup
    assert decode_body(envelope("rbac.authorization.k8s.io/v1", "RoleBinding", binding), *RB) == {
        "kind": "RoleBinding",
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "metadata": {"name": "sweepers", "namespace": "ml", "labels": {"team": "a"}},
        "subjects": [{"kind": "ServiceAccount", "name": "runner", "namespace": "ml"}],
        "roleRef": {"apiGroup": "", "kind": "Role", "name": "sweeper"},  # no omitempty: always there
    }
    rule = field(1, "get") + field(1, "list") + field(2, "") + field(3, "pods/log") + field(4, "p-0")
    role = field(1, field(1, "r")) + field(2, rule) + field(99, b"a field from a newer API: skipped")
    decoded = decode_body(
        envelope("rbac.authorization.k8s.io/v1", "Role", role), "rbac.authorization.k8s.io/v1", "Role"
    )
    assert decoded["rules"] == [
        {"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods/log"], "resourceNames": ["p-0"]}
    ]
    empty_role = decode_body(envelope("rbac.authorization.k8s.io/v1", "ClusterRole", field(1, field(1, "agg"))),
                             "rbac.authorization.k8s.io/v1", "ClusterRole")  # fmt: skip
    assert empty_role["rules"] is None  # `json:"rules"`: a nil list is null
    secret = field(1, field(1, "s3") + field(10, -1)) + field(2, field(1, "key") + field(2, b"\x00\xffbin"))
    secret += field(5, 0) + field(3, "Opaque")  # immutable: false, a pointer set on the wire
    assert decode_body(envelope("v1", "Secret", secret), "v1", "Secret") == {
        "kind": "Secret",
        "apiVersion": "v1",
        "metadata": {"name": "s3", "deletionGracePeriodSeconds": -1},
        "data": {"key": "AP9iaW4="},
        "immutable": False,
        "type": "Opaque",
    }


RB = ("rbac.authorization.k8s.io/v1", "RoleBinding")


@pytest.mark.parametrize(
    ("body", "api_version", "kind", "code"),
    [
        (NAMESPACE, "sweeps.dev/v1alpha1", "TrainingSweep", 415),  # custom resources are JSON only
        (NAMESPACE[4:], "v1", "Namespace", 400),  # no `k8s\0` prefix
        (NAMESPACE, "v1", "ConfigMap", 400),  # the envelope names another kind than the URL
        (NAMESPACE[:-6], "v1", "Namespace", 400),  # cut short
        (envelope("v1", "Namespace", field(1, field(1, b"\xff"))), "v1", "Namespace", 400),  # a name that is not UTF-8
    ],
)
def test_what_cannot_be_decoded_is_refused(body: bytes, api_version: str, kind: str, code: int) -> None:
    with pytest.raises(ApiError) as refused:
        decode_body(body, api_version, kind)
    assert refused.value.code == code
    assert refused.value.reason == ("UnsupportedMediaType" if code == 415 else "BadRequest")
