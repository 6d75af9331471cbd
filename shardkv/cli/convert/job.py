"""The run of ``shardkv convert`` (:func:`convert`): pack every array of a Zarr v2 hierarchy into shards.

Chunks are moved as stored: their bytes are never decoded or re-encoded,
only placed side by side in shards (v1.0 ``sharding_indexed`` layout, see
:class:`shardkv.format.layout.ShardLayout`). The result is exactly what
:class:`shardkv.ShardedStore` would have written had the arrays been created
through it: the same shards under the same keys and the same documents
(:func:`shardkv.cli.convert.meta.store_as_v3`). Each sharded array is stored
as a Zarr v3 array and nothing else (its ``zarr.json``, attributes inside, no
``.zarray``/``.zattrs``); the hierarchy is then v3 all the way down, as the
proxy keeps it: every group a v3 group, every unsharded array a ``zarr.json``
mirror beside its kept ``.zarray``/``.zattrs``, and a consolidated
``.zmetadata`` that zarr-python 2 without shardkv cannot misread.

Rules
-----
* ``chunks_per_shard`` as an int applies along every dimension of every
  array; as a tuple it applies to arrays with that many dimensions only, and
  the others are copied unsharded (the report says which and why). A tuple
  that fits no array at all is an error
  (:class:`~shardkv.cli.errors.ChunksPerShardMismatchError`) unless
  ``skip_mismatched``. 0-d arrays and arrays that are already sharded are
  copied unsharded too.
* Chunk keys outside an array's chunk grid (stale chunks) are skipped and
  counted; every other key of an array (its metadata, unknown files) and every
  key outside the arrays is copied as it is. Unsharded arrays are copied verbatim.
* An array whose ``.zarray`` names no ``dimension_separator`` but whose chunks
  are stored at ``/``-separated keys (zarr-python's ``NestedDirectoryStore``)
  is detected from its keys (:func:`shardkv.cli.info.detect_separator`); its
  destination ``.zarray`` then says ``"dimension_separator": "/"``, so any
  reader finds the shards (and consolidated ``.zmetadata`` says the same).
* Metadata is written last, so an interrupted conversion leaves no array that
  looks complete.

* Shards are written by shard-aligned tasks (:mod:`shardkv.cli.convert.tasks`),
  here or in parallel (``workers``, ``scheduler``); a progress manifest
  (:mod:`shardkv.cli.manifest`) in the destination lets the same conversion,
  run again after an interruption, skip the shards already finished.

Memory: the source is listed lazily, array by array
(:mod:`shardkv.cli.convert.listing`: groups walked directory by directory, an
array's keys streamed once into a bitmap of one bit per chunk-grid position),
never held as a list of keys; tasks are made one shard at a time and at most
a few per worker are in flight (:func:`shardkv.cli.convert.tasks.execute`);
one shard's chunks are read with one batched ``get_many``; finished shards are
written in batches; other keys are copied ``_COPY_BATCH_KEYS`` at a time; the
progress manifest keeps a bit per shard. Peak memory is bounded by the shards
in flight, not by the number of chunks.

Nothing is dropped: an array whose sharded form shardkv could not
read back (an object dtype, for example) is copied unsharded, a node named
like shardkv's own files is refused
(:class:`~shardkv.cli.errors.ReservedNameError`), and the finished output is
checked to present every array and group of the source to zarr-python 2
through shardkv and to zarr-python 3 opening the root
(:func:`shardkv.metadata.all_v3.zarr3_unreachable`), except the arrays no v3
reader decodes, which the report names
(:class:`~shardkv.cli.errors.ConversionIncompleteError` otherwise).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from shardkv.cli.convert.listing import ArrayListing, HierarchyWalk, iter_array_keys, list_array, walk_hierarchy
from shardkv.cli.convert.meta import amend_consolidated, array_metadata, metadata_order, store_as_v3
from shardkv.cli.convert.plan import ChunksPerShard, check_fit, plan_array, warn_nothing_gained
from shardkv.cli.convert.progress import BarPlan
from shardkv.cli.convert.report import ArrayReport, ConvertReport
from shardkv.cli.convert.tasks import ShardTask, TaskResult, array_tasks, execute, shard_members_at
from shardkv.cli.errors import ConversionIncompleteError, DestinationNotEmptyError, SameLocationError
from shardkv.cli.info_draft import is_draft
from shardkv.cli.info_model import shard_stats
from shardkv.cli.manifest import MANIFEST_KEY as _MANIFEST_KEY
from shardkv.cli.manifest import Manifest, open_destination, verify_last
from shardkv.cli.stores import open_store, put_all, refuse_regular_file
from shardkv.cli.view import HierarchyView, sizes
from shardkv.errors import ConfigurationError
from shardkv.format.layout import IndexLocation, ShardLayout
from shardkv.keys.encodings import grid_shape
from shardkv.keys.paths import join_path, split_key
from shardkv.metadata.all_v3 import zarr3_unreachable
from shardkv.metadata.chunks_per_shard import check_chunks_per_shard
from shardkv.metadata.documents import META_NAMES, load_json
from shardkv.metadata.hierarchy import ZARR_JSON, group_paths
from shardkv.proxy.nodes import NodeTable
from shardkv.proxy.verify import remove_stale_temporaries
from shardkv.storage.kv import KVStore

__all__ = [
    "ChunksPerShard",
    "ArrayReport",
    "ConvertReport",
    "DestinationNotEmptyError",
    "SameLocationError",
    "parse_chunks_per_shard",
    "check_chunks_per_shard",
    "convert",
]

_WRITE_BATCH_NBYTES = 64 * 2**20  # bytes of finished shards / copied objects held before one batched write
_WRITE_BATCH_OBJECTS = 64  # objects held before one batched write
_COPY_BATCH_KEYS = 32  # keys copied as they are per batched read + write
TASK_CHUNKS = 256  # source chunks per shard-aligned task (whole shards; at least one shard)
_VERIFY_LAST = 4  # finished shards read back before a resumed run skips them (x workers)


# -- options ---------------------------------------------------------------


def parse_chunks_per_shard(text: str) -> ChunksPerShard:
    """Parse the command line's ``--chunks-per-shard``: ``"4"`` -> 4, ``"2,2,1"`` -> (2, 2, 1).

    Raises
    ------
    ConfigurationError
        If ``text`` is not one int >= 1 or a comma-separated list of them.
    """
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isascii() and p.isdigit() for p in parts):
        raise ConfigurationError(
            f"expected an int >= 1 or a comma-separated list of ints >= 1 (like 2,2,1), got {text!r}"
        )
    values = tuple(int(p) for p in parts)
    if any(v < 1 for v in values):
        raise ConfigurationError(f"chunks per shard must be >= 1, got {text!r}")
    return values[0] if len(values) == 1 and "," not in text else values


# -- I/O helpers -----------------------------------------------------------------


class _Writer:
    """Batched writes to the destination, with counts of objects and bytes written."""

    def __init__(self, store: KVStore, max_nbytes: int, max_objects: int) -> None:
        self.store = store
        self.max_nbytes = max_nbytes
        self.max_objects = max_objects
        self.pending: dict[str, bytes] = {}
        self.pending_nbytes = 0
        self.objects = 0
        self.nbytes = 0

    def put(self, key: str, value: bytes) -> None:
        if key in self.pending:
            raise ConfigurationError(f"two source objects map to the destination key {key!r}")
        self.pending[key] = value
        self.pending_nbytes += len(value)
        if self.pending_nbytes >= self.max_nbytes or len(self.pending) >= self.max_objects:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        put_all(self.store, self.pending)
        self.objects += len(self.pending)
        self.nbytes += self.pending_nbytes
        self.pending = {}
        self.pending_nbytes = 0


def _name(store: Any) -> str:
    return store if isinstance(store, str) else repr(store) if not hasattr(store, "__fspath__") else str(store)


def _check_distinct(src: KVStore, dst: KVStore, src_name: str, dst_name: str) -> None:
    """Refuse a source and destination that are one store, or of which one lies inside the other.

    Raises
    ------
    SameLocationError
    """
    a, b = src.location, dst.location
    if src is dst or (a.namespace == b.namespace and a.root.rstrip("/") == b.root.rstrip("/")):
        raise SameLocationError(f"source and destination are the same store ({src_name})")
    if a.namespace != b.namespace:
        return
    ra, rb = a.root.rstrip("/"), b.root.rstrip("/")
    if not ra or not rb or rb.startswith(ra + "/") or ra.startswith(rb + "/"):
        raise SameLocationError(f"source {src_name} and destination {dst_name} overlap (one lies inside the other)")


def _stores_v2_arrays(source: KVStore) -> bool:
    """A Zarr v2 root, or a hierarchy shardkv stored as v3 (arrays with the ``v2`` chunk key encoding)."""
    if source.values([".zgroup", ".zarray"]):
        return True
    view = HierarchyView(source)
    paths = [k.rpartition("/")[0] for k in source.list_prefix("") if k.rpartition("/")[2] == "zarr.json"]
    nodes = view.nodes(paths).values()
    return any(
        ((n.doc or {}).get("chunk_key_encoding") or {}).get("name") == "v2" and ".zarray" in n.documents for n in nodes
    )


def _copy(src: HierarchyView, keys: Iterator[str] | Sequence[str], writer: _Writer) -> tuple[int, int]:
    """Copy keys as they are, a batch at a time (``keys`` taken lazily); returns (keys, bytes) read."""
    n = nbytes = 0
    it = iter(keys)
    while True:
        batch = [k for _, k in zip(range(_COPY_BATCH_KEYS), it, strict=False)]
        if not batch:
            return n, nbytes
        values = src.values(batch)
        for k in batch:
            if k in values:  # a key deleted since the listing is not copied
                value = bytes(values[k])
                nbytes += len(value)
                n += 1
                writer.put(k, value)


# -- the conversion ----------------------------------------------------------------


def convert(
    src: Any,
    dst: Any,
    chunks_per_shard: ChunksPerShard | Sequence[int],
    index_location: IndexLocation = "end",
    index_checksum: bool = True,
    progress: bool = False,
    *,
    overwrite: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    src_storage_options: Mapping[str, Any] | None = None,
    dst_storage_options: Mapping[str, Any] | None = None,
    skip_mismatched: bool = False,
    workers: int = 1,
    scheduler: str | None = None,
    task_chunks: int = TASK_CHUNKS,
    all_v3: bool = False,
) -> ConvertReport:
    """Copy a Zarr v2 hierarchy, packing the chunks of its arrays into shards.

    Parameters
    ----------
    src, dst : str, os.PathLike, MutableMapping or fsspec.FSMap
        Source hierarchy and destination (an fsspec URL, a local path, or a
        store :func:`shardkv.storage.open.open_kv` accepts). ``dst`` must be
        empty, or hold the progress manifest of the same conversion (resumed).
    chunks_per_shard : int or sequence of int
        Inner chunks per shard: an int for every dimension of every array, or
        one value per dimension for the arrays with that many dimensions
        (others are copied unsharded; fitting none is an error).
    index_location : {"end", "start"}
        Where each shard keeps its index (v1.0 codec ``index_location``).
    index_checksum : bool
        Whether shard indexes carry a CRC32C (``crc32c`` index codec).
    progress : bool
        Show a tqdm progress bar on stderr.
    overwrite : bool
        Delete everything in ``dst`` first instead of refusing a non-empty ``dst``
        (a local ``dst`` that is a regular file is always refused).
    all_v3 : bool
        Describe the hierarchy in v3 even when no array is sharded (every array and group gets a
        ``zarr.json`` beside its kept v2 documents); once an array is sharded it is anyway.
    storage_options : mapping, optional
        fsspec options for both URLs; ``src_storage_options`` /
        ``dst_storage_options`` replace them for one side.
    skip_mismatched : bool
        Copy the arrays unsharded even when a ``chunks_per_shard`` tuple fits none of them.
    workers : int
        Local processes writing shards (1: this process). They are started the
        ``spawn`` way: call from under ``if __name__ == "__main__":`` in a script.
    scheduler : str, optional
        Address of a dask.distributed scheduler whose workers write the shards.
    task_chunks : int
        Source chunks per shard-aligned task (whole shards, at least one).

    Returns
    -------
    ConvertReport
        Arrays sharded and copied, chunks, stale chunks, objects and bytes before and after,
        shards skipped by a resumed run, the arrays zarr-python 3 does not read (``zarr2_only``).

    Raises
    ------
    ConfigurationError
        If ``chunks_per_shard``, ``index_location`` or ``workers`` is invalid, or a
        ``.zarray`` cannot be used.
    ChunksPerShardMismatchError
        If a ``chunks_per_shard`` tuple fits no array (and not ``skip_mismatched``).
    NotAHierarchyError
        If ``src`` is missing, empty or not a Zarr v2 hierarchy.
    DestinationNotEmptyError, DestinationIsFileError
        If ``dst`` holds keys (and no manifest of this conversion) and ``overwrite``
        is false; if ``dst`` is a regular file.
    ManifestMismatchError
        If ``dst`` holds the manifest of another conversion.
    SameLocationError
        If ``src`` and ``dst`` overlap.
    StoreAccessError
        If a store cannot be reached or used (endpoint, bucket, credentials).
    ConversionIncompleteError
        If the output lacks a node of the source, for zarr-python 2 through shardkv or for
        zarr-python 3 opening the root (arrays no v3 reader decodes excepted).
    """
    cps = check_chunks_per_shard(chunks_per_shard)
    ShardLayout((1,), index_location, "little", index_checksum)  # validates the options
    if workers < 1 or task_chunks < 1:
        raise ConfigurationError(f"workers and task_chunks must be >= 1, got {workers} and {task_chunks}")
    src_name, dst_name = _name(src), _name(dst)
    src_opts = dict(src_storage_options if src_storage_options is not None else storage_options or {})
    dst_opts = dict(dst_storage_options if dst_storage_options is not None else storage_options or {})
    if isinstance(dst, str):
        refuse_regular_file(dst)
    source_kv, target = open_store(src, src_opts, role="source"), open_store(dst, dst_opts, role="destination")
    _check_distinct(source_kv, target, src_name, dst_name)
    draft = is_draft(source_kv)
    if draft:  # a 2022 draft hierarchy gets the draft's sharding transformer
        from shardkv.cli.convert.draft import convert_draft

        if index_location != "end" or not index_checksum:
            raise ConfigurationError(
                f"{src_name} is a 2022 draft hierarchy: its shards use the draft's fixed 'indexed' layout "
                "(index at the end, no checksum), so --index-location start / --no-checksum do not apply"
            )
        if workers > 1 or scheduler is not None:
            raise ConfigurationError(
                f"{src_name} is a 2022 draft hierarchy: it is converted in one process "
                "(--workers / --scheduler apply to Zarr v2 sources)"
            )
        return convert_draft(
            source_kv,
            target,
            cps,
            progress,
            overwrite=overwrite,
            src_name=src_name,  # type: ignore[return-value]
            dst_name=dst_name,
        )
    # arrays already sharded (zarr.json only) appear with a .zarray
    source = HierarchyView(source_kv, present=_stores_v2_arrays(source_kv))
    remote = workers > 1 or scheduler is not None
    if remote and not (isinstance(src, str) and isinstance(dst, str)):
        raise ConfigurationError("workers and scheduler need the source and destination as paths or URLs")
    job = _Job(source, target, src_name, dst_name, cps, index_location, index_checksum, progress)
    job.all_v3 = all_v3
    job.base = dict(
        src=src_name,
        dst=dst_name,
        src_options=src_opts,
        dst_options=dst_opts,
        index_location=index_location,
        index_checksum=index_checksum,
    )
    return job.run(overwrite, skip_mismatched, workers, scheduler, task_chunks)


class _Job:
    """One conversion of a Zarr v2 hierarchy (state shared by its steps)."""

    def __init__(
        self,
        source: HierarchyView,
        target: KVStore,
        src_name: str,
        dst_name: str,
        cps: ChunksPerShard,
        index_location: str,
        index_checksum: bool,
        progress: bool,
    ) -> None:
        self.source, self.target = source, target
        self.src_name, self.dst_name = src_name, dst_name
        self.cps, self.index_location, self.index_checksum = cps, index_location, index_checksum
        self.progress = progress
        self.base: dict[str, Any] = {}
        self.all_v3 = False
        self.report = ConvertReport(src_name, dst_name)
        self.writer = _Writer(target, _WRITE_BATCH_NBYTES, _WRITE_BATCH_OBJECTS)
        self.bytes_before = self.objects_before = 0
        self.shard_objects = self.shard_bytes = 0
        self._reports: dict[str, ArrayReport] = {}  # sharded array path -> its report (filled as arrays are listed)
        self.bar_plan = BarPlan({}, {})  # the progress bar's steps (made once the arrays' metadata is read)

    def options(self) -> dict[str, Any]:
        """The options that shape the shards, as recorded in the manifest."""
        cps = self.cps if isinstance(self.cps, int) else list(self.cps)
        return {"chunks_per_shard": cps, "index_location": self.index_location, "index_checksum": self.index_checksum}

    def run(
        self, overwrite: bool, skip_mismatched: bool, workers: int, scheduler: str | None, task_chunks: int
    ) -> ConvertReport:
        from tqdm import tqdm

        source = self.source
        walk = walk_hierarchy(source, self.src_name)
        wanted = [join_path(p, n) for p in walk.arrays for n in sorted(META_NAMES)]
        meta = source.values(wanted)  # the arrays' documents (5 names per array), one batch
        plans = {
            p: plan_array(p, z, meta, self.cps, self.index_location, self.index_checksum)
            for p, z in walk.arrays.items()
        }
        check_fit(plans, self.cps, skip_mismatched)
        warn_nothing_gained(plans)
        flags = {"all_v3": self.all_v3, "skip_mismatched": skip_mismatched}
        manifest = open_destination(self.target, self.dst_name, self.src_name, self.options(), overwrite, flags=flags)
        if manifest is None:
            raise DestinationNotEmptyError(self.dst_name)
        self.report.workers = 0 if scheduler is not None else workers
        meta_out: dict[str, bytes] = {}
        amended: dict[str, dict[str, Any]] = {}  # array path -> .zarray with the detected separator
        # the writers of an interrupted run are gone (the manifest is this conversion's): their
        # temporary files are stale whatever their age
        remove_stale_temporaries(self.target, min_age_seconds=0)
        n_last = _VERIFY_LAST * max(workers, 1)
        grids = {p: (grid_shape(z["shape"], z["chunks"]), plans[p][0]) for p, z in walk.arrays.items()}
        self.bar_plan = BarPlan(grids, manifest.arrays, [(e[0], e[1]) for e in list(manifest.last)[-n_last:]])
        with tqdm(
            total=self.bar_plan.total,
            initial=self.bar_plan.initial,
            disable=not self.progress,
            file=sys.stderr,
            unit="chunk",
            desc="shardkv convert",
            mininterval=1.0,
        ) as bar:
            tasks = self._tasks(walk, meta, plans, manifest, meta_out, amended, bar, task_chunks, n_last)

            def on_done(task: ShardTask, result: TaskResult) -> None:
                array = self._reports[task.path]
                for index, key, nbytes, nbytes_read in result.written:
                    self._count(array, nbytes, nbytes_read)
                    manifest.record(task.path, index, key, nbytes, nbytes_read)
                bar.update(sum(self.bar_plan.shard(task.path, index) for index, _, _ in task.shards))

            execute(tasks, on_done, workers=workers, scheduler=scheduler, source=self.source.kv, target=self.target)
            manifest.flush()
            self._copy_groups(walk, meta_out)
            self.writer.flush()
            amend_consolidated(meta_out, amended)
            store_as_v3(meta_out, all_v3=self.all_v3)
            self.report.metadata_bytes_after = sum(len(v) for v in meta_out.values())
            for key in sorted(meta_out, key=metadata_order):
                self.writer.put(key, meta_out[key])
            self.writer.flush()
        self._check_output(walk)
        self.report.groups = len(walk.groups)
        manifest.remove()
        report = self.report
        report.arrays.sort(key=lambda a: a.path)
        report.objects_before = self.objects_before
        report.bytes_before = self.bytes_before
        report.objects_after = self.writer.objects + self.shard_objects
        report.bytes_after = self.writer.nbytes + self.shard_bytes
        return report

    def _tasks(
        self,
        walk: HierarchyWalk,
        meta: Mapping[str, bytes],
        plans: Mapping[str, tuple[tuple[int, ...] | None, str | None]],
        manifest: Manifest,
        meta_out: dict[str, bytes],
        amended: dict[str, dict[str, Any]],
        bar: Any,
        task_chunks: int,
        n_last: int,
    ) -> Iterator[ShardTask]:
        """The shard tasks of every array, made lazily; each array is listed when its turn comes."""
        for path, zarray in walk.arrays.items():
            array_meta = {k: meta[k] for k in (join_path(path, n) for n in sorted(META_NAMES)) if k in meta}
            self._count_metadata(array_meta)
            listing = list_array(self.source, path, zarray, list(array_meta))
            n_keys = listing.n_chunks + len(listing.stale_keys) + len(listing.other_keys)
            self.objects_before += n_keys
            array_cps, reason = plans[path]
            if array_cps is None:
                self._copy_unsharded(listing, array_meta, reason, meta_out)
                bar.update(self.bar_plan.array(path))
                continue
            layout = ShardLayout.v3(array_cps, self.index_location, "little", self.index_checksum)  # type: ignore[arg-type]
            report = ArrayReport(
                path,
                listing.ndim,
                array_cps,
                None,
                listing.n_chunks,
                len(listing.stale_keys),
                0,
                listing.separator,
                listing.separator_detected,
            )
            self.report.arrays.append(report)
            self._reports[path] = report
            self._resume(manifest, listing, layout, report, n_last)
            self.bytes_before += sum(sizes(self.source.kv, listing.stale_keys).values())
            _, nbytes = _copy(self.source, listing.other_keys, self.writer)
            self.bytes_before += nbytes
            meta_out.update(array_metadata(listing, array_meta, layout, amended))
            base = {
                **self.base,
                "chunks_per_shard": array_cps,
                "write_batch_nbytes": _WRITE_BATCH_NBYTES,
                "write_batch_objects": _WRITE_BATCH_OBJECTS,
            }
            yield from array_tasks(
                listing,
                array_cps,
                base,
                task_chunks,
                skip=lambda index, p=path: manifest.is_done(p, index),  # type: ignore[misc]
                on_skipped=lambda index, n_chunks, p=path: bar.update(self.bar_plan.shard(p, index)),  # type: ignore[misc]
                on_empty=lambda index, p=path: bar.update(self.bar_plan.shard(p, index)),  # type: ignore[misc]
            )

    def _resume(
        self, manifest: Manifest, listing: ArrayListing, layout: ShardLayout, report: ArrayReport, n_last: int
    ) -> None:
        """Count the shards of this array an earlier run finished, after reading back its last ones."""
        cps = layout.chunks_per_shard

        def complete(key: str, index: int, blob: bytes) -> bool:
            expected = len(shard_members_at(listing, tuple(cps), index))
            return layout.index_of_shard(blob, key).count_present() == expected

        self.report.shards_verified += verify_last(self.target, manifest, listing.path, n_last, complete)
        progress = manifest.arrays.get(listing.path)
        if progress is None or not progress.shards:
            return
        report.shards += progress.shards
        self.report.shards_skipped += progress.shards
        self.shard_objects += progress.shards
        self.shard_bytes += progress.nbytes
        self.bytes_before += progress.nbytes_read

    def _copy_unsharded(
        self,
        listing: ArrayListing,
        array_meta: Mapping[str, bytes],
        reason: str | None,
        meta_out: dict[str, bytes],
    ) -> None:
        meta_out.update({k: bytes(v) for k, v in array_meta.items()})
        prefix_len = len(listing.path) + 1 if listing.path else 0
        data = [k for k in iter_array_keys(self.source, listing.path) if k[prefix_len:] not in META_NAMES]
        _, nbytes = _copy(self.source, data, self.writer)
        self.bytes_before += nbytes
        report = ArrayReport(listing.path, listing.ndim, None, reason, listing.n_chunks, 0, 0, listing.separator, False)
        arr = NodeTable(self.source.kv.values).node(listing.path).array if reason == "already sharded" else None
        if arr is not None:  # its chunks are those its shards hold
            shards = [k for k in data if arr.shard_coords_of(k) is not None]
            grid = arr.chunk_grid_shape or ()
            report.chunks = shard_stats(self.source.kv, shards, arr.shard_coords_of, arr.layout, grid)[0]
            report.shards_copied = len(shards)
        self.report.arrays.append(report)

    def _copy_groups(self, walk: HierarchyWalk, meta_out: dict[str, bytes]) -> None:
        group_meta = [k for k in walk.group_keys if k.rpartition("/")[2] in META_NAMES]
        group_meta_set = set(group_meta)
        other = [k for k in walk.group_keys if k not in group_meta_set and k != _MANIFEST_KEY]
        self.objects_before += len(other)
        _, nbytes = _copy(self.source, other, self.writer)
        self.bytes_before += nbytes
        values = self.source.values(group_meta)
        self._count_metadata(values)
        meta_out.update({k: bytes(v) for k, v in values.items()})

    def _count_metadata(self, documents: Mapping[str, bytes]) -> None:
        """Count the stored ones among ``documents`` (not those presented from a ``zarr.json``) as source objects."""
        v3 = [k for k in documents if self.source.node(split_key(k)[0]) is not None]
        stored = {k: len(v) for k, v in documents.items() if k not in set(v3)}
        stored.update(sizes(self.source.kv, v3) if v3 else {})
        self.objects_before += len(stored)
        self.bytes_before += sum(stored.values())
        self.report.metadata_bytes_before += sum(stored.values())

    def _check_output(self, walk: HierarchyWalk) -> None:
        """Every array and group of the source is in the output for zarr 2 through shardkv and for zarr 3.

        zarr-python 2 through shardkv must find every node; zarr-python 3
        opening the root must reach every node too, except arrays no v3 reader
        decodes, which the report names with the reason (:attr:`ConvertReport.zarr2_only`).
        """
        out = HierarchyView(self.target)
        wanted = [join_path(p, ".zarray") for p in walk.arrays] + [join_path(p, ".zgroup") for p in walk.groups]
        missing = [k.rpartition("/")[0] or "/" for k in wanted if not out.contains(k)]
        if missing:
            raise ConversionIncompleteError(self.dst_name, missing)
        if len(self.report.arrays) != len(walk.arrays):
            raise ConversionIncompleteError(
                self.dst_name, sorted(set(walk.arrays) - {a.path for a in self.report.arrays}), "arrays"
            )
        nodes = [*walk.arrays, *walk.groups]
        paths = sorted({g for p in nodes for g in group_paths(p)} | set(nodes))
        keys = [join_path(p, n) for p in paths for n in (ZARR_JSON, ".zarray", ".zgroup")]
        documents = {k: load_json(k, v) for k, v in self.target.values(keys).items()}
        unreachable = zarr3_unreachable(documents, walk.arrays, walk.groups)
        hidden = sorted(p or "/" for p, why in unreachable.items() if not why.opaque)
        if hidden:
            raise ConversionIncompleteError(
                self.dst_name, hidden, "arrays or groups (zarr-python 3 does not reach them)"
            )
        self.report.zarr2_only = {p or "/": why.reason for p, why in sorted(unreachable.items())}
        self.report.v3_root = ZARR_JSON in documents

    def _count(self, array: ArrayReport, nbytes: int, nbytes_read: int) -> None:
        array.shards += 1
        self.shard_objects += 1
        self.shard_bytes += nbytes
        self.bytes_before += nbytes_read
