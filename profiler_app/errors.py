"""Errors that reach the user as one line on stderr, never as a traceback."""


class UserError(Exception):
    """Bad input or an unreachable dependency: printed as one line, exit status 2."""

    exit_code = 2


class SourceError(Exception):
    """A metrics source failed transiently (down, slow, 5xx). The daemon backs off and retries."""
