"""The ``external`` store: its URL from a Secret, the server verified against a CA the stack
mounts (``sslmode=verify-full``), weaker TLS refused in one line unless the stack opts out."""

from __future__ import annotations

from typing import Any

import pulumi
import pytest

from infra.render.program import FAKE_CERTIFICATE, run_stack
from infra.stack_config import UNREADABLE_SECRET
from infra.store.external import verified_url
from tests.infra.conftest import EKS_STACK, KUBEADM_STACK
from tests.infra.store_objects import (
    CA_FILE,
    CLUSTER,
    CONFIG_MAP,
    DAEMON_SET,
    SECRET,
    daemon_env,
    named,
)

URL = "postgresql://profiler:s3cret@db.example.org/profiler"
EXTERNAL = {"profilerStore": "external", "profilerStoreCa": FAKE_CERTIFICATE}


def stored_url(run: Any) -> str:
    secret = named(run, SECRET, "gpu-profiler-store", "gpu-profiler")
    assert "stringData" in secret.secret_paths
    return str(secret.inputs["stringData"]["store-url"])


def test_external_store_verifies_the_server_against_the_given_ca() -> None:
    run = run_stack(KUBEADM_STACK, overrides=EXTERNAL, secrets={"profilerStoreUrl": URL})
    assert stored_url(run) == f"{URL}?sslmode=verify-full&sslrootcert={CA_FILE}"
    assert daemon_env(run)["GPU_PROFILER_STORE_URL"] == {
        "secretKeyRef": {"name": "gpu-profiler-store", "key": "store-url"}
    }
    ca = named(run, CONFIG_MAP, "gpu-profiler-store-ca", "gpu-profiler")
    assert ca.inputs["data"] == {"ca.crt": FAKE_CERTIFICATE}
    pod = run.one(DAEMON_SET).get("spec.template.spec")
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["store-ca"]["configMap"]["name"] == "gpu-profiler-store-ca"
    (container,) = pod["containers"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["store-ca"] == {
        "name": "store-ca",
        "mountPath": "/etc/gpu-profiler/store-ca",
        "readOnly": True,
    }
    assert "s3cret" not in str(run.one(DAEMON_SET).inputs)
    assert not run.of_type(CLUSTER)
    grafana = run.release("kube-prometheus-stack").inputs["values"]["grafana"]
    assert "envValueFrom" not in grafana
    assert run.outputs["profilerStore"] == ("external", False)


def test_an_explicit_verify_full_gets_only_the_ca_file() -> None:
    url = f"{URL}?sslmode=verify-full&connect_timeout=5"
    run = run_stack(EKS_STACK, overrides=EXTERNAL, secrets={"profilerStoreUrl": url})
    assert stored_url(run) == f"{url}&sslrootcert={CA_FILE}"


def test_the_opt_out_takes_the_url_as_given_and_mounts_no_ca() -> None:
    url = f"{URL}?sslmode=require"
    run = run_stack(
        EKS_STACK,
        overrides={"profilerStore": "external", "profilerStoreAllowUnverifiedTls": True},
        secrets={"profilerStoreUrl": url},
    )
    assert stored_url(run) == url
    volumes = {v["name"] for v in run.one(DAEMON_SET).get("spec.template.spec.volumes")}
    assert "store-ca" not in volumes


@pytest.mark.parametrize("mode", ["disable", "allow", "prefer", "require", "verify-ca"])
def test_a_weaker_sslmode_is_refused_naming_the_keys(mode: str) -> None:
    with pytest.raises(pulumi.RunError) as raised:
        run_stack(
            EKS_STACK, overrides=EXTERNAL, secrets={"profilerStoreUrl": f"{URL}?sslmode={mode}"}
        )
    message = str(raised.value)
    assert message == (
        f"stack config profilerStoreUrl has sslmode={mode}, which does not authenticate the "
        "server; use sslmode=verify-full (the default when the URL names none) with "
        "profilerStoreCa, or set profilerStoreAllowUnverifiedTls: true to accept that"
    )
    assert "s3cret" not in message


@pytest.mark.parametrize(
    ("overrides", "url", "message"),
    [
        ({"profilerStore": "external"}, URL, "needs the CA that signs its certificate"),
        (EXTERNAL, f"{URL}?sslrootcert=system", "names sslrootcert, a file the profiler's pods"),
        (EXTERNAL, f"{URL}?sslmode=verify-full&sslmode=disable", "names sslmode twice"),
        (EXTERNAL, "db.example.org:5432", "must be a postgresql:// URL"),
        (
            {"profilerStore": "external", "profilerStoreCa": "not a certificate"},
            URL,
            "profilerStoreCa must hold PEM certificates",
        ),
        (
            {**EXTERNAL, "profilerStoreAllowUnverifiedTls": True},
            f"{URL}?sslrootcert=/etc/ssl/ca.pem",
            "names sslrootcert",
        ),
    ],
)
def test_external_tls_mistakes_stop_with_one_line(
    overrides: dict[str, Any], url: str, message: str
) -> None:
    with pytest.raises(pulumi.RunError, match=message) as raised:
        run_stack(EKS_STACK, overrides=overrides, secrets={"profilerStoreUrl": url})
    assert "\n" not in str(raised.value)
    assert "s3cret" not in str(raised.value)


def test_the_ca_key_belongs_to_the_external_store_only() -> None:
    with pytest.raises(pulumi.RunError, match="profilerStoreCa is for profilerStore: external"):
        run_stack(EKS_STACK, overrides={"profilerStoreCa": FAKE_CERTIFICATE})


@pytest.mark.parametrize(
    ("url", "completed"),
    [
        ("postgresql://u@h/d", "postgresql://u@h/d?sslmode=verify-full&sslrootcert=/ca"),
        ("postgresql://u@h/d?", "postgresql://u@h/d?sslmode=verify-full&sslrootcert=/ca"),
        (
            "postgresql://u@h/d?sslmode=verify-full",
            "postgresql://u@h/d?sslmode=verify-full&sslrootcert=/ca",
        ),
        (
            "postgres://u@h/d?application_name=x&",
            "postgres://u@h/d?application_name=x&sslmode=verify-full&sslrootcert=/ca",
        ),
    ],
)
def test_the_url_is_completed_where_libpq_reads_options(url: str, completed: str) -> None:
    assert verified_url(url, "/ca") == completed
    assert verified_url(url, None) == url


def test_a_value_the_render_command_cannot_decrypt_is_completed_not_judged() -> None:
    """``python -m infra.render`` reads an encrypted ``profilerStoreUrl`` as a placeholder."""
    assert verified_url(UNREADABLE_SECRET, "/ca").startswith(UNREADABLE_SECRET)
