"""Store URLs, parsed without SQLAlchemy: the daemon connects through the DB-API drivers.

``sqlite:///PATH`` or ``postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?LIBPQ-OPTIONS]``
(``postgres://`` and ``postgresql+psycopg://`` too). The parts are percent-decoded as
SQLAlchemy decodes them; ``engine.sqlalchemy_url`` builds its URL from these same parts.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, quote, unquote, urlsplit

import platformdirs

from profiler_app.core.errors import UserError
from profiler_app.core.paths import user_path
from profiler_app.core.urls import is_secret_option, without_credentials

_URL_HELP = "use sqlite:///PATH or postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
_SCHEME = re.compile(r"([A-Za-z][\w+]*)://(.*)", re.DOTALL)


@dataclass(frozen=True)
class StoreUrl:
    """A validated store URL: ``backend`` is "sqlite" (``database`` a path) or "postgresql"."""

    backend: str
    database: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    host: str | None = None
    port: int | None = None
    query: dict[str, str] = field(default_factory=dict)

    def display(self) -> str:
        """The URL safe for logs and messages: the password is masked."""
        if self.backend == "sqlite":
            return f"sqlite:///{self.database}"
        user = quote(self.username or "", safe="")
        if self.password is not None:
            user += ":***"
        host = f"[{self.host}]" if self.host and ":" in self.host else self.host or ""
        port = f":{self.port}" if self.port is not None else ""
        options = "&".join(
            f"{key}={'***' if is_secret_option(key) else value}"
            for key, value in self.query.items()
        )
        return f"postgresql://{user}{'@' if user else ''}{host}{port}/{quote(self.database)}" + (
            f"?{options}" if options else ""
        )

    def sqlite_path(self) -> Path | None:
        """The database file of a SQLite URL (``~`` expanded); None for PostgreSQL."""
        return user_path(self.database) if self.backend == "sqlite" else None


def default_store_url() -> str:
    """The SQLite file under this user's data directory (created when the store opens)."""
    path = Path(platformdirs.user_data_dir("gpu-profiler")) / "profiler.db"
    return f"sqlite:///{path}"


def parse_store_url(url: str) -> StoreUrl:
    """The parts of a store URL, or ``UserError`` saying what is wrong (never the password)."""
    text = url.strip()
    match = _SCHEME.fullmatch(text)
    if match is None:
        raise UserError(f"malformed store URL {without_credentials(url)!r}: {_URL_HELP}")
    backend, _, driver = match[1].lower().partition("+")
    if backend in {"postgresql", "postgres"}:
        if driver not in {"", "psycopg"}:
            raise UserError(f"unsupported PostgreSQL driver {driver!r}: use postgresql://")
        return _postgresql(text)
    if backend == "sqlite":
        if driver not in {"", "pysqlite"}:
            raise UserError(f"unsupported SQLite driver {driver!r}: use sqlite:///PATH")
        host, _, database = match[2].partition("/")
        if host or "?" in database:
            raise UserError(f"malformed SQLite store URL {url.strip()!r}: use sqlite:///PATH")
        database = unquote(database)
        if not database or database == ":memory:":
            raise UserError("a SQLite store needs a file: sqlite:///PATH")
        return StoreUrl("sqlite", database)
    raise UserError(f"unsupported store URL scheme {match[1]!r}: {_URL_HELP}")


def _postgresql(text: str) -> StoreUrl:
    if importlib.util.find_spec("psycopg") is None:
        raise UserError(
            "a PostgreSQL store needs psycopg: .venv/bin/pip install -e '.[postgres]' in the "
            "gpu-cluster-profiler checkout"
        )
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        raise UserError(f"malformed store URL {without_credentials(text)!r}: {_URL_HELP}") from None
    parsed = StoreUrl(
        "postgresql",
        unquote(parts.path.removeprefix("/")),
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
        host=parts.hostname or None,
        port=port,
        query=dict(parse_qsl(parts.query, keep_blank_values=True)),
    )
    if not parsed.database:
        raise UserError(f"store URL {parsed.display()!r} names no database")
    return parsed
