"""``shardkv unshard``: turn a sharded hierarchy back into plain Zarr v2 chunks, the inverse of convert.

The source is a hierarchy whose arrays are sharded the way shardkv shards
them (a v3 ``zarr.json`` with the ``sharding_indexed`` codec, read with the
``.zarray`` presented from it).
Each shard is read whole, its index decoded, and every present inner chunk is
written as stored (never decoded) to the chunk key zarr-python 2 expects (``path/1.7``, or ``path/1/7`` with the ``/``
separator). Inner chunks outside the array's chunk grid are skipped and
counted. The ``zarr.json`` documents of sharded arrays and v3 groups are dropped (their
``.zarray``/``.zattrs``/``.zgroup`` are written instead); every other key (metadata,
unsharded arrays, other files) is copied as it is; metadata is written last,
deepest first. Chunks are written in batches by several threads at once, each
object as durably as every write to the destination (a local file: written,
fsync'd, renamed, its directory fsync'd once per batch), so that their fsyncs
overlap (one chunk is small: its write is mostly the wait for its fsync).
The result is read by zarr-python 2 without shardkv and equals the sharded
hierarchy read through :class:`shardkv.ShardedStore`.

An interrupted run resumes: a progress manifest
(:data:`shardkv.cli.manifest.UNSHARD_MANIFEST_KEY`) in the destination records
each shard whose chunks have all been written; running the same command again
skips those shards (their chunks are already in the destination) and copies the
rest. The manifest is deleted once the metadata, written last, is in place.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import closing
from dataclasses import asdict, dataclass
from typing import Any, Literal

from shardkv.cli.convert.job import _check_distinct, _name
from shardkv.cli.convert.tasks import shard_index
from shardkv.cli.errors import DestinationNotEmptyError
from shardkv.cli.info import META_NAMES, Hierarchy, read_hierarchy
from shardkv.cli.info_draft import is_draft
from shardkv.cli.info_format import counted
from shardkv.cli.manifest import UNSHARD_MANIFEST_KEY, Manifest, open_destination
from shardkv.cli.stores import open_store, put_all, refuse_regular_file
from shardkv.cli.view import HierarchyView, sizes
from shardkv.errors import ConfigurationError, UnsupportedError
from shardkv.keys.paths import split_key
from shardkv.keys.space import ShardedArray
from shardkv.proxy.nodes import NodeTable
from shardkv.proxy.verify import remove_stale_temporaries, shard_directories
from shardkv.storage.kv import KVStore

__all__ = ["UnshardReport", "unshard"]

_SHARD_BATCH = 16  # shards read per batched request
_WRITE_BATCH = 256  # chunks written per batched request
_WRITERS = 16  # threads writing one batch (a chunk's write is mostly the wait for its fsync)


@dataclass
class UnshardReport:
    """The outcome of :func:`unshard`.

    Attributes
    ----------
    src, dst : str
        Source and destination, as given.
    arrays, unsharded_arrays : int
        Arrays copied; of which were sharded and are now plain.
    shards : int
        Shards unpacked by the whole job (this run and the interrupted runs it resumed).
    shards_skipped : int
        Of those, the shards an interrupted run had finished, skipped by this one.
    chunks : int
        Chunks taken out of shards by the whole job.
    chunks_skipped : int
        Of those, the chunks of the skipped shards (written by the interrupted runs).
    out_of_grid_chunks : int
        Inner chunks outside their array's chunk grid, skipped (by this run).
    objects_before, objects_after : int
        Objects stored in the source; objects of the whole job in the destination.
    bytes_before, bytes_after : int
        Their sizes in bytes.
    """

    src: str
    dst: str
    arrays: int = 0
    unsharded_arrays: int = 0
    shards: int = 0
    shards_skipped: int = 0
    chunks: int = 0
    chunks_skipped: int = 0
    out_of_grid_chunks: int = 0
    objects_before: int = 0
    objects_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of the report."""
        return asdict(self)

    def summary(self) -> str:
        """Human-readable lines."""
        lines = [
            f"unsharded {self.src} into {self.dst}: {counted(self.arrays, 'array')}, {self.unsharded_arrays} of them "
            f"were sharded and are now plain Zarr v2",
            f"  chunks: {self.chunks} taken out of {counted(self.shards, 'shard')}",
        ]
        if self.shards_skipped:
            lines.append(
                f"  resumed: this run took {self.chunks - self.chunks_skipped} chunks out of "
                f"{self.shards - self.shards_skipped} shards; an earlier run had done the other "
                f"{self.shards_skipped} shards ({self.chunks_skipped} chunks)"
            )
        if self.out_of_grid_chunks:
            lines.append(f"  chunks outside the array grid, skipped: {self.out_of_grid_chunks}")
        lines.append(f"  objects: {self.objects_before} -> {self.objects_after}")
        lines.append(f"  bytes: {self.bytes_before} -> {self.bytes_after}")
        return "\n".join(lines)


