"""Paths the user types, with ``~`` expanded."""

from pathlib import Path

from profiler_app.core.errors import UserError


def user_path(text: str) -> Path:
    """``text`` as a path with ``~`` or ``~user`` expanded; an unknown user is a UserError."""
    try:
        return Path(text).expanduser()
    except RuntimeError as error:  # pathlib: "Could not determine home directory."
        raise UserError(f"cannot expand {text!r}: {error}") from None
