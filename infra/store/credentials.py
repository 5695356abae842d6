"""The store's passwords (StoreCredentials) and, for CloudNativePG, the CA its server certificates
chain to (StoreCa). Nothing here touches a cluster, so Grafana's copies can exist before Grafana
starts.

Passwords are ``pulumi_random`` results: Pulumi keeps them encrypted in the state, as secrets, and
they reach pods only through Secrets. The CA is an ECDSA P-256 key and a self-signed certificate
(``pulumi_tls``): CloudNativePG signs the server certificates it issues and renews with this key
(it reads an ``EC PRIVATE KEY`` PEM, which is what ``pulumi_tls`` writes for ECDSA), and every
client trusts this one certificate. The CA's lifetime is Pulumi's to manage: the certificate is
re-issued, for the same key, by the first ``pulumi up`` in its last year, and every copy follows.
"""

from __future__ import annotations

import pulumi
import pulumi_random as random
import pulumi_tls as tls

from infra.store.endpoint import READER_USER, WRITER_USER, DatabaseUser

PASSWORD_LENGTH = 40
CA_VALIDITY_HOURS = 10 * 365 * 24
CA_EARLY_RENEWAL_HOURS = 365 * 24
CA_COMMON_NAME = "gpu-profiler store CA"


class StoreCredentials(pulumi.ComponentResource):
    """The writer's and the reader's passwords."""

    writer: DatabaseUser
    reader: DatabaseUser

    def __init__(self, name: str, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-cluster:index:StoreCredentials", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        def password(role: str) -> pulumi.Output[str]:
            # Letters and digits only: safe in a libpq option, a URL and Grafana's $__env{}.
            generated = random.RandomPassword(
                f"{name}-{role}-password", length=PASSWORD_LENGTH, special=False, opts=child
            )
            return pulumi.Output.secret(generated.result)

        self.writer = DatabaseUser(WRITER_USER, password("writer"))
        self.reader = DatabaseUser(READER_USER, password("reader"))
        self.register_outputs(
            {"writer_password": self.writer.password, "reader_password": self.reader.password}
        )


class StoreCa(pulumi.ComponentResource):
    """The CA that CloudNativePG's server certificates chain to: its key and certificate."""

    certificate: pulumi.Output[str]
    private_key: pulumi.Output[str]

    def __init__(self, name: str, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-cluster:index:StoreCa", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        key = tls.PrivateKey(f"{name}-key", algorithm="ECDSA", ecdsa_curve="P256", opts=child)
        certificate = tls.SelfSignedCert(
            f"{name}-certificate",
            private_key_pem=key.private_key_pem,
            is_ca_certificate=True,
            set_subject_key_id=True,
            subject=tls.SelfSignedCertSubjectArgs(common_name=CA_COMMON_NAME),
            allowed_uses=["cert_signing", "crl_signing", "digital_signature"],
            validity_period_hours=CA_VALIDITY_HOURS,
            early_renewal_hours=CA_EARLY_RENEWAL_HOURS,
            opts=child,
        )
        self.certificate = certificate.cert_pem
        self.private_key = pulumi.Output.secret(key.private_key_pem)
        self.register_outputs({"certificate": self.certificate})
