"""Errors that reach the user as one line on stderr, never as a traceback."""


class UserError(Exception):
    """Bad input or an unreachable dependency: printed as one line, exit status 2."""

    exit_code = 2


class RetryLaterError(Exception):
    """A transient failure, perhaps with the delay the server asked for (HTTP Retry-After)."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class SourceError(RetryLaterError):
    """A metrics source failed transiently (down, slow, 5xx). The daemon backs off and retries,
    waiting at least the ``retry_after`` the server asked for."""


def one_line(error: BaseException) -> str:
    """``Type: message`` on one line, for logs and error lines."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
