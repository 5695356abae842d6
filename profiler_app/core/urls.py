"""URLs in messages and logs: credentials masked; http base URLs checked."""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import SplitResult, urlsplit, urlunsplit

# Query options that carry a secret (libpq's password and sslpassword, say): masked too.
_SECRET_OPTION = re.compile(r"([?&][^=&#]*password[^=&#]*=)[^&#]*", re.IGNORECASE)


def is_secret_option(name: str) -> bool:
    """Whether a query option of this name carries a secret."""
    return "password" in name.lower()


_HOST_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def http_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be an http(s) base URL (no host, a space, a bad %-escape, a bad
    port), or None when it can: checked once at start, so that a typo is one error line rather
    than a connection that is retried for ever."""
    if any(character.isspace() or ord(character) < 32 for character in url):
        return "it contains a space or a control character"
    if _BAD_ESCAPE.search(url):
        return "a % not followed by two hex digits"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsing it is the check
    except ValueError as error:
        return str(error)
    if parts.scheme.lower() not in ("http", "https"):
        return "not http:// or https://"
    return _host_problem(parts)


def _host_problem(parts: SplitResult) -> str | None:
    host = parts.hostname or ""
    if not host:
        return "no host"
    if "[" not in parts.netloc:
        return None if _HOST_NAME.match(host) else f"{host!r} is not a host name"
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return f"{host!r} is not an IPv6 address"
    return None


def without_credentials(url: str) -> str:
    """The URL without user:password or password options, which must never reach a message
    or a log."""
    url = _SECRET_OPTION.sub(r"\1***", url)
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unclosed IPv6 bracket: refused later, but logged first
        return re.sub(r"//[^/]*@", "//***@", url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"***@{host}"))
