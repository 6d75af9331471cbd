"""The steps of one conversion of ``shardkv convert`` (:class:`_Job`), and its batched writes and copies.

:func:`shardkv.cli.convert.job.convert` checks the options, opens the stores
and runs a :class:`_Job` (a Zarr v2 source) or a
:class:`~shardkv.cli.convert.v3_job.V3Job` (a Zarr v3 source, the same run
with other steps): survey the source, open or resume the progress manifest,
make and run the shard tasks, copy the rest, write the metadata last, check
the output.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from typing import Any

from shardkv.cli.convert.listing import ArrayListing, HierarchyWalk, iter_array_keys, list_array, walk_hierarchy
from shardkv.cli.convert.meta import amend_consolidated, array_metadata, metadata_order, store_as_v3
from shardkv.cli.convert.plan import ChunksPerShard, Plan, check_fit, plan_array, warn_nothing_gained
from shardkv.cli.convert.progress import BarPlan
from shardkv.cli.convert.report import ArrayReport, ConvertReport
from shardkv.cli.convert.tasks import ShardTask, TaskResult, array_tasks, execute, shard_members_at
from shardkv.cli.errors import ConversionIncompleteError, DestinationNotEmptyError
from shardkv.cli.info_model import shard_stats
from shardkv.cli.manifest import MANIFEST_KEY as _MANIFEST_KEY
from shardkv.cli.manifest import Manifest, open_destination, verify_last
from shardkv.cli.stores import put_all
from shardkv.cli.view import HierarchyView, sizes
from shardkv.errors import ConfigurationError
from shardkv.format.layout import IndexLocation, ShardLayout
from shardkv.keys.paths import join_path, split_key
from shardkv.keys.space import grid_shape
from shardkv.metadata.all_v3 import zarr3_unreachable
from shardkv.metadata.documents import META_NAMES, load_json
from shardkv.metadata.hierarchy import ZARR_JSON, group_paths
from shardkv.storage.kv import KVStore
from shardkv.storage.local import LocalStore

_WRITE_BATCH_NBYTES = 64 * 2**20  # bytes of finished shards / copied objects held before one batched write
_WRITE_BATCH_OBJECTS = 64  # objects held before one batched write
_COPY_BATCH_KEYS = 32  # keys copied as they are per batched read + write
_VERIFY_LAST = 4  # finished shards read back before a resumed run skips them (x workers)


class _NoBar:
    """The progress bar when none is shown (tqdm is not imported for it)."""

    def update(self, n: int = 1) -> None:
        pass


def shard_passed(bar: Any, plan: BarPlan, path: str, index: int, n_chunks: int = 0) -> None:
    """Move the bar past shard ``index`` of ``path`` (skipped as done, or with no chunk to write)."""
    bar.update(plan.shard(path, index))


def _bar(show: bool, total: int, initial: int) -> Any:
    """A tqdm bar on stderr for the conversion's chunk-grid positions, or :class:`_NoBar` when ``show`` is false."""
    if not show:
        return contextlib.nullcontext(_NoBar())
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, file=sys.stderr, unit="chunk", desc="shardkv convert", mininterval=1.0)


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


