"""Saved ``query_range`` answers read from a file (``analyze --input``)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from profiler_app.errors import UserError
from profiler_app.model import SeriesMatrix
from profiler_app.sources.prometheus.documents import fields_in_document, parse_query_range


def load_query_range(path: str, fields: Sequence[str] | None = None) -> list[SeriesMatrix]:
    """Matrices from a saved query_range JSON file: the given fields, or every field in it."""
    try:
        with open(path, encoding="utf-8") as file:
            document = json.load(file)
    except FileNotFoundError as error:
        raise UserError(f"{path}: no such file") from error
    except OSError as error:
        raise UserError(f"cannot read {path}: {error.strerror or error}") from error
    except (ValueError, UnicodeDecodeError) as error:
        raise UserError(f"{path} is not valid JSON: {error}") from error
    wanted = list(fields) if fields else fields_in_document(document, path)
    if not wanted:
        raise UserError(f"{path}: series carry no __name__ label; say which field with --field")
    return [parse_query_range(document, field, path) for field in wanted]
