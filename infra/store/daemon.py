"""How the profiler DaemonSet reaches its store: environment, volumes and the objects they name.

- ``PostgresStore``: the URL names the user, host and CA file, never the password; libpq finds
  the password in its password file (``PGPASSFILE``) and verifies the server against the CA in a
  ConfigMap mounted read-only. libpq ignores a password file that its group may read, which every
  mounted Secret is (the kubelet gives the pod's fsGroup read access): an init container, running
  as the daemon's user, copies it with mode 0600 into a memory-backed volume. A new password rolls
  the pods (their template carries its digest).
- ``UrlStore``: the whole URL from a Secret (it may hold a password); with a CA (``external``
  store's ``profilerStoreCa``) the URL is completed to verify the server against it
  (``infra/store/external.py``), the CA mounted as for ``PostgresStore``.
- ``SqliteStore``: a file in a folder of the node (``hostPath``), which outlives the pod. The
  kubelet creates the folder owned by root; a root init container with only ``CAP_CHOWN`` and
  ``CAP_FOWNER`` hands it to the daemon's user (mode 0750), which then runs as before (non-root,
  read-only root filesystem). hostPath is outside the ``baseline`` and ``restricted`` Pod Security
  levels, so the namespace enforces ``privileged`` (and warns and audits at ``restricted``); a
  ValidatingAdmissionPolicy (``infra/admission.py``: ``store_namespace_policy``) admits no more
  than this one exception to the namespace's pods.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from infra.store.endpoint import (
    CA_CONFIG_MAP,
    CA_KEY,
    PASSWORD_KEY,
    USERNAME_KEY,
    PostgresStore,
    ProfilerStore,
    SqliteStore,
    UrlStore,
    libpq_url,
)
from infra.store.external import verified_url

STORE_URL_VARIABLE = "GPU_PROFILER_STORE_URL"
# libpq's: the daemon and its migration child inherit it.
PASSFILE_VARIABLE = "PGPASSFILE"
STORE_SECRET = "gpu-profiler-store"  # noqa: S105  a Secret's name
STORE_URL_KEY = "store-url"
PASSFILE_KEY = "pgpass"
CA_DIR = "/etc/gpu-profiler/store-ca"
CREDENTIALS_DIR = "/etc/gpu-profiler/store-credentials"
PASSFILE_DIR = "/run/gpu-profiler"
CREDENTIALS_DIGEST_ANNOTATION = "gpu-cluster.io/store-credentials-sha256"
SQLITE_FILE = "profiler.db"
SQLITE_DIR_MODE = "0750"
SQLITE_INIT_CAPABILITIES = ("CHOWN", "FOWNER")  # what the folder's hand-over needs, no more


@dataclass
class DaemonStore:
    """What the DaemonSet's pod spec gets for its store."""

    env: list[k8s.core.v1.EnvVarArgs]
    volumes: list[k8s.core.v1.VolumeArgs] = field(default_factory=list)
    mounts: list[k8s.core.v1.VolumeMountArgs] = field(default_factory=list)
    init_containers: list[k8s.core.v1.ContainerArgs] = field(default_factory=list)
    pod_annotations: dict[str, pulumi.Input[str]] = field(default_factory=dict)
    # The Secret and ConfigMap created for it, which the DaemonSet must wait for.
    objects: list[pulumi.Resource] = field(default_factory=list)


def pod_security_level(store: ProfilerStore) -> str:
    """The Pod Security level the profiler's namespace enforces: hostPath needs ``privileged``."""
    return "privileged" if isinstance(store, SqliteStore) else "restricted"


def pod_security_labels(store: ProfilerStore) -> dict[str, str]:
    """The namespace's Pod Security labels: warnings and audit at ``restricted`` in every case."""
    prefix = "pod-security.kubernetes.io"
    return {
        f"{prefix}/enforce": pod_security_level(store),
        f"{prefix}/warn": "restricted",
        f"{prefix}/audit": "restricted",
    }


def _secret_env(name: str, secret: k8s.core.v1.Secret, key: str) -> k8s.core.v1.EnvVarArgs:
    return k8s.core.v1.EnvVarArgs(
        name=name,
        value_from=k8s.core.v1.EnvVarSourceArgs(
            secret_key_ref=k8s.core.v1.SecretKeySelectorArgs(
                name=secret.metadata.apply(lambda m: m.name), key=key
            )
        ),
    )


