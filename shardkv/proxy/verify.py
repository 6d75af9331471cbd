"""Checking a sharded store end to end, and removing what crashed writers left behind.

:func:`verify_store` reads every stored shard of every sharded array of a
:class:`~shardkv.proxy.store.ShardedStore` and checks, per shard (v1.0 codec
"Binary shard format"):

* the index: its length (a truncated shard), its CRC32C where the layout has
  one, no half-empty entry, every entry inside the chunk data region (so not
  overlapping the index) and no ``offset + nbytes`` overflow
  (:meth:`~shardkv.format.layout.ShardLayout.index_of_shard`);
* no two entries sharing bytes (:meth:`~shardkv.format.index.ShardIndex.overlaps`);
* with ``decode=True``, that every stored inner chunk decodes with the
  array's v2 compressor and filters (numcodecs) to exactly one chunk's bytes.

It also lists keys that look like chunk keys but belong to no shard
(:attr:`VerifyReport.stray_keys`: coords outside an array's shard grid),
chunk-like keys under paths that are no longer arrays
(:attr:`VerifyReport.orphan_keys`: shards of deleted arrays) and temporary
files of killed writers (:func:`find_stale_temporaries`), and node documents
(``.zarray``, ``.zgroup``, ``zarr.json``) that cannot be read
(:attr:`VerifyReport.unreadable_metadata`).

Repair removes only what is proven garbage. ``repair=True`` removes the stale
temporaries; orphans (chunk-like keys of a path without array metadata) are
removed only with ``remove_orphans=True``, after they were listed: metadata
that is merely missing may come back (a partial copy, a sync under way).
Nothing under a node whose metadata is unreadable is ever touched, and a
damaged shard may still hold chunks someone wants: both are reported, never
deleted.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from math import prod
from typing import Any, Callable, Iterable

import numpy as np

from shardkv.codecs.bounded import decode_bounded
from shardkv.engine.temporaries import DEFAULT_TEMP_AGE, find_stale_temporaries, remove_stale_temporaries
from shardkv.errors import ChunkExpansionError, CorruptShardError
from shardkv.keys.space import ShardedArray
from shardkv.metadata.documents import NODE_DOCUMENTS, load_json, unreadable_documents
from shardkv.metadata.v2_view import unusable_sharding
from shardkv.proxy.presenting import PresentingAdapter
from shardkv.storage.adapters import StoreAdapter

__all__ = [
    "ShardReport",
    "VerifyReport",
    "verify_store",
    "find_stale_temporaries",
    "remove_stale_temporaries",
    "DEFAULT_TEMP_AGE",
]


_META = (".zarray", "zarr.json")
_UNKNOWN_CHUNK_LIMIT = 2**30  # bytes a chunk of no fixed size (object dtype) may decode to in verify --decode
_CHUNKISH = re.compile(r"c|c?[0-9]+([./][0-9]+)*")


@dataclass
class ShardReport:
    """What :func:`verify_store` found in one shard.

    Attributes
    ----------
    shard_key : str
        Key of the shard in the base store.
    array_path : str
        Path of the array it belongs to.
    nbytes : int
        Size of the shard (bytes).
    chunks : int
        Inner chunks its index lists as stored (0 when the index is unreadable).
    problems : list of str
        One line per kind of damage; empty for a sound shard.
    """

    shard_key: str
    array_path: str
    nbytes: int = 0
    chunks: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class VerifyReport:
    """The result of :func:`verify_store`.

    Attributes
    ----------
    shards : list of ShardReport
        One per stored shard, in key order.
    stray_keys : list of str
        Chunk-like keys of sharded arrays outside their shard grid (reported only).
    orphan_keys : list of str
        Chunk-like keys under paths that hold no array metadata any more.
    stale_temporaries : list of str
        Temporary files of atomic local writes older than the age guard (paths).
    unreadable_metadata : dict of str to str
        Node documents that cannot be read, with the reason; the keys under
        such a node are never removed.
    kept_keys : list of str
        Keys under a node with unreadable metadata (kept, never removed).
    removed : list of str
        What ``repair=True`` / ``remove_orphans=True`` removed (keys, or paths for temporaries).
    """

    shards: list[ShardReport] = field(default_factory=list)
    stray_keys: list[str] = field(default_factory=list)
    orphan_keys: list[str] = field(default_factory=list)
    stale_temporaries: list[str] = field(default_factory=list)
    unreadable_metadata: dict[str, str] = field(default_factory=dict)
    kept_keys: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    @property
    def damaged(self) -> list[ShardReport]:
        """The shards with at least one problem."""
        return [s for s in self.shards if not s.ok]

    @property
    def ok(self) -> bool:
        """True when nothing is damaged and nothing removable is left behind."""
        left = set(self.orphan_keys) | set(self.stale_temporaries)
        unreadable = self.unreadable_metadata
        return not self.damaged and not self.stray_keys and not unreadable and left <= set(self.removed)

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable summary (the CLI's ``--json`` output)."""
        return {
            "ok": self.ok,
            "shards": len(self.shards),
            "damaged": [
                {"shard_key": s.shard_key, "array": s.array_path, "nbytes": s.nbytes, "problems": s.problems}
                for s in self.damaged
            ],
            "stray_keys": self.stray_keys,
            "orphan_keys": self.orphan_keys,
            "stale_temporaries": self.stale_temporaries,
            "unreadable_metadata": self.unreadable_metadata,
            "kept_keys": self.kept_keys,
            "removed": self.removed,
        }


