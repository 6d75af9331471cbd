"""The conversion of a Zarr v3 hierarchy: the steps of :class:`~shardkv.cli.convert.run._Job` for v3 nodes.

The run (manifest, resume, tasks, workers, progress, batched writes) is the
v2 conversion's; what differs is the source model:

* nodes are found from ``zarr.json`` documents (:func:`~shardkv.cli.convert.v3_listing.walk_v3`),
  chunks by each array's ``chunk_key_encoding`` (``default`` with ``/`` or ``.``, ``v2``);
* an unsharded array's chunks become inner chunks, an already sharded array's
  inner chunks move to shards of the new shape, located through the source
  shard indexes (:class:`~shardkv.cli.convert.tasks.ShardTask` ``source_shards``);
  the documents say so (:func:`shardkv.metadata.v3_source.sharded_document`),
  the chunk key encoding names the shards as it named the chunks;
* arrays whose chunks cannot move as stored (0-d, codecs on whole shards,
  storage transformers, another grid) are copied as they are, with the reason;
* groups keep their documents, consolidated blocks brought in step with the
  arrays' new documents (:func:`shardkv.metadata.v3_source.refresh_consolidated`);
* the output check: zarr-python 3 opening the root reaches every node it
  reaches in the source (:func:`shardkv.metadata.all_v3.zarr3_unreachable`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from shardkv.cli.convert.listing import iter_array_keys
from shardkv.cli.convert.plan import UNMOVABLE, Plan
from shardkv.cli.convert.report import ArrayReport
from shardkv.cli.convert.run import _copy, _Job
from shardkv.cli.convert.tasks import ShardTask
from shardkv.cli.convert.v3_listing import V3Walk, list_v3_array, walk_v3
from shardkv.cli.errors import ConversionIncompleteError
from shardkv.cli.manifest import Manifest
from shardkv.cli.view import sizes
from shardkv.errors import UnsupportedError
from shardkv.format.layout import ShardLayout
from shardkv.keys.paths import join_path
from shardkv.keys.space import grid_shape
from shardkv.metadata.all_v3 import zarr3_unreachable
from shardkv.metadata.documents import dump_json, load_json
from shardkv.metadata.hierarchy import ZARR_JSON, group_paths
from shardkv.metadata.v3_source import ArraySource, refresh_consolidated, sharded_document, source_of

__all__ = ["V3Job"]


class V3Job(_Job):
    """One conversion of a Zarr v3 hierarchy (see the module docstring)."""

    _sources: dict[str, ArraySource]
    _changed: dict[str, dict[str, Any]]

    def _survey(self) -> tuple[V3Walk, dict[str, Plan], dict[str, tuple[tuple[int, ...], tuple[int, ...] | None]]]:
        walk = walk_v3(self.source, self.src_name)
        self._sources, self._changed = {}, {}
        plans: dict[str, Plan] = {}
        grids: dict[str, tuple[tuple[int, ...], tuple[int, ...] | None]] = {}
        for path, doc in walk.arrays.items():
            try:
                source = source_of(doc, path)
            except UnsupportedError as exc:
                plans[path], grids[path] = (None, f"{UNMOVABLE}{exc}"), ((), None)
                continue
            self._sources[path] = source
            plans[path] = self._plan(source)
            grids[path] = (grid_shape(source.shape, source.chunks), plans[path][0])
        return walk, plans, grids

    def _plan(self, source: ArraySource) -> Plan:
        ndim = len(source.shape)
        if ndim == 0:
            return None, "0-d"
        if isinstance(self.cps, int):
            return (self.cps,) * ndim, None
        if len(self.cps) != ndim:
            spec = ",".join(str(c) for c in self.cps)
            return None, f"{ndim}-d; chunks_per_shard {spec} is for {len(self.cps)}-d arrays"
        return tuple(self.cps), None

    def _tasks(
        self,
        walk: V3Walk,
        plans: Mapping[str, Plan],
        manifest: Manifest,
        meta_out: dict[str, bytes],
        bar: Any,
        task_chunks: int,
        n_last: int,
    ) -> Iterator[ShardTask]:
        for path, doc in walk.arrays.items():
            meta_key = join_path(path, ZARR_JSON)
            self.objects_before += 1
            self.bytes_before += len(walk.stored[meta_key])
            self.report.metadata_bytes_before += len(walk.stored[meta_key])
            array_cps, reason = plans[path]
            source = self._sources.get(path)
            if array_cps is None or source is None:
                meta_out[meta_key] = walk.stored[meta_key]
                n, nbytes = _copy(
                    self.source, (k for k in iter_array_keys(self.source, path) if k != meta_key), self.writer
                )
                self.objects_before += n
                self.bytes_before += nbytes
                ndim = len(doc.get("shape") or ())
                self.report.arrays.append(ArrayReport(path, ndim, None, reason, n, 0, 0, "/", False))
                bar.update(self.bar_plan.array(path))
                continue
            listing, n_objects = list_v3_array(self.source, source)
            self.objects_before += n_objects + len(listing.other_keys) + len(listing.stale_keys)
            if (source_shards := source.shards()) is not None:  # chunks count as read; their shards' indexes here
                self.bytes_before += n_objects * source_shards.layout.index_nbytes
            layout = ShardLayout.v3(array_cps, self.index_location, "little", self.index_checksum)
            self.bytes_before += sum(sizes(self.source.kv, listing.stale_keys).values())
            n_stale = len(listing.stale_keys)
            report = ArrayReport(
                path, len(source.shape), array_cps, None, listing.n_chunks, n_stale, 0, listing.separator, False
            )
            self.report.arrays.append(report)
            self._reports[path] = report
            self._resume(manifest, listing, layout, report, n_last)
            _, nbytes = _copy(self.source, listing.other_keys, self.writer)
            self.bytes_before += nbytes
            new_doc = sharded_document(doc, source, layout)
            self._changed[path] = new_doc
            meta_out[meta_key] = dump_json(new_doc, key=meta_key)
            base = {
                **self.base,
                "chunks_per_shard": array_cps,
                "write_batch_nbytes": self.writer.max_nbytes,
                "write_batch_objects": self.writer.max_objects,
                "source_shards": source.shards(),
            }
            yield from self._shard_tasks(listing, array_cps, base, task_chunks, manifest, bar, path)

    def _copy_groups(self, walk: V3Walk, meta_out: dict[str, bytes]) -> None:  # type: ignore[override]
        self.objects_before += len(walk.group_keys) + len(walk.groups)
        _, nbytes = _copy(self.source, walk.group_keys, self.writer)
        self.bytes_before += nbytes
        for path, doc in walk.groups.items():
            key = join_path(path, ZARR_JSON)
            self.bytes_before += len(walk.stored[key])
            self.report.metadata_bytes_before += len(walk.stored[key])
            new_doc = refresh_consolidated(doc, path, self._changed)
            meta_out[key] = walk.stored[key] if new_doc == doc else dump_json(new_doc, key=key)

    def _store_metadata(self, meta_out: dict[str, bytes]) -> None:
        # the documents are written as made: v3 all the way down already
        self.report.metadata_bytes_after = sum(len(v) for v in meta_out.values())

    def _check_output(self, walk: V3Walk) -> None:  # type: ignore[override]
        """zarr-python 3 opening the output's root reaches every node it reaches in the source's.

        Raises
        ------
        ConversionIncompleteError
            Naming the nodes missing or not reached.
        """
        nodes = [*walk.arrays, *walk.groups]
        before = {join_path(p, ZARR_JSON): d for p, d in (*walk.arrays.items(), *walk.groups.items())}
        paths = sorted({g for p in nodes for g in group_paths(p)} | set(nodes))
        keys = [join_path(p, ZARR_JSON) for p in paths]
        after = {k: load_json(k, v) for k, v in self.target.values(keys).items()}
        missing = [p or "/" for p in nodes if join_path(p, ZARR_JSON) not in after]
        if missing:
            raise ConversionIncompleteError(self.dst_name, missing)
        if len(self.report.arrays) != len(walk.arrays):
            raise ConversionIncompleteError(
                self.dst_name, sorted(set(walk.arrays) - {a.path for a in self.report.arrays}), "arrays"
            )
        unreached_before = zarr3_unreachable(before, walk.arrays, walk.groups)
        unreached = zarr3_unreachable(after, walk.arrays, walk.groups)
        hidden = sorted(p or "/" for p, why in unreached.items() if p not in unreached_before and not why.opaque)
        if hidden:
            raise ConversionIncompleteError(
                self.dst_name, hidden, "arrays or groups (zarr-python 3 does not reach them)"
            )
        self.report.zarr2_only = {p or "/": why.reason for p, why in sorted(unreached.items())}
        self.report.v3_root = True