def daemon_store(
    store: ProfilerStore,
    namespace: pulumi.Input[str],
    *,
    labels: dict[str, str],
    sqlite_dir: str,
    user: int,
    image: str,
    opts: pulumi.ResourceOptions,
) -> DaemonStore:
    """The store's part of the DaemonSet; Secrets and ConfigMaps are created in ``namespace``."""

    def meta(name: str) -> k8s.meta.v1.ObjectMetaArgs:
        return k8s.meta.v1.ObjectMetaArgs(name=name, namespace=namespace, labels=labels)

    if isinstance(store, UrlStore):
        return _url_store(store, meta, opts)
    if isinstance(store, PostgresStore):
        return _postgres_store(store, meta, image, opts)
    return _sqlite_store(store, sqlite_dir, user, image)


def _ca_volume(
    pem: pulumi.Input[str],
    meta: Callable[[str], k8s.meta.v1.ObjectMetaArgs],
    opts: pulumi.ResourceOptions,
) -> tuple[k8s.core.v1.ConfigMap, k8s.core.v1.VolumeArgs, k8s.core.v1.VolumeMountArgs]:
    """The CA's ConfigMap, its volume, and its read-only mount at ``CA_DIR``."""
    ca = k8s.core.v1.ConfigMap(
        "profiler-store-ca", metadata=meta(CA_CONFIG_MAP), data={CA_KEY: pem}, opts=opts
    )
    volume = k8s.core.v1.VolumeArgs(
        name="store-ca",
        config_map=k8s.core.v1.ConfigMapVolumeSourceArgs(name=ca.metadata.apply(lambda m: m.name)),
    )
    mount = k8s.core.v1.VolumeMountArgs(name="store-ca", mount_path=CA_DIR, read_only=True)
    return ca, volume, mount


def _url_store(
    store: UrlStore,
    meta: Callable[[str], k8s.meta.v1.ObjectMetaArgs],
    opts: pulumi.ResourceOptions,
) -> DaemonStore:
    ca_file = f"{CA_DIR}/{CA_KEY}" if store.ca_certificate is not None else None
    url: pulumi.Input[str] = store.url.apply(lambda given: verified_url(given, ca_file))
    secret = k8s.core.v1.Secret(
        "profiler-store-secret",
        metadata=meta(STORE_SECRET),
        type="Opaque",
        string_data={STORE_URL_KEY: pulumi.Output.secret(url)},
        opts=opts,
    )
    daemon = DaemonStore(
        env=[_secret_env(STORE_URL_VARIABLE, secret, STORE_URL_KEY)], objects=[secret]
    )
    if store.ca_certificate is not None:
        ca, volume, mount = _ca_volume(store.ca_certificate, meta, opts)
        daemon.volumes.append(volume)
        daemon.mounts.append(mount)
        daemon.objects.append(ca)
    return daemon


def passfile_line(user: str, password: str) -> str:
    """A libpq password file's line for ``user`` on any host, port and database."""

    def escaped(text: str) -> str:
        return text.replace("\\", "\\\\").replace(":", "\\:")

    return f"*:*:*:{escaped(user)}:{escaped(password)}\n"


