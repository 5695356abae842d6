"""Opening an Nsight Systems report: a ``.sqlite`` export, or a ``.nsys-rep`` exported first.

Every way a file can be wrong (missing, a directory, not SQLite, truncated, SQLite but not an
nsys export, an export schema this tool does not know) ends in one ``UserError`` line. The
database is opened read-only and nothing is written to it (the summary reads columns out and
works in numpy), so a report on a read-only volume works and is never modified.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from profiler_app.core.errors import UserError
from profiler_app.core.paths import user_path
from profiler_app.trace import schema

_SQLITE_MAGIC = b"SQLite format 3\x00"
_HEADER_BYTES = 100
REPORT_SUFFIXES = (".nsys-rep", ".qdrep")  # .qdrep: the name before Nsight Systems 2021.4


@dataclass
class Export:
    """An open, checked export. ``tables`` holds the names present; ``warnings`` go to the user."""

    path: Path
    connection: sqlite3.Connection
    tables: frozenset[str]
    metadata: dict[str, str]
    columns: dict[str, frozenset[str]]
    warnings: list[str] = field(default_factory=list)

    @property
    def schema_version(self) -> str | None:
        return self.metadata.get("EXPORT_SCHEMA_VERSION")

    @property
    def product_version(self) -> str | None:
        return self.metadata.get("EXPORT_PRODUCT_VERSION")

    def has(self, table: str) -> bool:
        return table in self.tables

    def has_column(self, table: str, column: str) -> bool:
        return column in self.columns.get(table, frozenset())


@contextmanager
def open_report(path_text: str) -> Iterator[Export]:
    """The export at ``path_text``, exporting a ``.nsys-rep`` first when nsys is on PATH."""
    path = user_path(path_text)
    if path.is_dir():
        raise UserError(f"{path} is a directory: give the report file (REPORT.sqlite)")
    if not path.exists():
        raise UserError(f"no report at {path}")
    if path.suffix.lower() in REPORT_SUFFIXES:
        with tempfile.TemporaryDirectory(prefix="gpu-profiler-trace-") as scratch:
            exported = export_with_nsys(path, Path(scratch))
            with _opened(exported, shown=path) as export:
                yield export
        return
    with _opened(path, shown=path) as export:
        yield export


def export_with_nsys(report: Path, directory: Path) -> Path:
    """``nsys export --type sqlite`` of ``report`` into ``directory``; refused without nsys."""
    nsys = shutil.which("nsys")
    sqlite_name = report.with_suffix(".sqlite").name
    if nsys is None:
        raise UserError(
            f"{report} is an Nsight Systems report and nsys is not on PATH: export it where "
            f"Nsight Systems is installed with `nsys export --type sqlite --output "
            f"{sqlite_name} {report.name}` and give the .sqlite file"
        )
    output = directory / sqlite_name
    command = [nsys, "export", "--type", "sqlite", "--force-overwrite", "true"]
    try:
        completed = subprocess.run(
            [*command, "--output", str(output), str(report)],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError as error:
        raise UserError(f"cannot run {nsys}: {error}") from None
    if completed.returncode != 0 or not output.is_file():
        lines = (completed.stderr or completed.stdout).strip().splitlines()
        reason = lines[-1] if lines else f"exit status {completed.returncode}"
        raise UserError(f"nsys export of {report} failed: {reason}")
    return output


@contextmanager
def _opened(path: Path, *, shown: Path) -> Iterator[Export]:
    _check_sqlite_file(path, shown)
    try:
        connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as error:
        raise UserError(f"cannot open {shown}: {error}") from None
    try:
        # SQLite's default page cache (2 MiB): each event table is read once, in rowid order,
        # so a larger one only holds pages read already (100 MiB more memory for a 100 MiB
        # export, no time saved); sorts of NVTX ranges spill to memory, not to files.
        connection.execute("PRAGMA temp_store = MEMORY")
        export = _inspect(connection, shown)
        yield export
    except sqlite3.DatabaseError as error:
        raise UserError(_describe(error, shown)) from None
    finally:
        connection.close()


_DAMAGE = ("malformed", "not a database", "disk i/o", "corrupt")


def _describe(error: sqlite3.DatabaseError, shown: Path) -> str:
    """A damaged page found mid-query (the header cannot show every truncation), or another
    SQLite error from an export laid out in a way this tool did not expect."""
    text = str(error)
    if any(word in text.lower() for word in _DAMAGE):
        return f"{shown} is damaged or truncated: {text}"
    return f"cannot read {shown}: {text}"


def _check_sqlite_file(path: Path, shown: Path) -> None:
    """SQLite's header: the magic string, and a size that holds every page it announces."""
    try:
        with path.open("rb") as file:
            header = file.read(_HEADER_BYTES)
        size = path.stat().st_size
    except OSError as error:
        raise UserError(f"cannot read {shown}: {error.strerror or error}") from None
    if not header.startswith(_SQLITE_MAGIC):
        raise UserError(
            f"{shown} is not an SQLite database: give the export of `nsys export --type sqlite`"
        )
    if len(header) < _HEADER_BYTES:
        raise UserError(f"{shown} is truncated: {size} bytes, not even an SQLite header")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    # The page count in the header is valid only while the change counter matches.
    if header[24:28] == header[92:96] and pages and size < pages * page_size:
        raise UserError(
            f"{shown} is truncated: {size:,} bytes of the {pages * page_size:,} its header "
            "announces (copy it again, e.g. kubectl cp ... and compare sizes)"
        )


