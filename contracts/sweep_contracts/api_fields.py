"""What the API's models are built from: Kubernetes quantities, the defaults and patterns the CRD carries, the
field validators and the spec's base model (camelCase, strict, unknown fields refused)."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Any, Final

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

# Defaults that the CRD also carries; changing one here changes the CRD (regenerate it).
DEFAULT_STARTUP_SECONDS = 1800
DEFAULT_GRACEFUL_STOP_SECONDS = 300
DEFAULT_VERIFICATION_TIMEOUT_SECONDS = 900
# Reports after which a trial with no committed checkpoint is warned about (a loop that checkpoints every epoch has
# one at its first report; a few more leave room for one that checkpoints every other epoch or so).
DEFAULT_WARN_AFTER_REPORTS = 3


# apimachinery's grammar (pkg/api/resource/quantity.go, parseQuantityString): a signed decimal, then one binary
# suffix, one decimal SI suffix or a decimal exponent. Stricter than the Python client, which also takes "1K",
# "1_000" or "NaN": the API server refuses those, so a spec must not carry them.
_QUANTITY_RE = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<binary>[KMGTPE]i)|(?P<decimal>[numkMGTPE])|[eE](?P<exponent>[+-]?[0-9]+))?"
)
_BINARY_POWER = {"K": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}
_DECIMAL_EXPONENT = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def parse_quantity(value: Any) -> Decimal:
    """A Kubernetes quantity ("500m", "24Gi", "1e3", 4) as an exact Decimal; ValueError naming the accepted forms."""
    if isinstance(value, (int, float, Decimal)) and not isinstance(value, bool):
        return Decimal(value)
    match = _QUANTITY_RE.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f'{value!r} is not a Kubernetes quantity (examples: 4, "500m", "24Gi", "512Mi")')
    number = Decimal(match["number"])
    if match["binary"]:
        return number * Decimal(1024) ** _BINARY_POWER[match["binary"][0]]
    if match["decimal"]:
        return number.scaleb(_DECIMAL_EXPONENT[match["decimal"]])
    if match["exponent"]:
        return number.scaleb(int(match["exponent"]))
    return number


def _quantity(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f'{value!r} is not a Kubernetes quantity (examples: 4, "500m", "24Gi")')
    text = str(value).strip()
    if parse_quantity(text) <= 0:
        raise ValueError(f"{value!r} must be greater than zero")
    return text


# A positive Kubernetes quantity, kept as the user wrote it (ints become strings).
Quantity = Annotated[str, BeforeValidator(_quantity), Field(max_length=64, json_schema_extra={"x-quantity": True})]

# Size limits on every spec string, list and map: the API server refuses an oversized object before
# any controller or CEL rule spends time on it. Patterns here go to the CRD only; the validators below check
# the same forms in the parser with messages that name what is allowed.
TRAIN_LOOP_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
STORAGE_URI_PATTERN = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/.+$"
# A CEL rule, not a schema pattern: the API server answers a failed pattern with the regex itself; a rule's message
# is what `kubectl apply` prints. The parser (_storage_uri) checks the same form and says what is wrong in detail.
_STORAGE_URI_EXPECTED = (
    "expected s3://bucket/prefix: a bucket name (3-63 lowercase letters, digits, '.' and '-'), then a prefix under "
    "which each run writes <namespace>/<sweep>-<runId>/"
)
# The API server prints a failed rule as `Invalid value: "string": <message>` (the type, never the value), so the
# message itself quotes what was given.
STORAGE_URI_RULE: Final[JsonDict] = {
    "rule": f"self.matches('{STORAGE_URI_PATTERN}')",
    "message": _STORAGE_URI_EXPECTED,
    "messageExpression": f'"got \'" + self + "\'; {_STORAGE_URI_EXPECTED}"',
}
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
REGION_PATTERN = r"^([a-z]{2}(-[a-z]+)+-[0-9]+)?$"
ENDPOINT_PATTERN = r"^(https?://[^\s/]+(:[0-9]+)?/?)?$"
NAME_MAX = 128  # metric and attribute names
# The most trials any sweep may ask for (tune.numSamples, the CRD's maximum): Tune's driver keeps every trial in
# memory and in its experiment state. The operator's maxTrialsPerSweep (default 10000) sets the bound in force, at
# most this one.
MAX_NUM_SAMPLES: Final = 1_000_000
# A node label as Kubernetes bounds it: a key of an optional DNS-subdomain prefix (253) and '/' before a name of 63;
# a value of 63 (apimachinery validation.IsQualifiedName, IsValidLabelValue).
SELECTOR_KEY_MAX: Final = 317
SELECTOR_VALUE_MAX: Final = 63


class ApiModel(BaseModel):
    """camelCase on the wire, unknown fields rejected (a typo must not be silently dropped)."""

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
        validate_default=True,
        # Kubernetes semantics: "yes" is not a boolean and 2.0 is not an integer.
        strict=True,
    )