def _postgres_store(
    store: PostgresStore,
    meta: Callable[[str], k8s.meta.v1.ObjectMetaArgs],
    image: str,
    opts: pulumi.ResourceOptions,
) -> DaemonStore:
    endpoint = store.endpoint
    writer = endpoint.writer
    secret = k8s.core.v1.Secret(
        "profiler-store-secret",
        metadata=meta(STORE_SECRET),
        type="Opaque",
        string_data={
            USERNAME_KEY: writer.name,
            PASSWORD_KEY: writer.password,
            PASSFILE_KEY: writer.password.apply(
                lambda password: passfile_line(writer.name, password)
            ),
        },
        opts=opts,
    )
    ca, ca_volume, ca_mount = _ca_volume(endpoint.ca_certificate, meta, opts)
    credentials = k8s.core.v1.VolumeMountArgs(
        name="store-credentials", mount_path=CREDENTIALS_DIR, read_only=True
    )
    passfile = k8s.core.v1.VolumeMountArgs(name="store-passfile", mount_path=PASSFILE_DIR)
    copy_passfile = k8s.core.v1.ContainerArgs(
        name="store-passfile",
        image=image,
        command=[
            "install",
            "-m",
            "0600",
            f"{CREDENTIALS_DIR}/{PASSFILE_KEY}",
            f"{PASSFILE_DIR}/{PASSFILE_KEY}",
        ],
        volume_mounts=[credentials, passfile],
        resources=k8s.core.v1.ResourceRequirementsArgs(
            requests={"cpu": "10m", "memory": "16Mi"}, limits={"cpu": "100m", "memory": "32Mi"}
        ),
        security_context=k8s.core.v1.SecurityContextArgs(
            allow_privilege_escalation=False,
            read_only_root_filesystem=True,
            run_as_non_root=True,
            capabilities=k8s.core.v1.CapabilitiesArgs(drop=["ALL"]),
            seccomp_profile=k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault"),
        ),
    )
    url = libpq_url(endpoint, writer.name, f"{CA_DIR}/{CA_KEY}")
    # Derived from a secret, the hash would be secret too, and Pulumi would then hide the whole
    # DaemonSet spec from `pulumi preview` as [secret]. A SHA-256 of a long random password
    # reveals nothing: it is plain, so reviewers see the spec's diff.
    digest = pulumi.Output.unsecret(
        writer.password.apply(lambda password: hashlib.sha256(password.encode()).hexdigest())
    )
    return DaemonStore(
        env=[
            k8s.core.v1.EnvVarArgs(name=STORE_URL_VARIABLE, value=url),
            k8s.core.v1.EnvVarArgs(name=PASSFILE_VARIABLE, value=f"{PASSFILE_DIR}/{PASSFILE_KEY}"),
        ],
        volumes=[
            ca_volume,
            k8s.core.v1.VolumeArgs(
                name="store-credentials",
                secret=k8s.core.v1.SecretVolumeSourceArgs(
                    secret_name=secret.metadata.apply(lambda m: m.name),
                    items=[k8s.core.v1.KeyToPathArgs(key=PASSFILE_KEY, path=PASSFILE_KEY)],
                    default_mode=0o400,
                ),
            ),
            k8s.core.v1.VolumeArgs(
                name="store-passfile",
                empty_dir=k8s.core.v1.EmptyDirVolumeSourceArgs(medium="Memory", size_limit="1Mi"),
            ),
        ],
        mounts=[
            ca_mount,
            k8s.core.v1.VolumeMountArgs(
                name="store-passfile", mount_path=PASSFILE_DIR, read_only=True
            ),
        ],
        init_containers=[copy_passfile],
        pod_annotations={CREDENTIALS_DIGEST_ANNOTATION: digest},
        objects=[secret, ca],
    )


def _sqlite_store(_store: SqliteStore, sqlite_dir: str, user: int, image: str) -> DaemonStore:
    volume = k8s.core.v1.VolumeArgs(
        name="store",
        host_path=k8s.core.v1.HostPathVolumeSourceArgs(path=sqlite_dir, type="DirectoryOrCreate"),
    )
    mount = k8s.core.v1.VolumeMountArgs(name="store", mount_path=sqlite_dir)
    # Idempotent: on a later pod the folder is the daemon's already (chmod of another user's
    # folder is what CAP_FOWNER allows).
    take_over = k8s.core.v1.ContainerArgs(
        name="store-owner",
        image=image,
        command=[
            "/bin/sh",
            "-c",
            f"chown {user}:{user} {sqlite_dir} && chmod {SQLITE_DIR_MODE} {sqlite_dir}",
        ],
        volume_mounts=[mount],
        resources=k8s.core.v1.ResourceRequirementsArgs(
            requests={"cpu": "10m", "memory": "16Mi"}, limits={"cpu": "100m", "memory": "32Mi"}
        ),
        security_context=k8s.core.v1.SecurityContextArgs(
            run_as_user=0,
            run_as_group=0,
            run_as_non_root=False,
            allow_privilege_escalation=False,
            read_only_root_filesystem=True,
            capabilities=k8s.core.v1.CapabilitiesArgs(
                drop=["ALL"], add=list(SQLITE_INIT_CAPABILITIES)
            ),
            seccomp_profile=k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault"),
        ),
    )
    return DaemonStore(
        env=[
            k8s.core.v1.EnvVarArgs(
                name=STORE_URL_VARIABLE, value=f"sqlite:///{sqlite_dir}/{SQLITE_FILE}"
            )
        ],
        volumes=[volume],
        mounts=[mount],
        init_containers=[take_over],
    )
