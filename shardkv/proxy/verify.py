"""Checking a sharded store end to end (``shardkv verify``), and removing what crashed writers left behind.

Walks the listing (never the shard grid) through the store's ``KVStore``; what
is checked, and what repair removes (proven garbage only): user guide, "The
command line".
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from math import prod
from typing import Any

import numpy as np

from shardkv.codecs.bounded import decode_bounded, stopped_at_declared_size
from shardkv.engine.locks import lock_prefix
from shardkv.errors import ConfigurationError, CorruptShardError
from shardkv.keys.paths import is_chunk_segment, join_path, owning_array, split_key
from shardkv.keys.space import ShardedArray
from shardkv.metadata.documents import META_NAMES, NODE_DOCUMENTS, ZARR_JSON, load_json, unreadable_documents
from shardkv.metadata.hierarchy import group_paths
from shardkv.metadata.v2_view import unusable_sharding
from shardkv.proxy.base import ProxyBase
from shardkv.proxy.draft import DraftShardedStore, draft_options
from shardkv.proxy.nodes import build_node
from shardkv.proxy.open import is_draft_hierarchy
from shardkv.storage.kv import ANY, LOCK_DIR, KVStore
from shardkv.storage.local import DEFAULT_TEMP_AGE
from shardkv.storage.local_tail import recorded_append
from shardkv.storage.open import open_kv
from shardkv.transformers import DATA_ROOT

_UNKNOWN_CHUNK_LIMIT = 2**30  # bytes a chunk of no fixed size (object dtype) may decode to in verify --decode


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
        damaged = [
            {"shard_key": s.shard_key, "array": s.array_path, "nbytes": s.nbytes, "problems": s.problems}
            for s in self.damaged
        ]
        found = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "shards"}
        return {"ok": self.ok, "shards": len(self.shards), "damaged": damaged, **found}


# -- the store --------------------------------------------------------------------------


def _kv_of(store: Any) -> KVStore:
    """The :class:`KVStore` of a proxy's base store (never the proxy as a mapping), or of a store itself."""
    return open_kv(store.base if isinstance(store, ProxyBase) else store)


def find_stale_temporaries(store: Any, min_age_seconds: float = DEFAULT_TEMP_AGE) -> list[str]:
    """Temporary files of local writers that no longer run (:func:`shardkv.storage.files.stale_in`).

    Parameters
    ----------
    store : ShardedStore, KVStore or anything :func:`shardkv.storage.open.open_kv` takes
        The store (a proxy's base store is used).
    min_age_seconds : float
        Age guard (seconds since the last modification) for temporaries
        whose writer's lock cannot be tried; one whose lock can be taken has
        no live writer and is stale whatever its age.

    Returns
    -------
    list of str
        Local paths, sorted. Empty for stores that write whole objects (only
        local directories get temporary files).
    """
    find = getattr(_kv_of(store), "find_stale_temporaries", None)
    return [] if find is None else list(find(min_age_seconds))


def remove_stale_temporaries(store: Any, min_age_seconds: float = DEFAULT_TEMP_AGE) -> list[str]:
    """Remove the files :func:`find_stale_temporaries` finds (vanished ones skipped); returns the paths removed."""
    remove = getattr(_kv_of(store), "remove_stale_temporaries", None)
    return [] if remove is None else list(remove(min_age_seconds))


def shard_directories(kv: KVStore, arr: ShardedArray) -> list[str]:
    """Sorted keys of ``arr``'s shards where a directory (or a link to one) stands (listings leave them out).

    Only stores with directories (``kv.caps.lock_dir``) are looked at, through
    chunk-like directory names, as deep as a shard key goes.
    """
    if not kv.caps.lock_dir:
        return []
    found: list[str] = []
    pending = [(arr.key_prefix, 0)]
    while pending:
        prefix, depth = pending.pop()
        for name in kv.list_dir(prefix)[1]:
            if not is_chunk_segment(name, well_formed=True):
                continue
            key = prefix + name
            if arr.shard_coords_of(key) is not None:
                found.append(key)
            elif depth < arr.ndim:  # "c/0/1" (v3 default keys) or "0/1" (the "/" separator)
                pending.append((key + "/", depth + 1))
    return sorted(found)


# -- shards -----------------------------------------------------------------------------


def _v2_decoder(zarray: Mapping[str, Any], key: str) -> tuple[Any, int | None]:
    """A function decoding one chunk with the array's compressor and filters, and the chunk's nbytes."""
    import numcodecs

    filters = [numcodecs.get_codec(c) for c in (zarray.get("filters") or [])]
    compressor = None if zarray.get("compressor") is None else numcodecs.get_codec(zarray["compressor"])
    dtype = np.dtype(zarray["dtype"]) if isinstance(zarray["dtype"], str) else None
    nbytes = None if dtype is None or dtype.hasobject else prod(zarray["chunks"]) * dtype.itemsize
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
    for local, offset, size in index.stored_entries():
        try:
            out = decode(bytes(view[offset : offset + size]), f"{report.shard_key} inner chunk {local}")
        except Exception as exc:  # any codec's own error type: reported, not raised
            if isinstance(exc, CorruptShardError) and stopped_at_declared_size(exc):  # expands beyond its size
                report.problems.append(f"inner chunk {local}: {exc.reason}")
            else:
                report.problems.append(f"inner chunk {local} does not decode: {type(exc).__name__}: {exc}")
            continue
        if nbytes is not None and len(out) != nbytes:
            report.problems.append(f"inner chunk {local} decodes to {len(out)} bytes, expected {nbytes}")


