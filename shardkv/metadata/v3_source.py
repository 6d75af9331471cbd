"""Zarr v3 arrays as ``shardkv convert`` takes them: where each stored chunk is, and the documents written. Pure.

A stored chunk is encoded by the array's whole codec chain, so it is exactly
an inner chunk whose inner codecs are that chain (sharding-indexed-codec
v1.0, "Configuration parameters"): :func:`sharded_document` makes the chain
the inner ``codecs``; an already sharded array keeps its inner chunks and
codecs (resharding). :func:`plain_document` is the way back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardkv.errors import ConfigurationError, ShardKVError, UnsupportedError
from shardkv.format.layout import ShardLayout
from shardkv.keys.paths import join_path
from shardkv.keys.space import ChunkKeyEncoding, DefaultChunkKeyEncoding, ShardedArray, chunk_key_encoding_from_metadata
from shardkv.metadata.hierarchy import consolidated_entry, consolidated_nodes
from shardkv.metadata.v3_view import SHARDING_CODEC, ShardingSpec, sharding_codec, sharding_spec_from_v3

PLAIN_KEYS = DefaultChunkKeyEncoding("/")  # zarr-python 3's default chunk keys (c/0/0)


@dataclass(frozen=True)
class ArraySource:
    """Where the stored chunks of one v3 array are, and how each is encoded.

    ``chunks`` (elements) and ``codecs`` are those of one stored chunk (a
    sharded array's inner ones); ``encoding`` names the stored objects;
    ``sharding`` is ``None`` for one object per chunk.
    """

    path: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    encoding: ChunkKeyEncoding
    codecs: list[dict[str, Any]]
    sharding: ShardingSpec | None

    def shards(self) -> ShardedArray | None:
        """The key mapping of the source's shards (chunk keys in :attr:`encoding`), ``None`` if not sharded."""
        return None if self.sharding is None else self.sharding.array_at(self.path, self.encoding)


def source_of(doc: Mapping[str, Any], path: str) -> ArraySource:
    """How the v3 array document ``doc`` at ``path`` stores its chunks.

    Raises
    ------
    UnsupportedError
        If its chunks cannot be moved as stored: codecs before or after
        ``sharding_indexed``, storage transformers, a grid other than ``regular``.
    ConfigurationError
        If the document is invalid (chunk key encoding, sharding configuration, a member missing).
    """
    try:
        where = path or "/"
        grid = doc.get("chunk_grid") or {}
        if grid.get("name") != "regular":
            raise UnsupportedError(f"{where}: chunk grid {grid.get('name')!r} (only a regular grid is sharded)")
        if doc.get("storage_transformers"):
            raise UnsupportedError(f"{where}: storage transformers have no place inside a shard")
        codecs = [dict(c) for c in doc.get("codecs") or []]
        names = [c.get("name") for c in codecs]
        encoding = chunk_key_encoding_from_metadata(dict(doc.get("chunk_key_encoding") or {"name": "default"}))
        shape = tuple(int(s) for s in doc["shape"])
        if SHARDING_CODEC in names[1:] or (names and names[0] == SHARDING_CODEC and len(names) > 1):
            raise UnsupportedError(
                f"{where}: codecs {names} encode whole shards (codecs before or after {SHARDING_CODEC}): "
                "its inner chunks cannot be moved without re-encoding"
            )
        spec = sharding_spec_from_v3(doc, path)
        if spec is None:
            chunks = tuple(int(c) for c in (grid.get("configuration") or {})["chunk_shape"])
            if len(chunks) != len(shape):
                raise ConfigurationError(f"chunk_shape {list(chunks)} does not match shape {list(shape)}", path)
            return ArraySource(path, shape, chunks, encoding, codecs, None)
        inner = [dict(c) for c in codecs[0]["configuration"]["codecs"]]
        return ArraySource(path, shape, spec.chunks, encoding, inner, spec)
    except ShardKVError as exc:
        if isinstance(exc, ConfigurationError) and exc.path is None:
            raise ConfigurationError(f"zarr.json: {exc.reason}", path) from exc
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigurationError(f"zarr.json: invalid or missing member ({type(exc).__name__}: {exc})", path) from exc


def sharded_document(doc: Mapping[str, Any], source: ArraySource, layout: ShardLayout) -> dict[str, Any]:
    """The ``zarr.json`` of the array sharded with ``layout``: only the chunk grid and ``codecs`` change.

    Raises
    ------
    ConfigurationError
        If ``layout.chunks_per_shard`` has not one value per dimension.
    """
    cps = layout.chunks_per_shard
    if len(cps) != len(source.chunks):
        raise ConfigurationError(
            f"chunks_per_shard {cps} does not match the {len(source.chunks)}-d chunks", source.path
        )
    shard_shape = [c * n for c, n in zip(source.chunks, cps, strict=True)]
    codec = sharding_codec(
        source.chunks, source.codecs, layout.index_location, layout.index_checksum, layout.index_endian
    )
    return {**doc, "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": shard_shape}}, "codecs": [codec]}


def plain_document(doc: Mapping[str, Any], source: ArraySource) -> dict[str, Any]:
    """The ``zarr.json`` of the array stored one object per (inner) chunk, at :data:`PLAIN_KEYS`."""
    out = dict(doc)
    out["chunk_grid"] = {"name": "regular", "configuration": {"chunk_shape": list(source.chunks)}}
    out["codecs"] = [dict(c) for c in source.codecs]
    out["chunk_key_encoding"] = PLAIN_KEYS.to_metadata()
    return out


def refresh_consolidated(doc: Mapping[str, Any], path: str, changed: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The group document ``doc`` at ``path`` with its (nested) consolidated entries of ``changed`` paths replaced."""
    nodes = consolidated_nodes(doc)
    if nodes is None:
        return dict(doc)
    entries: dict[str, Any] = {}
    for rel, entry in nodes.items():
        full = join_path(path, rel)
        if full in changed:
            entries[rel] = consolidated_entry(changed[full]) or entry
        elif isinstance(entry, Mapping) and consolidated_nodes(entry) is not None:
            entries[rel] = refresh_consolidated(entry, full, changed)
        else:
            entries[rel] = entry
    return {**doc, "consolidated_metadata": {**doc["consolidated_metadata"], "metadata": entries}}