# -- shards -----------------------------------------------------------------------------


def _parent(key: str) -> tuple[str, str]:
    path, _, name = key.rpartition("/")
    return path, name


def _ancestors(key: str) -> Iterable[str]:
    path = key
    while path:
        path = path.rpartition("/")[0]
        yield path


def _v2_decoder(base: StoreAdapter, arr: ShardedArray) -> tuple[Any, int | None]:
    """A function decoding one chunk with the array's compressor and filters, and the chunk's nbytes."""
    import numcodecs

    key = f"{arr.path}/.zarray" if arr.path else ".zarray"
    meta = json.loads(bytes(base.get(key)))
    filters = [numcodecs.get_codec(c) for c in (meta.get("filters") or [])]
    compressor = None if meta.get("compressor") is None else numcodecs.get_codec(meta["compressor"])
    dtype = np.dtype(meta["dtype"]) if isinstance(meta["dtype"], str) else None
    nbytes = None if dtype is None or dtype.hasobject else prod(meta["chunks"]) * dtype.itemsize
    # what the compressor may give back: the chunk's size exactly, or (filters may widen items) a bounded multiple
    limit = _UNKNOWN_CHUNK_LIMIT if nbytes is None else nbytes if not filters else 8 * nbytes + 4096

    def decode(data: bytes, where: str = "") -> bytes:
        out: Any = data if compressor is None else decode_bounded(compressor, data, limit, where or key)
        for codec in reversed(filters):
            out = codec.decode(out)
        return out.tobytes() if isinstance(out, np.ndarray) else bytes(memoryview(out).cast("B"))

    return decode, nbytes


def _check_shard(report: ShardReport, blob: bytes, arr: ShardedArray, decoder: Any) -> None:
    layout = arr.layout
    try:
        index = layout.index_of_shard(blob, report.shard_key)
    except CorruptShardError as exc:
        report.problems.append(exc.reason)
        return
    report.chunks = index.count_present()
    pair = index.overlaps()
    if pair is not None:
        report.problems.append(f"inner chunks {pair[0]} and {pair[1]} share bytes")
    if decoder is None:
        return
    decode, nbytes = decoder
    view = memoryview(blob)
    for local in index.present():
        offset, size = index.get(local)  # type: ignore[misc]
        try:
            out = decode(bytes(view[offset : offset + size]), f"{report.shard_key} inner chunk {local}")
        except ChunkExpansionError as exc:
            report.problems.append(f"inner chunk {local}: {exc.reason}")
            continue
        except Exception as exc:  # any codec's own error type: reported, not raised
            report.problems.append(f"inner chunk {local} does not decode: {type(exc).__name__}: {exc}")
            continue
        if nbytes is not None and len(out) != nbytes:
            report.problems.append(f"inner chunk {local} decodes to {len(out)} bytes, expected {nbytes}")