def _interrupted_append(kv: KVStore, key: str, arr: ShardedArray) -> str | None:
    """What to say of a damaged shard that an in-place append (``shard_updates="append"``) left torn, if one did.

    ``None`` where no lock file of the array records an append to it (or the
    store keeps no lock files): the damage is reported as it is.
    """
    root = kv.location.local_dir
    if root is None or not kv.caps.tail_updates:
        return None
    array_dir = os.path.realpath(os.path.join(root, *lock_prefix(arr).split("/")))
    repair = "`shardkv compact` (or any shardkv write of the shard) keeps it if complete, else cuts it back"
    try:
        lock_file = recorded_append(os.path.join(array_dir, LOCK_DIR), os.path.join(root, *key.split("/")))
    except PermissionError:
        return (
            "if a writer with shard_updates='append' was killed during an append, "
            f"{repair} (run by an account that may write the array; this one cannot read its lock files)"
        )
    if lock_file is None:
        return None
    return f"interrupted in-place append (its intent is in {lock_file}): {repair}"


def _draft_arrays(
    kv: KVStore, keys: list[str], report: VerifyReport
) -> tuple[dict[str, ShardedArray | None], dict[str, dict[str, Any]], set[str]]:
    """The arrays of a 2022 draft hierarchy by their data directory (``data/root/<path>``), their codecs, kept ones.

    The codecs come as a ``.zarray``-like document (dtype, chunks, compressor and
    filters as numcodecs configurations) for ``decode``; an array whose document
    cannot be used is reported in ``report.unreadable_metadata`` and its data kept.
    """
    proxy = DraftShardedStore._reopen(kv, draft_options())  # no zarr-python needed: any zarr installed
    paths = {key: path for key in keys if (path := proxy.array_path_of(key)) is not None}
    docs = kv.values(list(paths))
    report.unreadable_metadata.update(unreadable_documents(docs))
    arrays: dict[str, ShardedArray | None] = {}
    zarrays: dict[str, dict[str, Any]] = {}
    kept: set[str] = set()
    for key, path in paths.items():
        data = join_path(DATA_ROOT.rstrip("/"), path)
        if key in report.unreadable_metadata or key not in docs:
            kept.add(data)
            continue
        try:
            arrays[data] = proxy.sharded_array(path)
            doc = load_json(key, docs[key])
            zarrays[data] = {
                "dtype": doc["data_type"],
                "chunks": doc["chunk_grid"]["chunk_shape"],
                "compressor": _numcodecs_config(doc.get("compressor")),
                "filters": [_numcodecs_config(f) for f in doc.get("filters") or []],
            }
        except (ConfigurationError, NotImplementedError, KeyError, TypeError) as exc:
            report.unreadable_metadata[key] = " ".join(str(exc).split())
            kept.add(data)
    return arrays, zarrays, kept


def _numcodecs_config(codec: Any) -> dict[str, Any] | None:
    """A draft codec entry (``{"codec": ".../codec/<id>/1.0", "configuration": {...}}``) as numcodecs configures it."""
    if codec is None:
        return None
    return {"id": str(codec["codec"]).rstrip("/").split("/")[-2], **(codec.get("configuration") or {})}