class _Out:
    """Batched writes to the destination, counted; a batch is written by :data:`_WRITERS` threads at once.

    Each object is stored as every write is (a local file: written, fsync'd, renamed, its directory
    fsync'd): a chunk is a small object, so the time of one is the wait for its fsync, and the
    waits of the writers overlap (the file system commits their fsyncs together).
    """

    def __init__(self, store: KVStore, writers: int | None = None) -> None:
        self.store = store
        self.pending: dict[str, bytes] = {}
        self.objects = self.nbytes = 0
        self.writers = writers or _WRITERS
        self._pool = ThreadPoolExecutor(self.writers, thread_name_prefix="shardkv-unshard")

    def put(self, key: str, value: bytes) -> None:
        self.pending[key] = value
        if len(self.pending) >= _WRITE_BATCH:
            self.flush()

    def flush(self) -> None:
        """Store every pending object; returns once all are stored (raises the first error of a writer)."""
        if not self.pending:
            return
        items = list(self.pending.items())
        parts = [dict(items[i :: self.writers]) for i in range(min(self.writers, len(items)))]
        writes = [self._pool.submit(put_all, self.store, part) for part in parts]
        wait(writes)  # every writer has stopped before an error is raised: nothing written after the return
        for write in writes:
            write.result()
        self.objects += len(items)
        self.nbytes += sum(len(v) for _, v in items)
        self.pending = {}

    def close(self) -> None:
        self._pool.shutdown()


