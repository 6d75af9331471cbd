"""The two ``zarr.json`` documents of a transparently sharded array (pure).

Above the zarr 3 store: the *presented* document (inner chunks); stored: the
same array with one ``sharding_indexed`` codec wrapping its codecs, a grid of
shards and the :data:`MARKER` extension member (``must_understand: false``).
Arrays sharded without the marker pass through as stored.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from shardkv.engine.options import Options
from shardkv.errors import ConfigurationError, MetadataError
from shardkv.keys.space import ShardedArray, chunk_key_encoding_from_metadata
from shardkv.metadata.documents import load_json
from shardkv.metadata.hierarchy import ZARR_JSON, consolidated_nodes
from shardkv.metadata.v3_view import SHARDING_CODEC, sharding_codec, sharding_spec_from_v3

MARKER = "shardkv"
"""The extension member of a stored ``zarr.json`` that marks the array as transparently sharded."""

_MARKER_VALUE: dict[str, Any] = {"must_understand": False, "sharded": "transparently"}


def parse_document(raw: bytes) -> dict[str, Any] | None:
    """A ``zarr.json`` value as a JSON object, or ``None`` when it is not one (stored as given)."""
    try:
        doc = load_json(ZARR_JSON, raw)
    except MetadataError:
        return None
    return doc if isinstance(doc, dict) else None


def _regular_chunk_shape(doc: Mapping[str, Any]) -> list[int] | None:
    grid = doc.get("chunk_grid")
    if not isinstance(grid, Mapping) or grid.get("name") != "regular":
        return None
    shape = (grid.get("configuration") or {}).get("chunk_shape")
    if not isinstance(shape, list) or not all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in shape):
        return None
    return shape


def _shardable_chunks(doc: Mapping[str, Any]) -> list[int] | None:
    """The chunk shape of a v3 array document this store can shard (regular grid, no shards, no transformers)."""
    if doc.get("zarr_format") != 3 or doc.get("node_type") != "array" or MARKER in doc:
        return None
    shape, chunks, codecs = doc.get("shape"), _regular_chunk_shape(doc), doc.get("codecs")
    if not isinstance(shape, list) or chunks is None or len(chunks) != len(shape) or not shape:
        return None
    if not isinstance(codecs, list) or not codecs or doc.get("storage_transformers"):
        return None
    if any(isinstance(c, Mapping) and c.get("name") == SHARDING_CODEC for c in codecs):
        return None  # the array asks for shards itself: passed through
    try:
        chunk_key_encoding_from_metadata(doc.get("chunk_key_encoding") or {"name": "default"})
    except ConfigurationError:
        return None
    return chunks


def stored_document(path: str, doc: Mapping[str, Any], options: Options) -> dict[str, Any] | None:
    """The stored (sharded) document of a presented array document, or ``None`` to store it as given.

    Parameters
    ----------
    path : str
        The array's path in the hierarchy (``""`` for a root array); ``chunks_per_shard``
        may be given per path.
    doc : mapping
        The ``zarr.json`` document written by code above the store.
    options : Options
        The store's options: ``chunks_per_shard`` and the index layout of new shards.

    Returns
    -------
    dict or None
        ``doc`` with a grid of shards (inner chunk shape x chunks_per_shard,
        elements), one ``sharding_indexed`` codec around ``doc["codecs"]`` and
        :data:`MARKER`; ``None`` for groups, 0-d arrays, arrays that ask for
        shards, irregular grids, storage transformers, or no ``chunks_per_shard``.
    """
    chunks = _shardable_chunks(doc)
    cps = None if chunks is None else options.chunks_per_shard.for_array(path, len(chunks))
    if chunks is None or cps is None:
        return None
    stored = copy.deepcopy(dict(doc))
    stored["chunk_grid"] = {
        "name": "regular",
        "configuration": {"chunk_shape": [c * n for c, n in zip(chunks, cps, strict=True)]},
    }
    stored["codecs"] = [sharding_codec(chunks, stored["codecs"], options.index_location, options.index_checksum)]
    stored[MARKER] = dict(_MARKER_VALUE)
    return stored


def presented_document(stored: Mapping[str, Any]) -> dict[str, Any] | None:
    """The presented document of a stored one carrying :data:`MARKER`, or ``None`` (present it as stored).

    The inverse of :func:`stored_document`: ``chunk_grid.chunk_shape`` = the
    sharding codec's inner ``chunk_shape``, ``codecs`` = its inner codecs, the
    marker removed; member order is kept.
    """
    if not isinstance(stored.get(MARKER), Mapping):
        return None
    codecs = stored.get("codecs")
    if not isinstance(codecs, list) or len(codecs) != 1 or codecs[0].get("name") != SHARDING_CODEC:
        return None
    config = codecs[0].get("configuration") or {}
    presented = {k: copy.deepcopy(v) for k, v in stored.items() if k != MARKER}
    presented["chunk_grid"] = {"name": "regular", "configuration": {"chunk_shape": list(config["chunk_shape"])}}
    presented["codecs"] = copy.deepcopy(config["codecs"])
    return presented


def transparent_array(path: str, stored: Mapping[str, Any]) -> ShardedArray | None:
    """The key mapping of a transparently sharded array, from its stored document (``None``: not one).

    Chunk keys (seen above the store) and shard keys (stored) use the array's
    one ``chunk_key_encoding``: with the default one, chunk ``(5, 3)`` is
    ``path/c/5/3`` above the store and lives in the shard ``path/c/1/1`` with
    ``chunks_per_shard = (4, 2)``.

    Raises
    ------
    ConfigurationError, UnsupportedError
        If the stored sharding configuration is invalid or not supported.
    """
    spec = sharding_spec_from_v3(stored, path) if presented_document(stored) is not None else None
    return None if spec is None else spec.array_at(path, spec.shard_key_encoding)


def consolidated_children(doc: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The array documents a group document consolidates, by relative path (``{}``: none)."""
    children = consolidated_nodes(doc) or {}
    return {
        p: child for p, child in children.items() if isinstance(child, Mapping) and child.get("node_type") == "array"
    }


def map_consolidated(doc: Mapping[str, Any], replace: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """A group document with the consolidated documents of ``replace`` (relative path -> document) swapped in."""
    out = copy.deepcopy(dict(doc))
    children = consolidated_nodes(out)
    if isinstance(children, dict):  # the block of the copy: swapped in place
        children.update(copy.deepcopy(dict(replace)))
    return out


def resharded(presented: Mapping[str, Any], stored: Mapping[str, Any]) -> dict[str, Any] | None:
    """``presented`` with the sharding of ``stored`` (a stored document of the same array), or ``None``.

    For a group's consolidated documents (readers without shardkv must see
    shards); ``None`` when ``stored`` is not transparently sharded or differs.
    """
    view = presented_document(stored)
    if view is None or any(view.get(k) != presented.get(k) for k in ("chunk_grid", "codecs")):
        return None
    return {**copy.deepcopy(dict(presented)), **copy.deepcopy({k: stored[k] for k in ("chunk_grid", "codecs", MARKER)})}
