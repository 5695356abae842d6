"""The stack's store wiring, connected for real: PostgreSQL and PgBouncer with TLS, as in a cluster.

What the stack hands the daemon (tests/infra/test_store_cloudnative_pg.py checks it under Pulumi's
mocks) is used here as is: the URL from the DaemonSet's environment (host name, database, user,
sslmode), the password file from the Secret, copied with the init container's own command, and a CA
whose server certificate carries the names CloudNativePG would issue it (the Cluster's Services and
its ``serverAltDNSNames``; infra/render/cnpg.py). Test doubles: Debian's PostgreSQL 15 and PgBouncer
1.18 on 127.0.0.1 stand in for CloudNativePG's images (18, 1.25); the pooler is configured with the
Pooler's parameters that PgBouncer 1.18 has (not ``max_prepared_statements``, 1.21), its client TLS
certificate being the server's, as the operator's is; the users are made by the RDS store's
bootstrap script (infra/store/rds_roles.py) run as a role with CREATEROLE and CREATEDB but no
superuser (what RDS's master user is); ``hostaddr=127.0.0.1`` reaches the host name the URL names,
which libpq still verifies against the certificate.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from infra.render.cnpg import server_certificate_names
from infra.render.graph import K8sObject
from infra.render.program import FAKE_PASSWORD, ProgramRun, run_stack
from infra.store.cloudnative_pg import POOLER_PARAMETERS
from infra.store.rds_roles import ensure_roles
from profiler_app.core.model import GPU_UTIL, CycleResult, FieldStats, GpuProfile
from profiler_app.sinks.store import TableStore
from tests.infra.conftest import EKS_STACK
from tests.support.ports import free_port
from tests.support.postgres import TEST_ROLE, PostgresServer, running_postgres

pytestmark = pytest.mark.integration

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
# Not in Debian's PgBouncer 1.18 (1.21 and later); the operator's image has it.
NEWER_PGBOUNCER_PARAMETERS = {"max_prepared_statements"}
MASTER = "store_master"
T0 = dt.datetime(2026, 11, 26, tzinfo=dt.UTC)


@dataclass
class Certificates:
    folder: Path
    ca: Path
    cert: Path
    key: Path


def _issue(folder: Path, names: list[str]) -> Certificates:
    """A CA with an EC P-256 key (what pulumi_tls makes) and a server certificate for ``names``."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpu-profiler store CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), False)
        .add_extension(x509.ExtendedKeyUsage([x509.ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .sign(ca_key, hashes.SHA256())
    )
    certificates = Certificates(folder, folder / "ca.crt", folder / "tls.crt", folder / "tls.key")
    certificates.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    certificates.cert.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    certificates.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    certificates.key.chmod(0o600)
    return certificates


def _owned_by_server(server: PostgresServer, *paths: Path) -> None:
    if server.run_as is not None:
        for path in paths:
            shutil.chown(path, server.run_as, server.run_as)


@dataclass
class Wiring:
    run: ProgramRun
    server: PostgresServer
    certificates: Certificates
    pooler_port: int
    tmp: Path

    def env(self, name: str) -> Any:
        (container,) = self.run.one("kubernetes:apps/v1:DaemonSet").get(
            "spec.template.spec.containers"
        )
        return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}[name]

    def daemon_url(self, **changes: str) -> str:
        """The stack's URL, pointed at this machine: the pooler's port, the CA's file here, and
        hostaddr (the host name stays, and is what libpq verifies)."""
        url = str(self.env("GPU_PROFILER_STORE_URL"))
        url = url.replace(":5432/", f":{self.pooler_port}/")
        url = url.replace("/etc/gpu-profiler/store-ca/ca.crt", str(self.certificates.ca))
        for old, new in changes.items():
            url = url.replace(old, new)
        return url + "&hostaddr=127.0.0.1"


def _pgbouncer(server: PostgresServer, certificates: Certificates, port: int) -> Path:
    """PgBouncer as the Pooler runs it: transaction pooling, the Pooler's parameters, users
    checked against PostgreSQL's password verifiers through auth_query, the server's certificate
    for clients, the server verified against the CA."""
    folder = certificates.folder
    hba = folder / "pgbouncer_hba.conf"
    hba.write_text("host all all 127.0.0.1/32 md5\n")  # what the operator writes
    parameters = {k: v for k, v in POOLER_PARAMETERS.items() if k not in NEWER_PGBOUNCER_PARAMETERS}
    settings = {
        "listen_addr": "127.0.0.1",
        "listen_port": str(port),
        "unix_socket_dir": "",
        "pool_mode": "transaction",
        "auth_type": "hba",
        "auth_hba_file": str(hba),
        "auth_user": TEST_ROLE,
        "ignore_startup_parameters": "extra_float_digits,options",
        "client_tls_cert_file": str(certificates.cert),
        "client_tls_key_file": str(certificates.key),
        "server_tls_ca_file": str(certificates.ca),
        "logfile": str(folder / "pgbouncer.log"),
        "pidfile": str(folder / "pgbouncer.pid"),
        **parameters,
    }
    ini = folder / "pgbouncer.ini"
    ini.write_text(
        f"[databases]\n* = host=127.0.0.1 port={server.port}\n\n[pgbouncer]\n"
        + "".join(f"{key} = {value}\n" for key, value in settings.items())
    )
    _owned_by_server(server, folder, *folder.iterdir())
    return ini


@contextlib.contextmanager
def _running_pgbouncer(server: PostgresServer, ini: Path, port: int) -> Iterator[None]:
    command = [PGBOUNCER, str(ini)]
    if server.run_as is not None:
        command = ["runuser", "-u", server.run_as, "--", *command]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            if process.poll() is not None or time.monotonic() > deadline:
                output = process.stdout.read().decode() if process.stdout else ""
                pytest.fail(f"pgbouncer did not start: {output}")
            time.sleep(0.1)
        yield
    finally:
        process.terminate()
        process.wait(timeout=20)


def _set_up_server(server: PostgresServer, certificates: Certificates) -> None:
    """TLS on, the store's users only with SCRAM passwords over TLS, every statement logged."""
    server_files = server.root / "tls"
    server_files.mkdir()
    for path in (certificates.cert, certificates.key, certificates.ca):
        shutil.copy(path, server_files / path.name)
    (server_files / "tls.key").chmod(0o600)
    _owned_by_server(server, server_files, *server_files.iterdir())
    with (server.data_dir / "postgresql.conf").open("a") as conf:
        conf.write(
            "ssl = on\n"
            f"ssl_cert_file = '{server_files / 'tls.crt'}'\n"
            f"ssl_key_file = '{server_files / 'tls.key'}'\n"
            "password_encryption = 'scram-sha-256'\n"
            "log_statement = 'all'\n"
        )
    hba = server.data_dir / "pg_hba.conf"
    users = "gpu_profiler,gpu_profiler_reader"
    hba.write_text(
        f"hostssl all {users} 127.0.0.1/32 scram-sha-256\n"
        f"host all {users} 127.0.0.1/32 reject\n" + hba.read_text()
    )
    server.restart()
    with psycopg.connect(server.url(), autocommit=True) as connection:
        connection.execute(f"CREATE ROLE {MASTER} LOGIN CREATEROLE CREATEDB")


@pytest.fixture(scope="module")
def wiring(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Wiring]:
    if not Path(PGBOUNCER).is_file():
        pytest.skip("PgBouncer is not installed (apt-get install pgbouncer)")
    run = run_stack(EKS_STACK)
    cluster = run.one("kubernetes:postgresql.cnpg.io/v1:Cluster")
    names = server_certificate_names(K8sObject(cluster.inputs, source="test"))
    tmp = tmp_path_factory.mktemp("store-wiring")
    with running_postgres() as server:
        # In the server's folder: PgBouncer runs as the server's user too (neither runs as root).
        (server.root / "pki").mkdir()
        certificates = _issue(server.root / "pki", names)
        _set_up_server(server, certificates)
        with psycopg.connect(server.url(), user=MASTER, autocommit=True) as connection:
            # The stack's generated passwords: the mocks' placeholder, in its Secrets too.
            for _ in range(2):  # idempotent
                ensure_roles(
                    connection,
                    "gpu_profiler",
                    ("gpu_profiler", FAKE_PASSWORD),
                    ("gpu_profiler_reader", FAKE_PASSWORD),
                    20,
                )
        port = free_port()
        ini = _pgbouncer(server, certificates, port)
        with _running_pgbouncer(server, ini, port):
            yield Wiring(run, server, certificates, port, tmp)


def _passfile(wiring: Wiring, mode: int) -> Path:
    """The Secret's pgpass key, mounted (mode ``mode``), then copied by the init container."""
    daemon_set = wiring.run.one("kubernetes:apps/v1:DaemonSet")
    secret = wiring.run.one("kubernetes:core/v1:Secret", "profiler-store-secret")
    assert secret.inputs["metadata"]["namespace"] == "gpu-profiler"
    mounted = wiring.tmp / "credentials" / "pgpass"
    mounted.parent.mkdir(exist_ok=True)
    mounted.write_text(secret.inputs["stringData"]["pgpass"])
    mounted.chmod(mode)
    (init,) = daemon_set.get("spec.template.spec.initContainers")
    copied = wiring.tmp / "run" / "pgpass"
    copied.parent.mkdir(exist_ok=True)
    copied.unlink(missing_ok=True)
    command = [str(mounted) if "store-credentials" in a else a for a in init["command"]]
    command = [str(copied) if a.startswith("/run/gpu-profiler") else a for a in command]
    subprocess.run(command, check=True)
    return copied


def _cycle(node: str, index: int) -> CycleResult:
    stats = {GPU_UTIL: FieldStats(max=90.0, p95=85.0, mean=80.0, idle_fraction=0.0)}
    profile = GpuProfile("0", "GPU-0", node, "training", 4.0, stats)
    return CycleResult(node, T0 + dt.timedelta(seconds=30 * index), 1800.0, [profile])


def test_the_daemon_writes_through_the_pooler_with_verified_tls(
    wiring: Wiring, monkeypatch: pytest.MonkeyPatch
) -> None:
    passfile = _passfile(wiring, 0o440)  # a Secret file as the kubelet mounts it
    assert passfile.stat().st_mode & 0o777 == 0o600
    assert wiring.env("PGPASSFILE") == "/run/gpu-profiler/pgpass"
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    url = wiring.daemon_url()
    assert "gpu-profiler-store-pooler.gpu-profiler-store.svc" in url
    store = TableStore(url)  # migrates (a child process, same environment), then writes
    try:
        for index in range(3):
            store.publish(_cycle("gpu-1", index))
    finally:
        store.close()
    # The reader, as report and Grafana connect: through the pooler, its password from a Secret.
    with psycopg.connect(
        url.replace("gpu_profiler@", "gpu_profiler_reader@"),
        password=FAKE_PASSWORD,
    ) as reader:
        assert reader.info.parameter_status("server_version")
        rows = reader.execute("SELECT count(*) FROM gpu_window WHERE node = 'gpu-1'").fetchone()
        assert rows == (3,)
        assert reader.info.parameter_status("is_superuser") == "off"
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            reader.execute("DELETE FROM gpu_window")


def test_a_group_readable_password_file_is_not_used(
    wiring: Wiring, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why the init container copies it: libpq ignores the mounted file itself."""
    mounted = _passfile(wiring, 0o440).parent.parent / "credentials" / "pgpass"
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", str(mounted))
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(wiring.daemon_url(), connect_timeout=5).close()


def test_a_name_the_certificate_does_not_carry_is_refused(
    wiring: Wiring, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGPASSWORD", FAKE_PASSWORD)
    url = wiring.daemon_url(
        **{"@gpu-profiler-store-pooler.gpu-profiler-store.svc:": "@store.example.org:"}
    )
    with pytest.raises(psycopg.OperationalError, match="does not match host name"):
        psycopg.connect(url, connect_timeout=5).close()


def test_another_ca_is_refused(wiring: Wiring, monkeypatch: pytest.MonkeyPatch) -> None:
    other = wiring.tmp / "other"
    other.mkdir(exist_ok=True)
    _issue(other, ["gpu-profiler-store-pooler.gpu-profiler-store.svc"])
    monkeypatch.setenv("PGPASSWORD", FAKE_PASSWORD)
    url = wiring.daemon_url(**{str(wiring.certificates.ca): str(other / "ca.crt")})
    # Same subject, another key: the chain does not verify.
    with pytest.raises(psycopg.OperationalError, match="SSL error"):
        psycopg.connect(url, connect_timeout=5).close()


def test_the_pooler_refuses_clients_without_tls(
    wiring: Wiring, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGPASSWORD", FAKE_PASSWORD)
    url = wiring.daemon_url(**{"sslmode=verify-full": "sslmode=disable"})
    with pytest.raises(psycopg.OperationalError, match="SSL required"):
        psycopg.connect(url, connect_timeout=5).close()


def test_passwords_reach_the_server_as_verifiers_only(wiring: Wiring) -> None:
    """The bootstrap script sends SCRAM verifiers: no logged statement holds a plain password."""
    log = (wiring.server.root / "server.log").read_text()
    assert "ALTER ROLE" in log or "CREATE ROLE" in log
    assert FAKE_PASSWORD not in log
    with psycopg.connect(wiring.server.url(), autocommit=True) as connection:
        stored = connection.execute(
            "SELECT rolname, rolpassword FROM pg_authid WHERE rolname LIKE 'gpu_profiler%'"
        ).fetchall()
        owner = connection.execute(
            "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'gpu_profiler'"
        ).fetchone()
    assert {name for name, _ in stored} == {"gpu_profiler", "gpu_profiler_reader"}
    assert all(str(verifier).startswith("SCRAM-SHA-256$") for _, verifier in stored)
    assert owner == ("gpu_profiler",)