class _Job:
    """One conversion of a Zarr v2 hierarchy (state shared by its steps)."""

    def __init__(
        self,
        source: HierarchyView,
        target: KVStore,
        src_name: str,
        dst_name: str,
        cps: ChunksPerShard,
        index_location: IndexLocation,
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
        self._meta: Mapping[str, bytes] = {}  # the source arrays' documents
        self._amended: dict[str, dict[str, Any]] = {}  # array path -> .zarray with the detected separator

    def options(self) -> dict[str, Any]:
        """The options that shape the shards, as recorded in the manifest."""
        cps = self.cps if isinstance(self.cps, int) else list(self.cps)
        return {"chunks_per_shard": cps, "index_location": self.index_location, "index_checksum": self.index_checksum}

    def run(
        self, overwrite: bool, skip_mismatched: bool, workers: int, scheduler: str | None, task_chunks: int
    ) -> ConvertReport:
        walk, plans, grids = self._survey()
        check_fit(plans, self.cps, skip_mismatched)
        warn_nothing_gained(plans)
        flags = {"all_v3": self.all_v3, "skip_mismatched": skip_mismatched}
        manifest = open_destination(self.target, self.dst_name, self.src_name, self.options(), overwrite, flags=flags)
        if manifest is None:
            raise DestinationNotEmptyError(self.dst_name)
        self.report.workers = 0 if scheduler is not None else workers
        meta_out: dict[str, bytes] = {}
        # the writers of an interrupted run are gone (the manifest is this conversion's): their
        # temporary files are stale whatever their age
        if isinstance(self.target, LocalStore):  # the one store with temporary files
            self.target.remove_stale_temporaries(0)
        n_last = _VERIFY_LAST * max(workers, 1)
        self.bar_plan = BarPlan(grids, manifest.arrays, [(e[0], e[1]) for e in list(manifest.last)[-n_last:]])
        with _bar(self.progress, self.bar_plan.total, self.bar_plan.initial) as bar:
            tasks = self._tasks(walk, plans, manifest, meta_out, bar, task_chunks, n_last)

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
            self._store_metadata(meta_out)
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

    def _survey(self) -> tuple[Any, dict[str, Plan], dict[str, tuple[tuple[int, ...], tuple[int, ...] | None]]]:
        """The source's nodes, a plan per array, and each array's chunk grid and chunks per shard (for the bar)."""
        walk = walk_hierarchy(self.source, self.src_name)
        wanted = [join_path(p, n) for p in walk.arrays for n in sorted(META_NAMES)]
        self._meta = self.source.values(wanted)  # the arrays' documents (5 names per array), one batch
        plans = {
            p: plan_array(p, z, self._meta, self.cps, self.index_location, self.index_checksum)
            for p, z in walk.arrays.items()
        }
        grids = {p: (grid_shape(z["shape"], z["chunks"]), plans[p][0]) for p, z in walk.arrays.items()}
        return walk, plans, grids

    def _store_metadata(self, meta_out: dict[str, bytes]) -> None:
        """Turn the documents copied and made into those the destination stores (in place)."""
        amend_consolidated(meta_out, self._amended)
        store_as_v3(meta_out, all_v3=self.all_v3)
        self.report.metadata_bytes_after = sum(len(v) for v in meta_out.values())

    def _tasks(
        self,
        walk: Any,
        plans: Mapping[str, Plan],
        manifest: Manifest,
        meta_out: dict[str, bytes],
        bar: Any,
        task_chunks: int,
        n_last: int,
    ) -> Iterator[ShardTask]:
        """The shard tasks of every array, made lazily; each array is listed when its turn comes."""
        meta, amended = self._meta, self._amended
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
            layout = ShardLayout.v3(array_cps, self.index_location, "little", self.index_checksum)
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
            yield from self._shard_tasks(listing, array_cps, base, task_chunks, manifest, bar, path)

    def _shard_tasks(
        self,
        listing: Any,
        array_cps: tuple[int, ...],
        base: dict[str, Any],
        task_chunks: int,
        manifest: Manifest,
        bar: Any,
        path: str,
    ) -> Iterator[ShardTask]:
        """One array's shard tasks; a shard done before, or with no chunk to write, moves the bar past it."""
        return array_tasks(
            listing,
            array_cps,
            base,
            task_chunks,
            skip=partial(manifest.is_done, path),
            on_skipped=partial(shard_passed, bar, self.bar_plan, path),
            on_empty=partial(shard_passed, bar, self.bar_plan, path),
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
        from shardkv.proxy.nodes import NodeTable

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
        v3 = {k for k in documents if self.source.node(split_key(k)[0]) is not None}
        stored = {k: len(v) for k, v in documents.items() if k not in v3}
        stored.update(sizes(self.source.kv, sorted(v3)) if v3 else {})
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
