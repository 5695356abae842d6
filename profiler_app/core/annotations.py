"""The annotation domain: the prefix of every annotation key the profiler writes.

The one definition: the CLI default, the Kubernetes sink and the DaemonSet (infra/profiler.py)
import it from here. Kept free of heavy imports for that reason.
"""

from __future__ import annotations

import re

from profiler_app.core.errors import UserError

DEFAULT_DOMAIN = "ai.centaurus.io"

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def validate_domain(domain: str) -> str:
    """The annotation domain, or UserError if Kubernetes would reject it as a key prefix."""
    if len(domain) > 253 or not _DNS_SUBDOMAIN.match(domain):
        raise UserError(
            f"invalid annotation domain {domain!r}: use a DNS subdomain such as {DEFAULT_DOMAIN}"
        )
    return domain
