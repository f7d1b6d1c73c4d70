"""`sweep_contracts.api.parse_quantity`: apimachinery's quantity grammar (pkg/api/resource/quantity.go,
parseQuantityString) without the Kubernetes client, checked value for value against the client's
`kubernetes.utils.quantity.parse_quantity` (the operator's image has the client; the training image does not)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from kubernetes.utils.quantity import parse_quantity as client_parse_quantity

from sweep_contracts.api import parse_quantity

VALID = [
    "0",
    "1",
    "4",
    "+2",
    "-3",
    "1.5",
    ".5",
    "5.",
    "0.001",
    "123456789012345678901234",
    "500m",
    "100u",
    "100n",
    "2k",
    "3M",
    "4G",
    "5T",
    "6P",
    "7E",
    "1.25k",
    "1Ki",
    "512Mi",
    "24Gi",
    "0.5Gi",
    "1Ti",
    "1Pi",
    "1Ei",
    "1e3",
    "1E3",
    "1e-3",
    "2.5e+2",
    "1e0",
    4,
    0,
    0.5,
    1.1,
    Decimal("2.5"),
]
# Refused by the API server. The client takes some of them ("1K" as 1000, "1_000", "NaN", "1mi" as 1/1024):
# a spec must not carry what the cluster refuses, so the contracts refuse them too.
INVALID = [
    "",
    " 1",
    "1 ",
    "1 Gi",
    "Gi",
    "m",
    "1ki",
    "1K",
    "1mi",
    "1Gib",
    "1e",
    "1e3.5",
    "1.2.3",
    "1_000",
    "NaN",
    "Infinity",
    "0x10",
    "--1",
    "1Mi3",
    True,
    None,
    [1],
]
CLIENT_ACCEPTS = {"1K", "1mi", "1_000", "NaN", "Infinity", " 1", "1 "}


@pytest.mark.parametrize("value", VALID, ids=repr)
def test_valid_quantities_have_the_clients_exact_value(value: object) -> None:
    ours = parse_quantity(value)
    assert isinstance(ours, Decimal)
    assert ours == client_parse_quantity(value)


@pytest.mark.parametrize("value", INVALID, ids=repr)
def test_what_the_api_server_refuses_is_refused_naming_the_forms(value: object) -> None:
    with pytest.raises(ValueError, match=r"is not a Kubernetes quantity \(examples: 4, \"500m\", \"24Gi\""):
        parse_quantity(value)


@pytest.mark.parametrize("value", sorted(CLIENT_ACCEPTS), ids=repr)
def test_the_client_is_looser_where_the_contracts_are_strict(value: str) -> None:
    """Why the table above is not simply 'what the client refuses': these the client takes."""
    client_parse_quantity(value)
