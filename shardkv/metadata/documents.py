"""The one JSON reader and writer of metadata documents. Pure.

Every metadata document shardkv writes (``.zarray``, ``.zattrs``,
``.zmetadata``, the ``zarr.json`` view of a sharded array, 2022 draft array
documents) is serialised by :func:`dump_json` the way zarr-python 2 writes
its own: keys sorted, 4-space indent, ASCII only. So a document written
through the proxy is byte for byte what zarr would have stored, and two
conversions of one hierarchy are identical.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from shardkv.errors import MetadataError
from shardkv.keys.paths import split_key

ZARR_JSON = "zarr.json"
"""The metadata document of a Zarr v3 node (and the entry point of a 2022 draft hierarchy)."""
ZMETADATA = ".zmetadata"
"""The consolidated metadata document of a zarr 2 hierarchy (at its root)."""
META_NAMES = frozenset({".zarray", ".zgroup", ".zattrs", ZMETADATA, ZARR_JSON})
"""Names of the metadata documents of a Zarr v2 hierarchy, and of a v3 node's ``zarr.json``."""

NODE_DOCUMENTS = frozenset({".zarray", ".zgroup", ZARR_JSON})
"""The documents that make a path an array or a group: when one is unreadable, so is the node."""


def dump_json(doc: Any, *, key: str | None = None, strict: bool = False) -> bytes:
    """Serialise a metadata document (sorted keys, 4-space indent, ASCII).

    Parameters
    ----------
    doc : JSON-ready object
        The document.
    key : str, optional
        Where it will be stored (named in errors).
    strict : bool
        Refuse ``NaN`` and infinite floats, which JSON does not have. By
        default they are written bare (``NaN``, ``Infinity``), as zarr-python 2
        writes ``.zattrs`` and zarr-python 3 writes the attributes of a
        ``zarr.json`` (a fill value is spelled as a string by the v3 view, so
        only attributes can hold one).

    Returns
    -------
    bytes
        UTF-8 (ASCII) text.

    Raises
    ------
    MetadataError
        If ``strict`` and the document holds a non-finite float, or the
        document holds a value JSON cannot represent.
    """
    try:
        text = json.dumps(
            doc, indent=4, sort_keys=True, ensure_ascii=True, separators=(",", ": "), allow_nan=not strict
        )
    except (TypeError, ValueError) as exc:
        raise MetadataError(key or "<unsaved>", f"cannot be written as JSON: {exc}") from exc
    return text.encode()


def load_json(key: str, raw: bytes | bytearray | memoryview | str) -> Any:
    """Parse a stored metadata document.

    Parameters
    ----------
    key : str
        The document's key (named in errors).
    raw : bytes-like or str
        The stored bytes.

    Returns
    -------
    object
        The parsed document.

    Raises
    ------
    MetadataError
        If the bytes are not UTF-8 JSON (a ``ValueError``).
    """
    try:
        return json.loads(raw if isinstance(raw, str) else bytes(raw))
    except (UnicodeDecodeError, ValueError) as exc:
        raise MetadataError(key, f"is not valid JSON: {exc}") from exc
    except RecursionError:  # hostile nesting (100,000 levels): an error naming the key, never a traceback
        raise MetadataError(key, "is not readable JSON: nested too deeply") from None


def load_object(key: str, raw: bytes | bytearray | memoryview | str) -> dict[str, Any]:
    """Parse a stored document that must be a JSON object (``.zattrs``, ``.zgroup``, ``.zmetadata``).

    Raises
    ------
    MetadataError
        If the bytes are not JSON, or not a JSON object.
    """
    doc = load_json(key, raw)
    if not isinstance(doc, dict):
        raise MetadataError(key, f"must be a JSON object, got {type(doc).__name__}")
    return doc


def _int_list(key: str, doc: dict[str, Any], name: str, minimum: int) -> list[int]:
    value = doc.get(name)
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise MetadataError(key, f"field {name!r} must be a list of integers, got {value!r}")
    if any(v < minimum for v in value):
        raise MetadataError(key, f"field {name!r} must hold integers >= {minimum}, got {value!r}")
    return value


def load_zarray(key: str, raw: bytes | bytearray | memoryview | str) -> dict[str, Any]:
    """Parse a ``.zarray`` and check the types of the fields shardkv relies on.

    ``shape`` (ints >= 0) and ``chunks`` (ints >= 1, as many) must be lists
    of integers, ``dtype`` a string or a list (structured), and
    ``dimension_separator`` (when present) ``"."`` or ``"/"``.

    Raises
    ------
    MetadataError
        Naming the key and the field, for JSON that is not a ``.zarray`` zarr-python 2 can use.
    """
    doc = load_object(key, raw)
    shape = _int_list(key, doc, "shape", 0)
    chunks = _int_list(key, doc, "chunks", 1)
    if len(shape) != len(chunks):
        raise MetadataError(key, f"fields 'shape' {shape} and 'chunks' {chunks} must have the same length")
    if not isinstance(doc.get("dtype"), (str, list)):
        raise MetadataError(key, f"field 'dtype' must be a string or a list, got {doc.get('dtype')!r}")
    if doc.get("dimension_separator", ".") not in (".", "/", None):
        raise MetadataError(key, f"field 'dimension_separator' must be '.' or '/', got {doc['dimension_separator']!r}")
    return doc


def unreadable_documents(docs: Mapping[str, bytes | bytearray | memoryview | None]) -> dict[str, str]:
    """The node documents (``.zarray``, ``.zgroup``, ``zarr.json``) among ``docs`` that cannot be read, and why.

    Parameters
    ----------
    docs : mapping of str to bytes-like or None
        Stored documents by key (``None``: listed, but gone or unreadable when fetched).

    Returns
    -------
    dict of str to str
        ``{key: reason}``, in key order: not JSON, nested too deeply, not a
        JSON object. Tools that would otherwise take the node's data for
        garbage (or leave it out) report these instead.
    """
    found: dict[str, str] = {}
    for key in sorted(docs):
        if split_key(key)[1] not in NODE_DOCUMENTS:
            continue
        raw = docs[key]
        if raw is None:
            found[key] = "listed but cannot be read"
            continue
        try:
            load_object(key, raw)
        except MetadataError as exc:
            found[key] = str(exc).removeprefix(f"metadata document {key!r}: ")
    return found
