"""Stack config read strictly: a wrong key or type is one clear error, no traceback.

Every setting of a stack is declared in its ``Pulumi.yaml`` under ``config:`` (type, description,
default, secret); ``refuse_undeclared_keys`` stops a program at its start on any other key of the
project's namespace, so a misspelt ``clustrName`` is an error, not a silent default.
``pulumi.RunError`` is how a Pulumi program ends with a message alone; the render command reports
it in one line too.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pulumi
import yaml
from pulumi.runtime import config as runtime_config

# RFC 5737 and RFC 3849: addresses reserved for documentation, never a real client's.
DOCUMENTATION_NETWORKS = tuple(
    ipaddress.ip_network(n)
    for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32")
)
# What an encrypted value the render command cannot decrypt reads as (infra/render/program.py).
UNREADABLE_SECRET = "[secret]"  # noqa: S105  a placeholder


class ConfigError(pulumi.RunError):
    """Stack config that cannot be used; the message names the key and what it must be."""


def declared_config(project_file: Path) -> dict[str, dict[str, Any]]:
    """The settings a ``Pulumi.yaml`` declares in its project's namespace, by bare key."""
    document = yaml.safe_load(project_file.read_text(encoding="utf-8")) or {}
    project = document.get("name", "")
    declared: dict[str, dict[str, Any]] = {}
    for key, declaration in (document.get("config") or {}).items():
        namespace, _, bare = str(key).rpartition(":")
        if namespace in ("", project):
            declared[bare] = (
                declaration if isinstance(declaration, dict) else {"default": declaration}
            )
    return declared


def configured_keys() -> set[str]:
    """Every config key the engine handed this program (``project:key``): the mock engine sets
    them in-process, the Pulumi CLI passes them in PULUMI_CONFIG."""
    return set(runtime_config.CONFIG.get()) | set(runtime_config.get_config_env())


def refuse_undeclared_keys(project_file: Path, removed: Mapping[str, str] | None = None) -> None:
    """Stops the program, in one line, on a key of this project's namespace that ``project_file``
    does not declare; ``removed`` maps keys that once existed to what replaces them."""
    project = pulumi.get_project()
    declared = declared_config(project_file)
    given = sorted(
        key.partition(":")[2] for key in configured_keys() if key.startswith(f"{project}:")
    )
    for key in given:
        if key in declared:
            continue
        if removed and key in removed:
            raise ConfigError(f"stack config {key} is gone: {removed[key]}")
        close = difflib.get_close_matches(key, declared, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise ConfigError(
            f"stack config {key} is not a setting of {project}: {hint}"
            f"{project_file.name} declares them all"
        )


def optional_secret(config: pulumi.Config, key: str) -> pulumi.Output[str] | None:
    """A secret setting, or None when it is unset or empty: Pulumi.yaml gives optional secrets
    an empty default (a declared key without one would be required)."""
    if not runtime_config.get_config(config.full_key(key)):
        return None
    return config.get_secret(key)


def secret_text(config: pulumi.Config, key: str) -> str | None:
    """A secret setting's plain value, for checks that must stop the program before any resource
    (never logged); None when it is unset, empty or could not be decrypted (the render command)."""
    value = runtime_config.get_config(config.full_key(key))
    return None if not value or value == UNREADABLE_SECRET else value


def optional_text(config: pulumi.Config, key: str) -> str | None:
    """A text setting, or None when it is unset or empty (its declared default)."""
    return config.get(key) or None


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


def strings(key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"stack config {key} must be a non-empty list of strings, got {value!r}")
    return tuple(_text(f"{key}[{index}]", item) for index, item in enumerate(value))


FIELD_TYPES = {"int": _integer, "bool": _boolean, "str": _text, "list": strings}


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
    cidrs = strings("publicAccessCidrs", value)
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
