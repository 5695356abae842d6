"""Saved ``query_range`` answers read from a file (``analyze --input``)."""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Sequence

from profiler_app.core.errors import UserError
from profiler_app.core.model import SeriesMatrix
from profiler_app.sources.prometheus.documents import (
    fields_in_document,
    matrix_result,
    parse_query_range,
)

log = logging.getLogger(__name__)


def load_query_range(
    path: str, fields: Sequence[str] | None = None, *, optional_fields: Collection[str] = ()
) -> list[SeriesMatrix]:
    """Matrices from a saved query_range JSON file: the given fields, or every field in it.

    A field in ``optional_fields`` that the file lacks is skipped with one warning.
    """
    try:
        with open(path, encoding="utf-8") as file:
            document = json.load(file)
    except FileNotFoundError as error:
        raise UserError(f"{path}: no such file") from error
    except OSError as error:
        raise UserError(f"cannot read {path}: {error.strerror or error}") from error
    except (ValueError, UnicodeDecodeError) as error:
        raise UserError(f"{path} is not valid JSON: {error}") from error
    except RecursionError:  # arrays or objects nested thousands deep: no query_range answer
        raise UserError(f"{path} is nested too deeply to be a query_range answer") from None
    wanted = list(fields) if fields else fields_in_document(document, path)
    if not wanted and not matrix_result(document, path):
        raise UserError(f"{path}: the answer holds no series (an empty result)")
    if not wanted:
        raise UserError(f"{path}: series carry no __name__ label; say which field with --field")
    present = set(fields_in_document(document, path))
    matrices = []
    for field in wanted:
        if field in optional_fields and field not in present:
            log.warning("%s has no %s series; going on without it", path, field)
            continue
        matrices.append(parse_query_range(document, field, path))
    return matrices
