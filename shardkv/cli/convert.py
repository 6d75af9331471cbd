"""``shardkv convert``: pack every array of a Zarr v2 hierarchy into shards.

Chunks are moved as stored: their bytes are never decoded or re-encoded,
only placed side by side in shards (v1.0 ``sharding_indexed`` layout, see
:class:`shardkv.format.layout.ShardLayout`). The result is exactly what
:class:`shardkv.ShardedStore` would have written had the arrays been created
through it: the same shards under the same keys; each sharded array stored as
a Zarr v3 array and nothing else (its ``zarr.json``, attributes inside, no
``.zarray``/``.zattrs``), every group above it a v3 group, and a consolidated
``.zmetadata`` that zarr-python 2 without shardkv cannot misread
(:func:`shardkv.cli.convert_meta.store_as_v3`); unsharded arrays as they were.

Rules
-----
* ``chunks_per_shard`` as an int applies along every dimension of every
  array; as a tuple it applies to arrays with that many dimensions only, and
  the others are copied unsharded (the report says which and why). A tuple
  that fits no array at all is an error
  (:class:`~shardkv.errors.ChunksPerShardMismatchError`) unless
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

* Shards are written by shard-aligned tasks (:mod:`shardkv.cli.convert_tasks`),
  here or in parallel (``workers``, ``scheduler``); a progress manifest
  (:mod:`shardkv.cli.manifest`) in the destination lets the same conversion,
  run again after an interruption, skip the shards already finished.

Memory: one shard's chunks are read with one batched ``get_many``; finished
shards are written in batches (see :mod:`shardkv.cli.convert_tasks`); other
keys are copied ``_COPY_BATCH_KEYS`` at a time. The whole array is never in
memory; the key listing is.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Literal, Mapping, Sequence

from shardkv.cli.convert_meta import amend_consolidated, array_metadata, metadata_order, store_as_v3
from shardkv.cli.convert_report import ArrayReport, ConvertReport
from shardkv.cli.convert_tasks import ShardTask, TaskResult, execute, group_tasks
from shardkv.cli.info import META_NAMES, ArrayKeys, read_hierarchy
from shardkv.cli.manifest import MANIFEST_KEY as _MANIFEST_KEY
from shardkv.cli.manifest import Manifest, open_destination, skippable_shards
from shardkv.cli.stores import open_store, refuse_regular_file
from shardkv.engine.temporaries import remove_stale_temporaries
from shardkv.errors import (
    ChunksPerShardMismatchError,
    ConfigurationError,
    DestinationNotEmptyError,
    SameLocationError,
)
from shardkv.format.layout import ShardLayout
from shardkv.keys.encodings import chunk_to_shard
from shardkv.metadata.chunks_per_shard import check_chunks_per_shard
from shardkv.proxy.open import is_draft_hierarchy
from shardkv.metadata.v3_view import sharding_spec_from_v3
from shardkv.proxy.presenting import PresentingAdapter
from shardkv.storage.adapters import FSMapAdapter, StoreAdapter

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

ChunksPerShard = int | tuple[int, ...]

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

    def __init__(self, store: StoreAdapter, max_nbytes: int, max_objects: int) -> None:
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
        self.store.set_many(self.pending)
        self.objects += len(self.pending)
        self.nbytes += self.pending_nbytes
        self.pending = {}
        self.pending_nbytes = 0


def _name(store: Any) -> str:
    return store if isinstance(store, str) else repr(store) if not hasattr(store, "__fspath__") else str(store)


def _check_distinct(src: StoreAdapter, dst: StoreAdapter, src_name: str, dst_name: str) -> None:
    src, dst = getattr(src, "inner", src), getattr(dst, "inner", dst)  # through a PresentingAdapter
    same_mapping = hasattr(src, "mapping") and hasattr(dst, "mapping") and src.mapping is dst.mapping
    if src is dst or same_mapping:
        raise SameLocationError(f"source and destination are the same store ({src_name})")
    if isinstance(src, FSMapAdapter) and isinstance(dst, FSMapAdapter) and src.fs.protocol == dst.fs.protocol:
        a = src.fs._strip_protocol(src.root).rstrip("/")
        b = dst.fs._strip_protocol(dst.root).rstrip("/")
        if a == b or b.startswith(a + "/") or a.startswith(b + "/"):
            raise SameLocationError(
                f"source {src_name} and destination {dst_name} overlap (one lies inside the other)"
            )


def _stores_v2_arrays(source: StoreAdapter) -> bool:
    """A Zarr v2 root, or a hierarchy shardkv stored as v3 (arrays with the ``v2`` chunk key encoding)."""
    if source.contains(".zgroup") or source.contains(".zarray"):
        return True
    presenting = PresentingAdapter(source)
    paths = [k.rpartition("/")[0] for k in source.iter_keys() if k.rpartition("/")[2] == "zarr.json"]
    nodes = presenting.nodes(paths).values()
    return any((n.doc.get("chunk_key_encoding") or {}).get("name") == "v2" and ".zarray" in n.documents for n in nodes)


def _copy(src: StoreAdapter, keys: Sequence[str], writer: _Writer, progress: Any) -> int:
    """Copy keys as they are, a batch at a time; returns the bytes read."""
    nbytes = 0
    for start in range(0, len(keys), _COPY_BATCH_KEYS):
        batch = keys[start : start + _COPY_BATCH_KEYS]
        values = src.get_many(batch)
        for k in batch:
            if k in values:  # a key deleted since the listing is not copied
                value = bytes(values[k])
                nbytes += len(value)
                writer.put(k, value)
        progress.update(len(batch))
    return nbytes


def _plan(
    keys: ArrayKeys, meta: Mapping[str, bytes], chunks_per_shard: ChunksPerShard
) -> tuple[tuple[int, ...] | None, str | None]:
    """``chunks_per_shard`` for one array, or ``None`` and the reason it stays unsharded."""
    ndim = keys.ndim
    zjson = meta.get(f"{keys.path}/zarr.json" if keys.path else "zarr.json")
    if zjson is not None and sharding_spec_from_v3(json.loads(bytes(zjson)), keys.path) is not None:
        return None, "already sharded"
    if ndim == 0:
        return None, "0-d"
    if isinstance(chunks_per_shard, int):
        return (chunks_per_shard,) * ndim, None
    if len(chunks_per_shard) != ndim:
        spec = ",".join(str(c) for c in chunks_per_shard)
        return None, f"{ndim}-d; chunks_per_shard {spec} is for {len(chunks_per_shard)}-d arrays"
    return tuple(chunks_per_shard), None


def _check_fit(
    plans: Mapping[str, tuple[tuple[int, ...] | None, str | None]], cps: ChunksPerShard, skip_mismatched: bool
) -> None:
    """Refuse a ``chunks_per_shard`` tuple that fits no array (unless ``skip_mismatched``)."""
    if isinstance(cps, int) or skip_mismatched:
        return
    candidates = {p: r for p, (c, r) in plans.items() if r not in ("already sharded", "0-d")}
    mismatched = [(p, r) for p, r in candidates.items() if r is not None]
    if candidates and len(mismatched) == len(candidates):
        raise ChunksPerShardMismatchError(",".join(str(c) for c in cps), mismatched, fits_none=True)


# -- the conversion ----------------------------------------------------------------


def convert(
    src: Any,
    dst: Any,
    chunks_per_shard: ChunksPerShard | Sequence[int],
    index_location: Literal["start", "end"] = "end",
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
        store :func:`shardkv.storage.adapters.adapt` accepts). ``dst`` must be
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
        Also give unsharded arrays and groups a v3 ``zarr.json`` (:mod:`shardkv.metadata.all_v3`).
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
        shards skipped by a resumed run.

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
    source, target = open_store(src, src_opts, role="source"), open_store(dst, dst_opts, role="destination")
    _check_distinct(source, target, src_name, dst_name)
    if not is_draft_hierarchy(source) and _stores_v2_arrays(source):
        source = PresentingAdapter(source)  # arrays already sharded (zarr.json only) appear with a .zarray
    if is_draft_hierarchy(source):  # a 2022 draft hierarchy gets the draft's sharding transformer
        from shardkv.cli.convert_draft import convert_draft

        if index_location != "end" or not index_checksum:
            raise ConfigurationError(
                f"{src_name} is a 2022 draft hierarchy: its shards use the draft's fixed 'indexed' layout "
                "(index at the end, no checksum), so --index-location start / --no-checksum do not apply"
            )
        if workers > 1 or scheduler is not None:
            raise ConfigurationError(f"{src_name} is a 2022 draft hierarchy: it is converted in one process "
                                     "(--workers / --scheduler apply to Zarr v2 sources)")  # fmt: skip
        return convert_draft(source, target, cps, progress, overwrite=overwrite, src_name=src_name, dst_name=dst_name)  # type: ignore[return-value]
    remote = workers > 1 or scheduler is not None
    if remote and not (isinstance(src, str) and isinstance(dst, str)):
        raise ConfigurationError("workers and scheduler need the source and destination as paths or URLs")
    job = _Job(source, target, src_name, dst_name, cps, index_location, index_checksum, progress)
    job.all_v3 = all_v3
    job.base = dict(
        src=src_name, dst=dst_name, src_options=src_opts, dst_options=dst_opts,
        index_location=index_location, index_checksum=index_checksum,
    )  # fmt: skip
    return job.run(overwrite, skip_mismatched, workers, scheduler, task_chunks)


class _Job:
    """One conversion of a Zarr v2 hierarchy (state shared by its steps)."""

    def __init__(
        self, source: StoreAdapter, target: StoreAdapter, src_name: str, dst_name: str, cps: ChunksPerShard,
        index_location: str, index_checksum: bool, progress: bool,
    ) -> None:  # fmt: skip
        self.source, self.target = source, target
        self.src_name, self.dst_name = src_name, dst_name
        self.cps, self.index_location, self.index_checksum = cps, index_location, index_checksum
        self.progress = progress
        self.base: dict[str, Any] = {}
        self.all_v3 = False
        self.report = ConvertReport(src_name, dst_name)
        self.writer = _Writer(target, _WRITE_BATCH_NBYTES, _WRITE_BATCH_OBJECTS)
        self.bytes_before = 0
        self.shard_objects = self.shard_bytes = 0

    def options(self) -> dict[str, Any]:
        """The options that shape the shards, as recorded in the manifest."""
        cps = self.cps if isinstance(self.cps, int) else list(self.cps)
        return {"chunks_per_shard": cps, "index_location": self.index_location, "index_checksum": self.index_checksum}

    def run(self, overwrite: bool, skip_mismatched: bool, workers: int, scheduler: str | None, task_chunks: int) -> ConvertReport:
        from tqdm import tqdm

        source = self.source
        hierarchy = read_hierarchy(source, self.src_name)
        meta = source.get_many([k for keys in hierarchy.arrays.values() for k in keys.meta_keys])
        plans = {path: _plan(keys, meta, self.cps) for path, keys in hierarchy.arrays.items()}
        _check_fit(plans, self.cps, skip_mismatched)
        manifest = open_destination(self.target, self.dst_name, self.src_name, self.options(), overwrite)
        if manifest is None:
            raise DestinationNotEmptyError(self.dst_name)
        self.report.objects_before = len(hierarchy.keys)
        self.report.workers = 0 if scheduler is not None else workers
        meta_out: dict[str, bytes] = {}
        amended: dict[str, dict[str, Any]] = {}  # array path -> .zarray with the detected separator
        tasks: list[tuple[str, ShardTask]] = []
        planned: dict[str, tuple[ShardLayout, int]] = {}  # shard key -> (layout, chunks in it)
        with tqdm(
            total=len(hierarchy.keys), disable=not self.progress, file=sys.stderr, unit="obj", desc="shardkv convert"
        ) as bar:
            for path, keys in hierarchy.arrays.items():
                array_meta = {k: meta[k] for k in keys.meta_keys if k in meta}
                self.bytes_before += sum(len(v) for v in array_meta.values())
                bar.update(len(keys.meta_keys))
                array_cps, reason = plans[path]
                if array_cps is None:
                    self._copy_unsharded(keys, array_meta, reason, meta_out, bar)
                    continue
                layout = ShardLayout.v3(array_cps, self.index_location, "little", self.index_checksum)  # type: ignore[arg-type]
                tasks += [(path, t) for t in self._tasks(keys, layout, task_chunks, planned)]
                self.bytes_before += sum(source.size(k) for k in keys.stale_keys)
                bar.update(len(keys.stale_keys))
                self.bytes_before += _copy(source, keys.other_keys, self.writer, bar)
                meta_out.update(array_metadata(keys, array_meta, layout, amended))
            self._copy_groups(hierarchy, meta_out, bar)
            self.writer.flush()
            self._write_shards(tasks, planned, manifest, workers, scheduler, bar)
            amend_consolidated(meta_out, amended)
            store_as_v3(meta_out, all_v3=self.all_v3)
            for key in sorted(meta_out, key=metadata_order):
                self.writer.put(key, meta_out[key])
            self.writer.flush()
        manifest.remove()
        report = self.report
        report.bytes_before = self.bytes_before
        report.objects_after = self.writer.objects + self.shard_objects
        report.bytes_after = self.writer.nbytes + self.shard_bytes
        return report

    def _copy_unsharded(
        self, keys: ArrayKeys, array_meta: Mapping[str, bytes], reason: str | None, meta_out: dict[str, bytes], bar: Any
    ) -> None:
        meta_out.update({k: bytes(v) for k, v in array_meta.items()})
        data_keys = [*keys.chunk_keys.values(), *keys.stale_keys, *keys.other_keys]
        self.bytes_before += _copy(self.source, data_keys, self.writer, bar)
        self.report.arrays.append(
            ArrayReport(keys.path, keys.ndim, None, reason, len(keys.chunk_keys), 0, 0, keys.separator, False)
        )

    def _tasks(
        self, keys: ArrayKeys, layout: ShardLayout, task_chunks: int, planned: dict[str, tuple[ShardLayout, int]]
    ) -> list[ShardTask]:
        by_shard: dict[tuple[int, ...], dict[tuple[int, ...], str]] = {}
        for coords, key in keys.chunk_keys.items():
            shard_coords, local = chunk_to_shard(coords, layout.chunks_per_shard)
            by_shard.setdefault(shard_coords, {})[local] = key
        prefix = f"{keys.path}/" if keys.path else ""
        base = {
            **self.base, "chunks_per_shard": tuple(layout.chunks_per_shard),
            "write_batch_nbytes": _WRITE_BATCH_NBYTES, "write_batch_objects": _WRITE_BATCH_OBJECTS,
        }  # fmt: skip
        tasks = list(group_tasks(by_shard, prefix, keys.separator, base, task_chunks))
        for task in tasks:
            for shard_key, members in task.shards:
                planned[shard_key] = (layout, len(members))
        self.report.arrays.append(
            ArrayReport(
                keys.path, keys.ndim, tuple(layout.chunks_per_shard), None, len(keys.chunk_keys), len(keys.stale_keys),
                0, keys.separator, keys.separator_detected,
            )
        )  # fmt: skip
        return tasks

    def _copy_groups(self, hierarchy: Any, meta_out: dict[str, bytes], bar: Any) -> None:
        group_meta = [k for k in hierarchy.group_keys if k.rpartition("/")[2] in META_NAMES]
        group_meta_set = set(group_meta)
        other = [k for k in hierarchy.group_keys if k not in group_meta_set and k != _MANIFEST_KEY]
        self.bytes_before += _copy(self.source, other, self.writer, bar)
        values = self.source.get_many(group_meta)
        self.bytes_before += sum(len(v) for v in values.values())
        meta_out.update({k: bytes(v) for k, v in values.items()})
        bar.update(len(group_meta))

    def _write_shards(
        self, tasks: list[tuple[str, ShardTask]], planned: Mapping[str, tuple[ShardLayout, int]],
        manifest: Manifest, workers: int, scheduler: str | None, bar: Any,
    ) -> None:  # fmt: skip
        """Run the shard tasks, skipping the shards an earlier run finished; record progress."""
        reports = {a.path: a for a in self.report.arrays}
        # the writers of an interrupted run are gone (the manifest is this conversion's): their
        # temporary files are stale whatever their age
        remove_stale_temporaries(self.target, min_age_seconds=0)
        skippable, verified = skippable_shards(self.target, manifest, planned, _VERIFY_LAST * max(workers, 1))
        self.report.shards_verified = verified
        todo: list[ShardTask] = []
        path_of: dict[int, str] = {}
        for path, task in tasks:
            left = tuple(s for s in task.shards if s[0] not in skippable)
            for shard_key, members in task.shards:
                if shard_key in skippable:
                    nbytes, nbytes_read = manifest.done[shard_key]
                    self._count(reports[path], nbytes, nbytes_read)
                    self.report.shards_skipped += 1
                    bar.update(len(members))
            if left:
                todo.append(task if len(left) == len(task.shards) else _replace_shards(task, left))
                path_of[id(todo[-1])] = path

        def on_done(task: ShardTask, result: TaskResult) -> None:
            for _, nbytes, nbytes_read in result.written:
                self._count(reports[path_of[id(task)]], nbytes, nbytes_read)
            manifest.record(result.written)
            bar.update(result.n_chunks)

        execute(todo, on_done, workers=workers, scheduler=scheduler, source=self.source, target=self.target)
        manifest.flush()

    def _count(self, array: ArrayReport, nbytes: int, nbytes_read: int) -> None:
        array.shards += 1
        self.shard_objects += 1
        self.shard_bytes += nbytes
        self.bytes_before += nbytes_read


def _replace_shards(task: ShardTask, shards: tuple[Any, ...]) -> ShardTask:
    from dataclasses import replace

    return replace(task, shards=shards)
