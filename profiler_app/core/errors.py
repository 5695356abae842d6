"""Errors that reach the user as one line on stderr, never as a traceback."""

from collections.abc import Mapping


class UserError(Exception):
    """Bad input or an unreachable dependency: printed as one line, exit status 2."""

    exit_code = 2


class RetryLaterError(Exception):
    """A transient failure, perhaps with the delay the server asked for (HTTP Retry-After)."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ItemsFailedError(RetryLaterError):
    """A sink did its work but for some items (pods), each waiting out a back-off of its own:
    ``failing`` names each ("namespace/name") and why, ``attempts`` counts those that failed
    in this call. The daemon reports them and does not back the sink off."""

    def __init__(self, message: str, failing: Mapping[str, str], attempts: int) -> None:
        super().__init__(message)
        self.failing = dict(failing)
        self.attempts = attempts


class SourceError(RetryLaterError):
    """A metrics source failed transiently (down, slow, 5xx). The daemon backs off and retries,
    waiting at least the ``retry_after`` the server asked for."""


def one_line(error: BaseException) -> str:
    """``Type: message`` on one line, for logs and error lines."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
