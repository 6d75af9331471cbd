"""``shardkv unshard --zarr-format 3``: a sharded Zarr v3 hierarchy back to plain Zarr v3, chunks as stored.

Each sharded array is written as zarr-python 3 writes an array by default:
one object per chunk under the ``default`` chunk key encoding (``c/0/0``),
its ``zarr.json`` the sharded one with the inner chunk shape as the chunk
grid and the inner codecs as the array's codecs
(:func:`shardkv.metadata.v3_source.plain_document`); every inner chunk's
bytes are written as stored (never decoded), those outside the chunk grid
are skipped and counted. Unsharded arrays, group documents (their
consolidated blocks brought in step) and every other key are copied;
metadata is written last. An interrupted run resumes as ``unshard`` does
(the same progress manifest, each shard recorded once its chunks are stored).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from shardkv.cli.convert.listing import iter_array_keys
from shardkv.cli.convert.tasks import shard_index
from shardkv.cli.convert.v3_listing import walk_v3
from shardkv.cli.errors import DestinationNotEmptyError
from shardkv.cli.manifest import UNSHARD_MANIFEST_KEY, Manifest, open_destination
from shardkv.cli.view import HierarchyView
from shardkv.errors import UnsupportedError
from shardkv.keys.paths import join_path, path_prefix
from shardkv.metadata.documents import dump_json
from shardkv.metadata.hierarchy import ZARR_JSON
from shardkv.metadata.v3_source import PLAIN_KEYS, ArraySource, plain_document, refresh_consolidated, source_of
from shardkv.proxy.verify import remove_stale_temporaries
from shardkv.storage.kv import KVStore

__all__ = ["unshard_v3"]

_SHARD_BATCH = 16  # shards read per batched request
_COPY_BATCH = 256  # keys copied per batched read


class _Sink(Protocol):
    """The batched, counted writes of :mod:`shardkv.cli.unshard` (its ``_Out``)."""

    objects: int
    nbytes: int

    def put(self, key: str, value: bytes) -> None: ...

    def flush(self) -> None: ...


Report = TypeVar("Report", bound=Any)


def unshard_v3(
    source_kv: KVStore, target: KVStore, report: Report, out: _Sink, overwrite: bool, progress: bool
) -> Report:
    """Copy the sharded v3 hierarchy in ``source_kv`` into ``target`` as plain Zarr v3 (see the module docstring).

    ``report`` (a :class:`shardkv.cli.unshard.UnshardReport`, its ``src`` and
    ``dst`` set) is filled and returned; ``out`` writes to ``target``.

    Raises
    ------
    NotAHierarchyError
        If the source has no ``zarr.json`` at its root.
    DestinationNotEmptyError, ManifestMismatchError
        As :func:`shardkv.cli.unshard.unshard`.
    CorruptShardError, ChecksumError
        If a shard cannot be decoded.
    """
    from tqdm import tqdm

    source = HierarchyView(source_kv, present=False)
    walk = walk_v3(source, report.src)
    options = {"unshard": 1, "zarr_format": 3}
    manifest = open_destination(target, report.dst, report.src, options, overwrite, key=UNSHARD_MANIFEST_KEY)
    if manifest is None:
        raise DestinationNotEmptyError(report.dst)
    remove_stale_temporaries(target, min_age_seconds=0)  # the writers of an interrupted run are gone
    earlier = sum(a.chunks for a in manifest.arrays.values()), sum(a.nbytes for a in manifest.arrays.values())
    meta: dict[str, bytes] = {}
    changed: dict[str, dict[str, Any]] = {}
    with tqdm(disable=not progress, file=sys.stderr, unit="obj", desc="shardkv unshard") as bar:
        for path, doc in walk.arrays.items():
            report.arrays += 1
            meta_key = join_path(path, ZARR_JSON)
            try:
                array = source_of(doc, path)
            except UnsupportedError:
                array = None
            keys = (k for k in iter_array_keys(source, path) if k != meta_key)
            if array is None or array.sharding is None:
                meta[meta_key] = walk.stored[meta_key]
                report.bytes_before += _copy(source, list(keys), out, bar)
                continue
            report.unsharded_arrays += 1
            changed[path] = plain_document(doc, array)
            meta[meta_key] = dump_json(changed[path], key=meta_key)
            _unpack(source, array, list(keys), out, report, bar, manifest)
        report.bytes_before += _copy(source, walk.group_keys, out, bar)
        out.flush()
        manifest.flush()
        for path, doc in walk.groups.items():
            key = join_path(path, ZARR_JSON)
            new_doc = refresh_consolidated(doc, path, changed)
            meta[key] = walk.stored[key] if new_doc == doc else dump_json(new_doc, key=key)
        for key in sorted(meta, key=lambda k: (-k.count("/"), k)):  # deepest first, the root's last
            out.put(key, meta[key])
        out.flush()
    manifest.remove()
    report.chunks_skipped = earlier[0]
    report.shards += report.shards_skipped
    report.chunks += earlier[0]
    report.objects_before = report.shards + len(walk.arrays) + len(walk.groups) + len(walk.group_keys)
    report.objects_after = out.objects + earlier[0]
    report.bytes_after = out.nbytes + earlier[1]
    return report


def _copy(source: HierarchyView, keys: Sequence[str], out: _Sink, bar: Any) -> int:
    """Copy keys as they are, a batch at a time; returns the bytes read."""
    nbytes = 0
    for start in range(0, len(keys), _COPY_BATCH):
        batch = list(keys[start : start + _COPY_BATCH])
        for key, value in source.values(batch).items():
            nbytes += len(value)
            out.put(key, bytes(value))
        bar.update(len(batch))
    return nbytes


def _unpack(
    source: HierarchyView,
    array: ArraySource,
    keys: list[str],
    out: _Sink,
    report: Any,
    bar: Any,
    manifest: Manifest,
) -> None:
    """Write the in-grid inner chunks of one array's shards to plain keys; other keys are copied."""
    shards = array.shards()
    if shards is None or shards.shard_grid_shape is None or shards.chunk_grid_shape is None:
        raise UnsupportedError(f"{array.path or '/'}: not a sharded array")
    grid, cps, shard_grid = shards.chunk_grid_shape, shards.chunks_per_shard, shards.shard_grid_shape
    prefix = path_prefix(array.path)
    shard_keys = [k for k in keys if shards.shard_coords_of(k) is not None]
    report.bytes_before += _copy(source, sorted(set(keys) - set(shard_keys)), out, bar)

    def index_of(key: str) -> int:
        return shard_index(shards.shard_coords_of(key), shard_grid)  # type: ignore[arg-type]

    todo = [k for k in shard_keys if not manifest.is_done(array.path, index_of(k))]
    report.shards_skipped += len(shard_keys) - len(todo)
    for start in range(0, len(todo), _SHARD_BATCH):
        batch = todo[start : start + _SHARD_BATCH]
        blobs = source.kv.values(batch)
        finished: list[tuple[str, int, int, int]] = []
        for key in batch:
            blob = blobs.get(key)
            if blob is None:
                continue  # deleted since the listing
            report.shards += 1
            report.bytes_before += len(blob)
            view = memoryview(blob)
            n_chunks = n_bytes = 0
            shard_coords = shards.shard_coords_of(key) or ()
            for local, offset, nbytes in shards.layout.index_of_shard(blob, key).stored_entries():
                coords = tuple(s * n + c for s, n, c in zip(shard_coords, cps, local, strict=True))
                if any(c >= g for c, g in zip(coords, grid, strict=True)):
                    report.out_of_grid_chunks += 1
                    continue
                out.put(prefix + PLAIN_KEYS.encode(coords), bytes(view[offset : offset + nbytes]))
                n_chunks += 1
                n_bytes += nbytes
            report.chunks += n_chunks
            finished.append((key, len(blob), n_chunks, n_bytes))
        out.flush()  # the shards' chunks are stored: only now are the shards finished
        for key, nbytes_read, n_chunks, n_bytes in finished:
            manifest.record(array.path, index_of(key), key, n_bytes, nbytes_read, chunks=n_chunks)
        bar.update(len(batch))
