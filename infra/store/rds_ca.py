"""``python -m infra.store.rds_ca REGION``: the CA bundle that RDS certificates in REGION chain to.

Printed on stdout for the RDS store's command (``pulumi up`` runs it once, where the stack is
deployed from): clients verify RDS with ``sslmode=verify-full`` against it. Fetched over HTTPS
from AWS's trust store, checked to hold certificates this machine's TLS library can load. Bad
input or a failed download: one line on stderr, exit 2.
"""

from __future__ import annotations

import re
import ssl
import sys
import urllib.request
from collections.abc import Sequence

TRUST_STORE = "https://truststore.pki.rds.amazonaws.com/{region}/{region}-bundle.pem"
REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-\d")
CERTIFICATE = re.compile(
    r"-----BEGIN CERTIFICATE-----\s+[A-Za-z0-9+/=\s]+?-----END CERTIFICATE-----"
)


class BundleError(Exception):
    """A bundle that could not be fetched or is not one."""


def checked_bundle(text: str) -> str:
    """The certificates of a PEM bundle, one after the other; BundleError when there are none or
    the TLS library refuses them."""
    certificates = CERTIFICATE.findall(text)
    if not certificates:
        raise BundleError("the response holds no PEM certificate")
    bundle = "\n".join(certificates) + "\n"
    try:
        ssl.create_default_context(cadata=bundle)
    except (ssl.SSLError, ValueError) as error:
        raise BundleError(f"the certificates do not load: {error}") from None
    return bundle


def fetch_bundle(region: str, timeout: float = 30.0) -> str:
    if not REGION.fullmatch(region):
        raise BundleError(f"{region!r} is not an AWS region name")
    url = TRUST_STORE.format(region=region)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310  https only
            text = response.read().decode("ascii", errors="replace")
    except OSError as error:
        raise BundleError(f"cannot download {url}: {error}") from None
    return checked_bundle(text)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m infra.store.rds_ca REGION", file=sys.stderr)
        return 2
    try:
        sys.stdout.write(fetch_bundle(args[0]))
    except BundleError as error:
        print(f"rds_ca: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