def verify_store(
    store: Any,
    *,
    decode: bool = False,
    repair: bool = False,
    min_temp_age: float = DEFAULT_TEMP_AGE,
    remove_orphans: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> VerifyReport:
    """Check every shard of every sharded array of ``store``.

    Parameters
    ----------
    store : ShardedStore
        The proxy (its :attr:`~ShardedStore.base` and
        :meth:`~ShardedStore.sharded_array` are used; nothing is written through it).
    decode : bool
        Also decode every stored inner chunk (v2 compressor and filters).
    repair : bool
        Remove stale temporary files (proven garbage only).
    min_temp_age : float
        Age guard (seconds) for temporary files, see :func:`find_stale_temporaries`.
    remove_orphans : bool
        Also remove the orphans: chunk-like keys of paths without array
        metadata (never those under a node whose metadata is unreadable).
    progress : callable or None
        Called as ``progress(done, total)`` once per listed key checked
        (``total``: the keys listed), for a progress bar.

    Returns
    -------
    VerifyReport
        Per-shard results and what was found (and removed) besides shards.
    """
    base: StoreAdapter = PresentingAdapter(store.base)  # v3-only nodes listed with their v2 documents
    keys = sorted(base.iter_keys())
    key_set = set(keys)
    array_paths = {_parent(k)[0] for k in keys if _parent(k)[1] == ".zarray"}  # v3-only arrays: presented
    report = VerifyReport()
    meta_keys = [k for k in keys if _parent(k)[1] in NODE_DOCUMENTS]
    docs = store.base.get_many(meta_keys)  # the stored documents (a presented view is not stored: not returned)
    report.unreadable_metadata = unreadable_documents(docs)
    kept_nodes: set[str] = set()  # v3 arrays shardkv does not check (not sharded): their keys are no orphans
    for key, raw in docs.items():
        path, name = _parent(key)
        if name != "zarr.json" or key in report.unreadable_metadata or path in array_paths:
            continue
        doc = load_json(key, raw)
        reason = unusable_sharding(doc, path) if isinstance(doc, dict) else None
        if reason is not None:
            report.unreadable_metadata[key] = reason
        elif isinstance(doc, dict) and doc.get("node_type") == "array":
            kept_nodes.add(path)
    damaged_nodes = {_parent(k)[0] for k in report.unreadable_metadata}
    array_paths -= damaged_nodes
    kept_nodes |= damaged_nodes
    arrays = {p: store.sharded_array(p) for p in sorted(array_paths)}
    decoders = {}
    for done, key in enumerate(keys, 1):
        if progress is not None:
            progress(done, len(keys))
        path, name = _parent(key)
        if name in _META or name in (".zattrs", ".zgroup", ".zmetadata"):
            continue
        if kept_nodes and any(a in kept_nodes for a in _ancestors(key)):
            report.kept_keys.append(key)  # its node cannot be read (or is not shardkv's): not provably garbage
            continue
        owner = next((a for a in _ancestors(key) if a in array_paths), None)
        if owner is None:
            # a chunk-like key directly under neither an array nor a group: left by a deleted array
            if path and _CHUNKISH.fullmatch(name) and f"{path}/.zgroup" not in key_set:
                report.orphan_keys.append(key)
            continue
        arr = arrays.get(owner)
        if arr is None:
            continue  # a chunk of an unsharded array
        coords = arr.shard_coords_of(key)
        if coords is None:
            continue
        if any(c >= n for c, n in zip(coords, arr.shard_grid_shape)):
            report.stray_keys.append(key)
            continue
        try:
            blob = bytes(base.get(key))
        except KeyError:  # listed, yet nothing to read: a directory, a dangling link, a special file
            problem = "listed but cannot be read as a shard (not a regular file?)"
            report.shards.append(ShardReport(key, owner, problems=[problem]))
            continue
        except OSError as exc:  # permissions, I/O errors: this shard is reported, the others are still checked
            report.shards.append(ShardReport(key, owner, problems=[f"cannot be read: {type(exc).__name__}: {exc}"]))
            continue
        shard = ShardReport(key, owner, nbytes=len(blob))
        decoder = None
        if decode:
            if owner not in decoders:
                decoders[owner] = _v2_decoder(base, arr)
            decoder = decoders[owner]
        _check_shard(shard, blob, arr, decoder)
        report.shards.append(shard)
    report.stale_temporaries = find_stale_temporaries(base, min_temp_age)
    if remove_orphans:
        base.delete_many(report.orphan_keys)
        report.removed.extend(report.orphan_keys)
    if repair:
        report.removed.extend(remove_stale_temporaries(base, min_temp_age))
    return report
