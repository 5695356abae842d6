"""The ``external`` store's URL: TLS that authenticates the server, unless the stack opts out.

libpq's ``sslmode`` (PostgreSQL docs, libpq "SSL Support", table "SSL Mode Descriptions"): only
``verify-full`` checks both the certificate chain and that the URL's host is one of the
certificate's names. ``require`` encrypts but accepts any certificate, so whoever sits between
the node and the database (a spoofed DNS name, a taken-over address) reads the password and every
row; ``verify-ca`` accepts any certificate of the CA, for any host. The stack therefore takes
the CA that signs the server's certificate (``profilerStoreCa``, PEM), mounts it into the
daemons and completes the URL with ``sslmode=verify-full&sslrootcert=<that file>``.

``sslrootcert=system`` is refused: the daemon's libpq is psycopg's binary build, whose OpenSSL
looks for system roots in a folder of its own build, not in the image's CA bundle.
``profilerStoreAllowUnverifiedTls: true`` takes the URL as given (no CA needed).
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

from infra.stack_config import ConfigError

URL_KEY = "profilerStoreUrl"
CA_CONFIG_KEY = "profilerStoreCa"
OPT_OUT_KEY = "profilerStoreAllowUnverifiedTls"
VERIFIED = "verify-full"
_TLS_OPTIONS = ("sslmode", "sslrootcert")


def _tls_options(url: str) -> dict[str, str]:
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        parts = None
    if parts is None or parts.scheme.partition("+")[0] not in ("postgresql", "postgres"):
        raise ConfigError(
            f"stack config {URL_KEY} must be a postgresql:// URL "
            "(postgresql://USER:PASSWORD@HOST/DB)"
        )
    options: dict[str, str] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in _TLS_OPTIONS and key in options:
            raise ConfigError(f"stack config {URL_KEY} names {key} twice; name it once")
        options[key] = value
    return options


def check_external_url(url: str, *, ca: bool, allow_unverified: bool) -> None:
    """Stops with one line (naming the key, never the URL) unless the URL verifies the server,
    or ``allow_unverified``."""
    options = _tls_options(url)
    if "sslrootcert" in options and (ca or not allow_unverified):
        raise ConfigError(
            f"stack config {URL_KEY} names sslrootcert, a file the profiler's pods do not have: "
            f"remove it and give the CA's PEM in {CA_CONFIG_KEY}, which the stack mounts"
        )
    if allow_unverified:
        return
    mode = options.get("sslmode", VERIFIED)
    if mode != VERIFIED:
        raise ConfigError(
            f"stack config {URL_KEY} has sslmode={mode}, which does not authenticate the server; "
            f"use sslmode={VERIFIED} (the default when the URL names none) with {CA_CONFIG_KEY}, "
            f"or set {OPT_OUT_KEY}: true to accept that"
        )
    if not ca:
        raise ConfigError(
            f"stack config {URL_KEY} verifies the server (sslmode={VERIFIED}), which needs the "
            f"CA that signs its certificate: pulumi config set {CA_CONFIG_KEY} -- "
            f'"$(cat ca.pem)", or set {OPT_OUT_KEY}: true to skip verification'
        )


def verified_url(url: str, ca_file: str | None) -> str:
    """The URL completed with ``sslmode=verify-full`` (when it names no sslmode) and the mounted
    CA file; unchanged without a CA (the opt-out)."""
    if ca_file is None:
        return url
    # Not validated again: the stack checked the URL (a value the render command cannot decrypt
    # is a placeholder, and stays one in the redacted Secret).
    names = {key for key, _ in parse_qsl(urlsplit(url.strip()).query, keep_blank_values=True)}
    added = [] if "sslmode" in names else [f"sslmode={VERIFIED}"]
    added.append(f"sslrootcert={ca_file}")
    text = url.strip()
    base, hash_mark, fragment = text.partition("#")
    separator = "?" if "?" not in base else "" if base.endswith(("?", "&")) else "&"
    return f"{base}{separator}{'&'.join(added)}{hash_mark}{fragment}"
