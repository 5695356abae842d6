"""PATCH as the stand-in API server applies it, and what it refuses, as the real server's
patch handler and registry do.

A strategic merge or merge patch is a JSON object: maps merge, ``null`` deletes a key; lists
are replaced, where the real strategic merge treats some specially, which the profiler never
patches. A JSON patch is RFC 6902 ``add``, ``remove``, ``replace`` and ``test`` (not ``move``
or ``copy``). A server-side apply (``application/apply-patch+yaml``, which the real server
accepts on pods and nodes) needs ``fieldManager``, else 422 as kubernetes@v1.35.0
staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/validation/validation.go
``ValidatePatchOptions`` answers; it is applied here as a merge of the applied configuration,
without field ownership or removal of fields a manager stops applying. Another Content-Type is
415, a malformed body 400.

Then: a JSON patch that does not apply (a failed ``test`` too) is 422 with the generic "the
server rejected our request" Status; a patched object whose ``metadata.resourceVersion``
differs from the stored one (the patch carried a stale one: a precondition) is 409 Conflict; a
changed ``metadata.name`` 400; a changed ``metadata.uid`` (the patch carried another object's:
a UID precondition) 422 "field is immutable". Annotation values must be strings and keys
qualified names (else 422), and the total annotation size is capped at 256 KiB, as the real
server validates.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import yaml

from tests.support.apiserver.objects import Json, status_object
from tests.support.apiserver.state import RecordedRequest

STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
PATCH_TYPES = (STRATEGIC_MERGE_PATCH, MERGE_PATCH, JSON_PATCH, APPLY_PATCH)
ANNOTATIONS_MAX_BYTES = 256 * 1024

_NAME_PART = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_KIND_NAMES = {"pods": "Pod", "nodes": "Node"}


class RefusedPatchError(Exception):
    """A patch the real server refuses: the answer's status code and ``Status`` object."""

    def __init__(self, code: int, status: Json) -> None:
        super().__init__(status["message"])
        self.code = code
        self.status = status


def _refusal(code: int, reason: str, message: str) -> RefusedPatchError:
    return RefusedPatchError(code, status_object(code, reason, message))


def merge_patch(target: Json, patch: Json) -> None:
    """Merge ``patch`` into ``target``: maps merge, ``null`` deletes a key, the rest replaces."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge_patch(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
            if isinstance(value, dict):
                _drop_nulls(target[key])


def _drop_nulls(mapping: Json) -> None:
    for key in [key for key, value in mapping.items() if value is None]:
        del mapping[key]
    for value in mapping.values():
        if isinstance(value, dict):
            _drop_nulls(value)


class JsonPatchError(Exception):
    """A JSON patch that does not apply (422) or is malformed (``malformed``: 400)."""

    def __init__(self, message: str, *, malformed: bool = False) -> None:
        super().__init__(message)
        self.malformed = malformed


def patch_not_applied(message: str) -> Json:
    """The real server's answer to a JSON patch that does not apply (a failed ``test`` too):
    a generic 422 whose cause carries the patch library's message."""
    status = status_object(
        422, "Invalid", "the server rejected our request due to an error in our request"
    )
    status["details"] = {"causes": [{"reason": "UnexpectedServerResponse", "message": message}]}
    return status


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise JsonPatchError(f"invalid JSON pointer {path!r}", malformed=True)
    return [part.replace("~1", "/").replace("~0", "~") for part in path.split("/")[1:]]


def _parent(document: Any, parts: list[str], op: str, path: str) -> tuple[Any, str]:
    """The container holding the pointer's last part, and that part."""
    if not parts:
        raise JsonPatchError(f"{op} operation on the whole document is not supported here")
    container = document
    for part in parts[:-1]:
        if isinstance(container, dict) and part in container:
            container = container[part]
        elif isinstance(container, list) and part.isdigit() and int(part) < len(container):
            container = container[int(part)]
        else:
            raise JsonPatchError(f'{op} operation does not apply: doc is missing path: "{path}"')
    return container, parts[-1]


def apply_json_patch(document: Json, operations: list[Json]) -> Json:
    """RFC 6902 ``add``, ``remove``, ``replace`` and ``test`` on object members and list items,
    as the API server's patch library applies them. Its one departure from the RFC is kept:
    ``test`` with value null passes when the member is missing."""
    for operation in operations:
        op, path = operation.get("op"), operation.get("path")
        if op not in ("add", "remove", "replace", "test"):
            raise JsonPatchError(f"unsupported operation {op!r}", malformed=True)
        if op in ("add", "replace", "test") and "value" not in operation:
            raise JsonPatchError(f"{op} operation without a value", malformed=True)
        container, last = _parent(document, _pointer(path), op, str(path))
        if isinstance(container, list):
            index = len(container) if last == "-" else int(last) if last.isdigit() else -1
            present = 0 <= index < len(container)
            value = container[index] if present else None
        elif isinstance(container, dict):
            present = last in container
            value = container.get(last)
        else:
            raise JsonPatchError(f'{op} operation does not apply: doc is missing path: "{path}"')
        if op == "test":
            if value != operation["value"]:  # a missing member reads as null
                raise JsonPatchError(f"testing value {path} failed: test failed")
            continue
        if op in ("remove", "replace") and not present:
            raise JsonPatchError(f'{op} operation does not apply: doc is missing key: "{path}"')
        if isinstance(container, list):
            if op == "add" and 0 <= index <= len(container):
                container.insert(index, copy.deepcopy(operation["value"]))
            elif op == "add":
                raise JsonPatchError(f'add operation does not apply: index out of range: "{path}"')
            elif op == "remove":
                del container[index]
            else:
                container[index] = copy.deepcopy(operation["value"])
        elif op == "remove":
            del container[last]
        else:
            container[last] = copy.deepcopy(operation["value"])
    return document