def unshard(
    src: Any,
    dst: Any,
    *,
    overwrite: bool = False,
    progress: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    src_storage_options: Mapping[str, Any] | None = None,
    dst_storage_options: Mapping[str, Any] | None = None,
    zarr_format: Literal[2, 3] = 2,
) -> UnshardReport:
    """Copy a sharded Zarr v2 hierarchy into a plain one, chunks as stored.

    Parameters
    ----------
    src, dst : str, os.PathLike, MutableMapping or fsspec.FSMap
        The sharded hierarchy and the (empty) destination.
    overwrite : bool
        Delete everything in ``dst`` first (a local regular file is always refused).
    progress : bool
        Show a tqdm progress bar (objects) on stderr.
    storage_options, src_storage_options, dst_storage_options : mapping, optional
        fsspec options for both URLs, or for one side.
    zarr_format : {2, 3}
        2: plain Zarr v2; 3: plain Zarr v3 from a Zarr v3 hierarchy, as zarr-python 3 writes it by
        default (``default`` chunk keys ``c/0/0``; :mod:`shardkv.cli.unshard_v3`).

    Returns
    -------
    UnshardReport

    Raises
    ------
    NotAHierarchyError
        If ``src`` is missing, empty or not a Zarr v2 hierarchy.
    UnsupportedError
        If ``src`` is a 2022 draft hierarchy.
    ConfigurationError
        If ``zarr_format`` is neither 2 nor 3.
    DestinationNotEmptyError, DestinationIsFileError, SameLocationError, StoreAccessError
        As :func:`shardkv.cli.convert.convert`.
    CorruptShardError, ChecksumError
        If a shard cannot be decoded.
    OSError
        If a key cannot be read (permissions; a directory, FIFO or socket where a shard should be).
    """
    from tqdm import tqdm

    src_name, dst_name = _name(src), _name(dst)
    src_opts = src_storage_options if src_storage_options is not None else storage_options
    dst_opts = dst_storage_options if dst_storage_options is not None else storage_options
    if isinstance(dst, str):
        refuse_regular_file(dst)
    source_kv = open_store(src, src_opts, role="source")
    target = open_store(dst, dst_opts, role="destination")
    _check_distinct(source_kv, target, src_name, dst_name)
    if is_draft(source_kv):
        raise UnsupportedError(f"{src_name} is a 2022 draft hierarchy; unshard reads Zarr v2 hierarchies only")
    if zarr_format not in (2, 3):
        raise ConfigurationError(f"zarr_format must be 2 or 3, got {zarr_format!r}")
    if zarr_format == 3:
        from shardkv.cli.unshard_v3 import unshard_v3

        return unshard_v3(source_kv, target, UnshardReport(src_name, dst_name), _Out(target), overwrite, progress)
    nodes = NodeTable(source_kv.values)
    source = HierarchyView(source_kv)  # sharded arrays and v3 groups (zarr.json only) appear in v2
    hierarchy = read_hierarchy(source, src_name)
    manifest = open_destination(target, dst_name, src_name, {"unshard": 1}, overwrite, key=UNSHARD_MANIFEST_KEY)
    if manifest is None:
        raise DestinationNotEmptyError(dst_name)
    # the writers of an interrupted run are gone (the manifest is this run's): their temporary
    # files are stale whatever their age
    remove_stale_temporaries(target, min_age_seconds=0)
    report = UnshardReport(src_name, dst_name, objects_before=hierarchy.n_stored)
    # what the interrupted runs finished (part of the whole job): chunk objects, bytes written, bytes read
    earlier = [
        sum(a.chunks for a in manifest.arrays.values()),
        sum(a.nbytes for a in manifest.arrays.values()),
        sum(a.nbytes_read for a in manifest.arrays.values()),
    ]
    out = _Out(target)
    meta: list[str] = [
        k
        for k in hierarchy.group_keys
        if k.rpartition("/")[2] in META_NAMES and not _v3_node(source, k) and not _deleted(nodes, hierarchy, k)
    ]
    plain: list[str] = [k for k in hierarchy.group_keys if k.rpartition("/")[2] not in META_NAMES]
    with (
        closing(out),  # its writer threads end with the run, whatever stops it
        tqdm(
            total=len(hierarchy.keys), disable=not progress, file=sys.stderr, unit="obj", desc="shardkv unshard"
        ) as bar,
    ):
        for path, keys in hierarchy.arrays.items():
            report.arrays += 1
            arr = nodes.node(path).array
            array_meta = [
                k
                for k in keys.meta_keys
                if not (arr is not None and k.rpartition("/")[2] == "zarr.json") and not _deleted(nodes, hierarchy, k)
            ]
            meta += array_meta
            data = [k for k in keys.all_keys() if k not in keys.meta_keys]
            if arr is None:
                plain += data
                continue
            report.unsharded_arrays += 1
            # a directory where a shard should be is not listed: read, it fails naming its key
            shard_keys = [k for k in data if arr.shard_coords_of(k) is not None] + shard_directories(source_kv, arr)
            shard_set = set(shard_keys)
            plain += [k for k in data if k not in shard_set]
            _unpack(source, arr, path, shard_keys, out, report, bar, manifest)
        report.bytes_before += _copy(source, plain, out, bar)
        out.flush()
        manifest.flush()
        out.close()
        out_meta = _Out(target, writers=1)  # in order, deepest first: a node's document before its parent's
        _copy(source, sorted(meta, key=lambda k: (-k.count("/"), k)), out_meta, bar)  # presented documents among them
        # the source's stored metadata: zarr.json (dropped) and v2 documents, not the presented ones
        stored_meta = [
            k
            for k in hierarchy.keys
            if k.rpartition("/")[2] in (*META_NAMES, "zarr.json") and k not in hierarchy.presented
        ]
        report.bytes_before += sum(sizes(source_kv, stored_meta).values())
        out_meta.flush()
        out_meta.close()
        _advance(bar, bar.total - bar.n)  # the zarr.json views, dropped, are done too
    manifest.remove()
    earlier_chunks, earlier_nbytes, earlier_nbytes_read = earlier
    report.chunks_skipped = earlier_chunks
    report.shards += report.shards_skipped
    report.chunks += earlier_chunks
    report.bytes_before += earlier_nbytes_read
    # the chunk objects of the skipped shards stay; every other object was written again by this run
    report.objects_after = out.objects + out_meta.objects + earlier_chunks
    report.bytes_after = out.nbytes + out_meta.nbytes + earlier_nbytes
    return report