def _v2_nodes(
    kv: KVStore, keys: list[str], report: VerifyReport
) -> tuple[set[str], dict[str, ShardedArray | None], dict[str, dict[str, Any]], set[str], set[str]]:
    """The nodes of a Zarr v2 (or v3) hierarchy: array paths, their sharding, their ``.zarray``, groups, kept nodes.

    Kept nodes are those whose keys are never garbage (v3 arrays shardkv does not
    check, nodes whose documents cannot be read: reported in ``report``).
    """
    docs = kv.values([k for k in keys if split_key(k)[1] in NODE_DOCUMENTS])  # the stored documents
    report.unreadable_metadata = unreadable_documents(docs)
    array_paths = {split_key(k)[0] for k in docs if split_key(k)[1] == ".zarray"}
    groups = {split_key(k)[0] for k in docs if split_key(k)[1] == ".zgroup"}
    arrays: dict[str, ShardedArray | None] = {p: None for p in array_paths}  # unsharded unless a zarr.json says
    zarrays: dict[str, dict[str, Any]] = {}  # the v2 document of each sharded array (stored or presented)
    kept_nodes: set[str] = set()  # v3 arrays shardkv does not check (not sharded): their keys are no orphans
    for key, raw in docs.items():
        path, name = split_key(key)
        if name != ZARR_JSON or key in report.unreadable_metadata:
            continue
        zarray_key = join_path(path, ".zarray")
        try:
            node = build_node(path, raw, docs.get(zarray_key) if zarray_key not in report.unreadable_metadata else None)
        except (ConfigurationError, NotImplementedError) as exc:  # why its sharding cannot be used
            report.unreadable_metadata[key] = " ".join(str(exc).split())
            continue
        # presented, deleted from zarr 2's view or not (shardkv.v2_deleted): its shards are checked all the same
        if ".zgroup" in node.presented:
            groups.add(path)
        if node.is_array and (".zarray" in node.presented or path in array_paths):
            array_paths.add(path)
            arrays[path] = node.array
            if node.array is not None:
                zarrays[path] = node.presented[".zarray"]
            continue
        reason = None if node.doc is None else unusable_sharding(node.doc, path)
        if reason is not None:
            report.unreadable_metadata[key] = reason
        elif (node.doc or {}).get("node_type") == "array":
            kept_nodes.add(path)
    damaged_nodes = {split_key(k)[0] for k in report.unreadable_metadata}
    array_paths -= damaged_nodes
    kept_nodes |= damaged_nodes
    return array_paths, arrays, zarrays, groups, kept_nodes


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

    Each index is checked (length, CRC32C, entries inside the chunk data, no
    two sharing bytes), stray and orphan chunk-like keys, stale temporaries
    and unreadable node documents are reported, and an interrupted append is
    named with its repair (``shardkv compact``). 2022 draft hierarchies too.

    Parameters
    ----------
    store : ShardedStore, KVStore or anything :func:`shardkv.storage.open.open_kv` takes
        The store (a proxy's base store is read; nothing is written through the proxy).
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

    Raises
    ------
    OSError
        If the listing or a metadata document cannot be read (permissions,
        network); a shard that cannot be read is reported, not raised.
    """
    kv = _kv_of(store)
    keys = sorted(kv.list_prefix(""))
    report = VerifyReport()
    if ZARR_JSON in keys and is_draft_hierarchy(kv):
        arrays, zarrays, kept_nodes = _draft_arrays(kv, keys, report)
        array_paths, groups = set(arrays) - kept_nodes, set[str]()
    else:
        array_paths, arrays, zarrays, groups, kept_nodes = _v2_nodes(kv, keys, report)
    for path in sorted(array_paths):  # directories where shards should be: not listed, yet damage
        arr = arrays.get(path)
        if arr is not None:
            keys.extend(shard_directories(kv, arr))
    keys.sort()
    decoders: dict[str, tuple[Any, int | None]] = {}
    for done, key in enumerate(keys, 1):
        if progress is not None:
            progress(done, len(keys))
        path, name = split_key(key)
        if name in META_NAMES:
            continue
        if kept_nodes and any(g in kept_nodes for g in group_paths(key)):
            report.kept_keys.append(key)  # its node cannot be read (or is not shardkv's): not provably garbage
            continue
        owner = owning_array(key, array_paths)
        if owner is None:
            # a chunk-like key directly under neither an array nor a group: left by a deleted array
            if path and is_chunk_segment(name, well_formed=True) and path not in groups:
                report.orphan_keys.append(key)
            continue
        arr = arrays.get(owner)
        if arr is None:
            continue  # a chunk of an unsharded array
        coords = arr.shard_coords_of(key)
        if coords is None:
            continue
        if any(c >= n for c, n in zip(coords, arr.shard_grid_shape or (), strict=False)):
            report.stray_keys.append(key)
            continue
        problem = None
        try:
            result = kv.get(key)
            if not result.found:  # listed, yet nothing to read: a dangling link, or removed meanwhile
                problem = "listed but cannot be read as a shard (not a regular file?)"
        except IsADirectoryError:
            problem = "listed but cannot be read as a shard (a directory, not a regular file)"
        except OSError as exc:  # permissions, a FIFO or socket, I/O errors: reported, the others still checked
            problem = f"cannot be read: {type(exc).__name__}: {' '.join(str(exc).split())}"
        if problem is not None:
            report.shards.append(ShardReport(key, owner, problems=[problem]))
            continue
        blob = bytes(result.whole())
        shard = ShardReport(key, owner, nbytes=len(blob))
        if decode and owner not in decoders:
            decoders[owner] = _v2_decoder(zarrays[owner], join_path(owner, ".zarray"))
        _check_shard(shard, blob, arr, decoders.get(owner))
        if shard.problems:
            note = _interrupted_append(kv, key, arr)
            if note is not None:
                shard.problems = [f"{p}: {note}" for p in shard.problems]
        report.shards.append(shard)
    report.stale_temporaries = find_stale_temporaries(kv, min_temp_age)
    if remove_orphans and report.orphan_keys:
        kv.put_many({k: (None, ANY) for k in report.orphan_keys})
        report.removed.extend(report.orphan_keys)
    if repair:
        report.removed.extend(remove_stale_temporaries(kv, min_temp_age))
    return report