def _annotation_problem(annotations: Any) -> str | None:
    """Why these annotations would be rejected by the real API server's validation, if so."""
    if not isinstance(annotations, dict):
        return "metadata.annotations: must be a map of strings"
    total = 0
    for key, value in annotations.items():
        if not isinstance(value, str):
            return f"metadata.annotations[{key}]: value must be a string"
        prefix, _, name = key.rpartition("/")
        if not _NAME_PART.match(name) or (
            prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix))
        ):
            return (
                f"metadata.annotations: Invalid value: {key!r}: name part must be a qualified name"
            )
        total += len(key) + len(value)
    if total > ANNOTATIONS_MAX_BYTES:
        return f"metadata.annotations: Too long: must have at most {ANNOTATIONS_MAX_BYTES} bytes"
    return None


def read_patch(request: RecordedRequest, content_type: str) -> Any:
    """The patch in the body; raises ``RefusedPatchError`` with the real server's refusal:
    an unknown type (415), an apply without ``fieldManager`` (422), a malformed body (400)."""
    if content_type not in PATCH_TYPES:
        message = f"the body of the request was in an unknown format: {request.content_type}"
        raise _refusal(415, "UnsupportedMediaType", message)
    if content_type == APPLY_PATCH and not request.query.get("fieldManager"):
        message = (
            'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is '
            "required for apply patch"
        )
        raise _refusal(422, "Invalid", message)
    try:
        if content_type == APPLY_PATCH:
            return yaml.safe_load(request.body)
        return json.loads(request.body)
    except (ValueError, yaml.YAMLError) as error:
        raise _refusal(400, "BadRequest", f"invalid patch: {error}") from error


def patched_object(request: RecordedRequest, kind: str, current: Json) -> Json:
    """``current`` (a copy) with the strategic merge, merge or JSON patch of ``request``
    applied; raises ``RefusedPatchError`` when the real server would not store the result."""
    name = current["metadata"]["name"]
    content_type = (request.content_type or "").split(";")[0].strip()
    patch = read_patch(request, content_type)
    patched = copy.deepcopy(current)
    if content_type == JSON_PATCH:
        if not isinstance(patch, list) or not all(isinstance(op, dict) for op in patch):
            raise _refusal(400, "BadRequest", "a JSON patch must be a list of operations")
        try:
            patched = apply_json_patch(patched, patch)
        except JsonPatchError as error:
            if error.malformed:
                raise _refusal(400, "BadRequest", str(error)) from error
            raise RefusedPatchError(422, patch_not_applied(str(error))) from error
    elif isinstance(patch, dict):
        merge_patch(patched, patch)
    else:
        raise _refusal(400, "BadRequest", "a merge patch must be an object")
    _check_patched_object(kind, name, current, patched)
    return patched


def _check_patched_object(kind: str, name: str, current: Json, patched: Json) -> None:
    """Raise ``RefusedPatchError`` when the patched object cannot be stored, checking what it
    says against the stored one in the real server's order: resourceVersion (409 Conflict),
    name (400), uid (422), annotations (422)."""
    meta, stored = patched.get("metadata") or {}, current["metadata"]
    if str(meta.get("resourceVersion", "")) != stored["resourceVersion"]:
        # A resourceVersion in the patch is a precondition (optimistic concurrency).
        message = (
            f'Operation cannot be fulfilled on {kind} "{name}": the object has been '
            "modified; please apply your changes to the latest version and try again"
        )
        raise _refusal(409, "Conflict", message)
    if meta.get("name") != name:
        message = (
            f"the name of the object ({meta.get('name')}) does not match the name on the URL "
            f"({name})"
        )
        raise _refusal(400, "BadRequest", message)
    if meta.get("uid", stored.get("uid")) != stored.get("uid"):
        # The uid is immutable: a patch carrying another pod's uid is refused.
        message = (
            f'{_KIND_NAMES[kind]} "{name}" is invalid: metadata.uid: Invalid value: '
            f'"{meta.get("uid")}": field is immutable'
        )
        raise _refusal(422, "Invalid", message)
    problem = _annotation_problem(meta.get("annotations", {}))
    if problem:
        raise _refusal(422, "Invalid", f'{kind} "{name}" is invalid: {problem}')
