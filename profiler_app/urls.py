"""URLs in messages and logs: credentials masked, ports checked."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

# Query options that carry a secret (libpq's password and sslpassword, say): masked too.
_SECRET_OPTION = re.compile(r"([?&][^=&#]*password[^=&#]*=)[^&#]*", re.IGNORECASE)


def is_secret_option(name: str) -> bool:
    """Whether a query option of this name carries a secret."""
    return "password" in name.lower()


def has_valid_port(url: str) -> bool:
    try:
        urlsplit(url).port  # noqa: B018 - parsing it is the check
    except ValueError:
        return False
    return True


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
