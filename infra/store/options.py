"""``profilerStore`` and the keys that go with it, read strictly: one clear error, no traceback.

- ``cloudnative-pg`` (default): PostgreSQL in the cluster; ``profilerDatabase`` shapes it.
- ``rds`` (EKS only): Amazon RDS for PostgreSQL; ``profilerRds`` shapes it.
- ``external``: a database run elsewhere, its URL in the secret ``profilerStoreUrl``, verified
  with the CA in ``profilerStoreCa`` unless ``profilerStoreAllowUnverifiedTls`` (``external.py``).
- ``sqlite``: a file on each GPU node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, cast, get_args

import pulumi

from infra import stack_config
from infra.store import external

StoreKind = Literal["cloudnative-pg", "rds", "external", "sqlite"]
STORE_KINDS: tuple[str, ...] = get_args(StoreKind)
DEFAULT_STORE: StoreKind = "cloudnative-pg"

DATABASE_FIELDS = {
    "instances": "int",
    "storageSize": "str",
    "storageClass": "str",
    "cpuRequest": "str",
    "memoryRequest": "str",
    "cpuLimit": "str",
    "memoryLimit": "str",
    "sharedBuffers": "str",
    "poolerInstances": "int",
    "deletionProtection": "bool",
}
RDS_FIELDS = {
    "instanceClass": "str",
    "allocatedStorageGib": "int",
    "maxAllocatedStorageGib": "int",
    "engineVersion": "str",
    "backupRetentionDays": "int",
    "multiAz": "bool",
    "deletionProtection": "bool",
}
# Which keys each store reads: setting one of them for another store is a mistake worth a stop.
EKS_ONLY_KEYS = frozenset({"profilerRds"})  # read only by the EKS stack (rds is EKS's)
KEYS_OF = {
    "cloudnative-pg": "profilerDatabase",
    "rds": "profilerRds",
    "external": "profilerStoreUrl",
}


@dataclass(frozen=True)
class StoreOptions:
    """The store the stack config asks for, with its own keys (camelCase, checked)."""

    kind: StoreKind
    database: dict[str, Any]  # profilerDatabase
    rds: dict[str, Any]  # profilerRds
    url: pulumi.Output[str] | None  # profilerStoreUrl (secret)
    ca: str | None = None  # profilerStoreCa: PEM of the CA that signs the external server's
    allow_unverified_tls: bool = False  # profilerStoreAllowUnverifiedTls


def store_options(config: pulumi.Config, platform: str) -> StoreOptions:
    """``profilerStore`` and its keys; ConfigError names what is wrong."""
    kind = config.get("profilerStore") or DEFAULT_STORE
    if kind not in STORE_KINDS:
        raise stack_config.ConfigError(
            f"stack config profilerStore must be one of {', '.join(STORE_KINDS)}, got {kind!r}"
        )
    if kind == "rds" and platform != "eks":
        raise stack_config.ConfigError(
            "stack config profilerStore: rds is Amazon RDS, which only the EKS stack creates; "
            "use cloudnative-pg, or external with the URL of your database"
        )
    # Empty values are the declared defaults (Pulumi.yaml): unset.
    given = {
        "profilerDatabase": stack_config.read_object(config, "profilerDatabase") or None,
        "profilerRds": (
            stack_config.read_object(config, "profilerRds") or None if platform == "eks" else None
        ),
        "profilerStoreUrl": stack_config.optional_secret(config, "profilerStoreUrl"),
    }
    for other, key in KEYS_OF.items():
        if other != kind and given[key] is not None:
            raise stack_config.ConfigError(
                f"stack config {key} is for profilerStore: {other}, but profilerStore is {kind}; "
                f"set profilerStore: {other} or remove {key}"
            )
    if kind == "external" and given["profilerStoreUrl"] is None:
        raise stack_config.ConfigError(
            "stack config profilerStore: external needs the database's URL: "
            "pulumi config set --secret profilerStoreUrl 'postgresql://USER:PASSWORD@HOST/DB?...'"
        )
    ca = stack_config.optional_text(config, "profilerStoreCa")
    allow_unverified = config.get_bool("profilerStoreAllowUnverifiedTls") or False
    for key, value in ((external.CA_CONFIG_KEY, ca), (external.OPT_OUT_KEY, allow_unverified)):
        if value and kind != "external":
            raise stack_config.ConfigError(
                f"stack config {key} is for profilerStore: external, but profilerStore is {kind}; "
                f"remove {key}"
            )
    if ca is not None and "-----BEGIN CERTIFICATE-----" not in ca:
        raise stack_config.ConfigError(
            f"stack config {external.CA_CONFIG_KEY} must hold PEM certificates "
            "(-----BEGIN CERTIFICATE-----...): "
            f'pulumi config set {external.CA_CONFIG_KEY} -- "$(cat ca.pem)"'
        )
    url = stack_config.secret_text(config, "profilerStoreUrl")
    if kind == "external" and url is not None:
        external.check_external_url(url, ca=ca is not None, allow_unverified=allow_unverified)
    return StoreOptions(
        kind=cast(StoreKind, kind),
        database=stack_config.fields(
            "profilerDatabase", given["profilerDatabase"] or {}, DATABASE_FIELDS
        ),
        rds=stack_config.fields("profilerRds", given["profilerRds"] or {}, RDS_FIELDS),
        url=given["profilerStoreUrl"],
        ca=ca,
        allow_unverified_tls=allow_unverified,
    )
