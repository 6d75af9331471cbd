"""The one JSON reader and writer of metadata documents. Pure.

Documents are written as zarr-python 2 writes its own (keys sorted, 4-space
indent, ASCII), so a document written through the proxy is byte for byte
what zarr would have stored, and two conversions of one hierarchy are identical.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from shardkv.errors import MetadataError
from shardkv.keys.paths import split_key

ZARR_JSON = "zarr.json"
ZMETADATA = ".zmetadata"
META_NAMES = frozenset({".zarray", ".zgroup", ".zattrs", ZMETADATA, ZARR_JSON})
NODE_DOCUMENTS = frozenset({".zarray", ".zgroup", ZARR_JSON})  # when one is unreadable, so is the node
DRAFT_ZARR_FORMAT = "https://purl.org/zarr/spec/protocol/core/3.0"  # a 2022 draft root zarr.json's zarr_format
META_ROOT = "meta/root/"  # the 2022 draft hierarchy's metadata area


def dump_json(doc: Any, *, key: str | None = None, strict: bool = False) -> bytes:
    """Serialise a metadata document to ASCII bytes; ``key`` (where it will be stored) is named in errors.

    Non-finite floats are written bare (``NaN``, ``Infinity``), as zarr-python 2
    writes ``.zattrs`` and zarr-python 3 attributes, unless ``strict``.

    Raises
    ------
    MetadataError
        If ``strict`` and the document holds a non-finite float, or it holds a
        value JSON cannot represent.
    """
    try:
        text = json.dumps(
            doc, indent=4, sort_keys=True, ensure_ascii=True, separators=(",", ": "), allow_nan=not strict
        )
    except (TypeError, ValueError) as exc:
        raise MetadataError(key or "<unsaved>", f"cannot be written as JSON: {exc}") from exc
    return text.encode()


def load_json(key: str, raw: bytes | bytearray | memoryview | str) -> Any:
    """Parse the stored metadata document at ``key``.

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
    """Parse a ``.zarray``: ``shape`` (ints >= 0), ``chunks`` (as many ints >= 1), ``dtype`` str or list, separator.

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
    """The node documents among ``docs`` (key -> bytes, ``None`` if unreadable) that cannot be read: ``{key: why}``."""
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


def is_draft_entry_point(doc: Any) -> bool:
    """True when ``doc`` (a parsed root ``zarr.json``) is the entry point of a 2022 draft hierarchy."""
    return isinstance(doc, dict) and doc.get("zarr_format") == DRAFT_ZARR_FORMAT