def _deleted(nodes: NodeTable, hierarchy: Hierarchy, key: str) -> bool:
    """True for a ``.zarray``/``.zgroup`` presented from a ``zarr.json`` that records it as deleted.

    zarr-python 2 through :class:`shardkv.ShardedStore` does not see it
    (:func:`shardkv.metadata.hierarchy.with_deleted`), so the plain copy does not hold it;
    the node's ``.zattrs`` and chunks are copied as the proxy presents them.
    """
    if key not in hierarchy.presented:
        return False
    path, name = split_key(key)
    return name in nodes.node(path).deleted


def _v3_node(source: HierarchyView, key: str) -> bool:
    """True for the ``zarr.json`` of a node presented in v2 (dropped: the result is plain Zarr v2)."""
    path, _, name = key.rpartition("/")
    return name == "zarr.json" and bool(source.documents(path))


def _unpack(
    source: HierarchyView,
    arr: ShardedArray,
    path: str,
    shard_keys: Sequence[str],
    out: _Out,
    report: UnshardReport,
    bar: Any,
    manifest: Manifest,
) -> None:
    """Write every present in-grid inner chunk of the shards of one array to its own chunk key.

    A shard is recorded in ``manifest`` once its chunks are written; shards recorded by an
    earlier run are skipped.
    """
    grid, cps = arr.chunk_grid_shape, arr.chunks_per_shard
    if grid is None or cps is None:
        raise UnsupportedError(f"{path or '/'}: a sharded array without a chunk grid or chunks per shard")
    shard_grid = tuple(-(-g // n) for g, n in zip(grid, cps, strict=True))

    def index_of(key: str) -> int:
        return shard_index(arr.shard_coords_of(key), shard_grid)  # type: ignore[arg-type]

    todo = [k for k in shard_keys if not manifest.is_done(path, index_of(k))]
    report.shards_skipped += len(shard_keys) - len(todo)
    _advance(bar, len(shard_keys) - len(todo))
    for start in range(0, len(todo), _SHARD_BATCH):
        batch = todo[start : start + _SHARD_BATCH]
        blobs = source.kv.values(batch)
        finished: list[tuple[str, int, int, int]] = []  # shard key, bytes read, chunks and bytes written
        for key in batch:
            blob = blobs.get(key)
            if blob is None:
                continue  # deleted since the listing
            n_chunks = n_bytes = 0
            report.shards += 1
            report.bytes_before += len(blob)
            index = arr.layout.index_of_shard(blob, key)
            shard_coords = arr.shard_coords_of(key)
            view = memoryview(blob)
            for local in index.present():
                coords = tuple(s * n + c for s, n, c in zip(shard_coords, cps, local, strict=True))  # type: ignore[arg-type]
                if any(c >= g for c, g in zip(coords, grid, strict=True)):
                    report.out_of_grid_chunks += 1
                    continue
                offset, nbytes = index.get(local)  # type: ignore[misc]
                out.put(arr.chunk_key(coords), bytes(view[offset : offset + nbytes]))
                report.chunks += 1
                n_chunks += 1
                n_bytes += nbytes
            finished.append((key, len(blob), n_chunks, n_bytes))
        out.flush()  # the shards' chunks are stored: only now are the shards finished
        for key, nbytes_read, n_chunks, n_bytes in finished:
            manifest.record(path, index_of(key), key, n_bytes, nbytes_read, chunks=n_chunks)
        _advance(bar, len(batch))


def _copy(source: HierarchyView, keys: Sequence[str], out: _Out, bar: Any) -> int:
    """Copy keys as they are, a batch at a time; returns the bytes read."""
    nbytes = 0
    for start in range(0, len(keys), _WRITE_BATCH):
        batch = list(keys[start : start + _WRITE_BATCH])
        values = source.values(batch)
        for k in batch:
            if k in values:
                value = bytes(values[k])
                nbytes += len(value)
                out.put(k, value)
        _advance(bar, len(batch))
    return nbytes


def _advance(bar: Any, n: int) -> None:
    """Move the bar ``n`` steps; the step that completes it is left to its close, which shows 100 % (once)."""
    if bar.total is not None and bar.n + n >= bar.total:
        bar.n = bar.total
    else:
        bar.update(n)