def _inspect(connection: sqlite3.Connection, shown: Path) -> Export:
    tables = frozenset(
        name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")
    )
    nsys_tables = tables & {
        schema.METADATA,
        schema.OLD_METADATA,
        schema.KERNEL,
        schema.MEMCPY,
        schema.MEMSET,
        schema.RUNTIME,
        schema.NVTX,
    }
    if schema.STRINGS not in tables or not nsys_tables:
        raise UserError(
            f"{shown} is an SQLite database but not an Nsight Systems export "
            "(no StringIds, META_DATA_EXPORT or CUPTI_ACTIVITY_KIND_* tables)"
        )
    metadata: dict[str, str] = {}
    for table in (schema.METADATA, schema.OLD_METADATA):
        if table in tables:
            for name, value in connection.execute(f"SELECT name, value FROM {table}"):
                if name is not None and value is not None:  # NULL: not said
                    metadata.setdefault(str(name), str(value))
    columns = {
        table: frozenset(row[1] for row in connection.execute(f"PRAGMA table_info({table})"))
        for table in tables
        if table in schema.REQUIRED_COLUMNS
        or table in (schema.GPUS, schema.CUDA_DEVICES, schema.SESSION_START)
    }
    export = Export(shown, connection, tables, metadata, columns)
    _check_version(export)
    _check_columns(export)
    return export


def _check_version(export: Export) -> None:
    text = export.schema_version
    known = " and ".join(f"{major}.x" for major in schema.KNOWN_SCHEMA_MAJORS)
    if text is None:
        export.warnings.append(
            f"{export.path} does not say its export schema version (no EXPORT_SCHEMA_VERSION value "
            f"in {schema.METADATA}); reading it as schema {schema.KNOWN_SCHEMA_MAJORS[-1]}.x"
        )
        return
    version = schema.parse_schema_version(text)
    if version is None or version[0] not in schema.KNOWN_SCHEMA_MAJORS:
        product = f" (Nsight Systems {export.product_version})" if export.product_version else ""
        raise UserError(
            f"{export.path} has export schema version {text}{product}, which this gpu-profiler "
            f"does not know: it reads schema {known}; export the report with an Nsight Systems "
            "release that writes it, or upgrade gpu-profiler"
        )


def _check_columns(export: Export) -> None:
    for table, required in schema.REQUIRED_COLUMNS.items():
        if not export.has(table):
            continue
        missing = [column for column in required if not export.has_column(table, column)]
        if missing:
            raise UserError(
                f"{export.path}: table {table} has no column {', '.join(missing)} "
                f"(export schema {export.schema_version or 'unknown'}); this is not a layout "
                "this gpu-profiler reads"
            )
    if export.has(schema.KERNEL) and not (
        export.has_column(schema.KERNEL, "demangledName")
        or export.has_column(schema.KERNEL, "shortName")
    ):
        raise UserError(f"{export.path}: table {schema.KERNEL} names no kernels")
