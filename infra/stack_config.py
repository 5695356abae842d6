"""Structured stack config read strictly: a wrong key or type is one clear error, no traceback.

``pulumi.RunError`` is how a Pulumi program ends with a message alone; the render command reports
it in one line too.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping
from typing import Any

import pulumi

# RFC 5737 and RFC 3849: addresses reserved for documentation, never a real client's.
DOCUMENTATION_NETWORKS = tuple(
    ipaddress.ip_network(n)
    for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32")
)


class ConfigError(pulumi.RunError):
    """Stack config that cannot be used; the message names the key and what it must be."""


def read_object(config: pulumi.Config, key: str) -> Any:
    """A structured config value (mapping or list), or None when unset."""
    try:
        return config.get_object(key)
    except (json.JSONDecodeError, pulumi.ConfigTypeError) as error:
        raise ConfigError(f"stack config {key} is not valid YAML/JSON: {error}") from None


def _integer(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigError(f"stack config {key} must be a whole number, got {value!r}")
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"stack config {key} must be a whole number, got {value!r}") from None


def _boolean(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ConfigError(f"stack config {key} must be true or false, got {value!r}")


def _text(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"stack config {key} must be a non-empty string, got {value!r}")
    return value


def _strings(key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"stack config {key} must be a non-empty list of strings, got {value!r}")
    return tuple(_text(f"{key}[{index}]", item) for index, item in enumerate(value))


FIELD_TYPES = {"int": _integer, "bool": _boolean, "str": _text, "list": _strings}


def fields(
    key: str,
    value: Any,
    types: Mapping[str, str],
    required: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """A config mapping checked against ``{field: "int" | "bool" | "str" | "list"}``."""
    if not isinstance(value, dict):
        raise ConfigError(
            f"stack config {key} must be a mapping with keys {', '.join(types)}, got {value!r}"
        )
    unknown = sorted(set(value) - set(types))
    if unknown:
        raise ConfigError(
            f"stack config {key} has unknown keys {', '.join(unknown)} (known: {', '.join(types)})"
        )
    missing = sorted(required - set(value))
    if missing:
        raise ConfigError(f"stack config {key} needs {', '.join(missing)}")
    return {name: FIELD_TYPES[types[name]](f"{key}.{name}", item) for name, item in value.items()}


def _within(
    network: ipaddress.IPv4Network | ipaddress.IPv6Network,
    outer: ipaddress.IPv4Network | ipaddress.IPv6Network,
) -> bool:
    if isinstance(network, ipaddress.IPv4Network) and isinstance(outer, ipaddress.IPv4Network):
        return network.subnet_of(outer)
    if isinstance(network, ipaddress.IPv6Network) and isinstance(outer, ipaddress.IPv6Network):
        return network.subnet_of(outer)
    return False


def public_access_cidrs(value: Any) -> tuple[str, ...]:
    """CIDRs allowed to reach a public API endpoint; documentation ranges are refused."""
    cidrs = _strings("publicAccessCidrs", value)
    for cidr in cidrs:
        try:
            network = ipaddress.ip_network(cidr)
        except ValueError:
            raise ConfigError(f"stack config publicAccessCidrs: {cidr!r} is not a CIDR") from None
        if any(_within(network, doc) for doc in DOCUMENTATION_NETWORKS):
            raise ConfigError(
                f"stack config publicAccessCidrs: {cidr} is a documentation range (RFC 5737/3849) "
                f"that no real client comes from; put the address range this machine deploys from"
            )
    return cidrs
