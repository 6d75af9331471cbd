"""Convert a 2022 draft hierarchy into a copy whose arrays use the draft sharding transformer.

The source is a 2022-era Zarr v3 draft hierarchy (root ``zarr.json`` with the
draft ``zarr_format`` URI, ``meta/root/<path>.array.json``, chunks under
``data/root/<path>/c...``), such as ``zarrita.zr3`` of zarr_implementations.
It is read through :class:`shardkv.proxy.draft.DraftShardedStore`, so a source
whose arrays are already sharded is read chunk by chunk too.

Chunks are copied as stored: their bytes are never decoded or re-encoded,
only packed into shards of the draft's ``indexed`` format by
:class:`shardkv.transformers.ShardingStorageTransformer`, and each sharded
array's metadata gains the sharding ``storage_transformers`` entry. Arrays
``chunks_per_shard`` does not apply to (0-d arrays; a tuple of another
length) are copied unsharded. Metadata is written last, so an interrupted
conversion leaves no array that looks complete. Chunk keys outside an array's
chunk grid (stale chunks) are skipped and counted.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from shardkv.cli.errors import DestinationNotEmptyError
from shardkv.cli.info_draft import is_draft
from shardkv.cli.stores import open_store, put_all, remove_everything
from shardkv.errors import ConfigurationError, InvalidKeyError
from shardkv.keys.paths import is_draft_chunk_segment, owning_array
from shardkv.metadata.chunks_per_shard import ChunksPerShardOption, ChunksPerShardRule
from shardkv.metadata.documents import dump_json, load_json
from shardkv.proxy.draft import DraftShardedStore, draft_options
from shardkv.storage.kv import KVStore
from shardkv.transformers import DATA_ROOT, AdapterStore, ShardingStorageTransformer

__all__ = ["DraftConvertReport", "convert_draft"]

_BATCH_NBYTES = 64 * 2**20  # chunk bytes read and written per batch (whole shards)
_BATCH_KEYS = 256  # unsharded keys copied per batch


@dataclass
class DraftConvertReport:
    """Counts of a draft conversion.

    Attributes
    ----------
    src, dst : str
        Source and destination, as given.
    arrays, sharded_arrays, groups : int
        Arrays copied, of which sharded; group metadata documents copied.
    chunks : int
        In-grid chunks copied (packed into shards or copied unsharded).
    stale_chunks : int
        Chunks outside their array's chunk grid, skipped.
    shards : int
        Shards written.
    other_keys : int
        Other keys copied as they are (``zarr.json`` included).
    """

    src: str
    dst: str
    arrays: int = 0
    sharded_arrays: int = 0
    groups: int = 0
    chunks: int = 0
    stale_chunks: int = 0
    shards: int = 0
    other_keys: int = 0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of the counts."""
        return {"format": "zarr v3 draft 2022 (sharding storage transformer)", **asdict(self)}

    def summary(self) -> str:
        """Human-readable lines."""
        lines = [
            f"converted the 2022 draft hierarchy {self.src} to {self.dst}: {self.arrays} arrays "
            f"({self.sharded_arrays} with the sharding storage transformer), {self.groups} groups",
            f"  chunks: {self.chunks} ({self.shards} shards written)",
        ]
        if self.stale_chunks:
            lines.append(f"  stale chunks outside the array grid, skipped: {self.stale_chunks}")
        return "\n".join(lines)


def convert_draft(
    src: KVStore | Any,
    dst: KVStore | Any,
    chunks_per_shard: ChunksPerShardOption,
    progress: bool = False,
    *,
    overwrite: bool = False,
    src_name: str | None = None,
    dst_name: str | None = None,
) -> DraftConvertReport:
    """Copy a 2022 draft hierarchy, packing each array's chunks into draft shards.

    Parameters
    ----------
    src, dst : KVStore, or a path, URL or store :func:`shardkv.cli.stores.open_store` takes
        Source hierarchy and (empty) destination.
    chunks_per_shard : int, tuple of int or mapping
        As :class:`shardkv.proxy.draft.DraftShardedStore` takes it: an int for every
        dimension, a tuple for arrays with that many dimensions, or
        ``{array path: int or tuple}``.
    progress : bool
        Show a tqdm progress bar (chunks) on stderr.
    overwrite : bool
        Delete everything in the destination first instead of refusing.
    src_name, dst_name : str, optional
        Names used in the report and errors.

    Returns
    -------
    DraftConvertReport

    Raises
    ------
    ConfigurationError
        If the source is not a 2022 draft hierarchy, or ``chunks_per_shard`` is invalid.
    DestinationNotEmptyError
        If the destination holds keys and ``overwrite`` is false.
    UnsupportedError
        If a source array uses a storage transformer shardkv does not know.
    """
    from tqdm import tqdm

    source, target = open_store(src, role="source"), open_store(dst, role="destination")  # a KVStore as it is
    src_name = src_name or (src if isinstance(src, str) else repr(src))
    dst_name = dst_name or (dst if isinstance(dst, str) else repr(dst))
    if not is_draft(source):
        raise ConfigurationError(
            f"{src_name} is not a 2022 draft hierarchy (no root zarr.json with zarr_format "
            "'https://purl.org/zarr/spec/protocol/core/3.0')"
        )
    if next(iter(target.list_prefix("")), None) is not None:
        if not overwrite:
            raise DestinationNotEmptyError(dst_name)
        remove_everything(target)
    rule = ChunksPerShardRule.parse(chunks_per_shard)
    reader = DraftShardedStore._reopen(source, draft_options())  # no zarr-python needed: any zarr installed
    report = DraftConvertReport(src_name, dst_name)
    keys = reader.list()
    arrays, owner_of = _owners(reader, keys)
    meta_out: dict[str, bytes] = {}
    plain = [k for k in keys if k not in owner_of and reader.array_path_of(k) is None]
    report.groups = sum(1 for k in plain if k.startswith("meta/") and ".group" in k)
    with tqdm(total=len(owner_of), disable=not progress, file=sys.stderr, unit="chunk", desc="shardkv convert") as bar:
        for path, meta_key in sorted(arrays.items()):
            doc = load_json(meta_key, reader[meta_key])
            report.arrays += 1
            chunk_keys = [k for k, p in owner_of.items() if p == path]
            cps = rule.for_array(path, len(doc.get("shape", [])))
            if cps is None:
                plain.extend(chunk_keys)
                meta_out[meta_key] = reader[meta_key]
                continue
            transformer = ShardingStorageTransformer.from_metadata(
                {"type": "indexed", "configuration": {"chunks_per_shard": list(cps)}},
                doc,
                path,
                AdapterStore(target),
            )
            _pack(reader, transformer, chunk_keys, report, bar)
            report.sharded_arrays += 1
            meta_out[meta_key] = dump_json({**doc, "storage_transformers": [transformer.to_metadata()]}, key=meta_key)
    _copy_as_stored(reader, target, plain, owner_of, meta_out, report)
    # metadata last: array and group documents, then the entry point
    put_all(target, {k: v for k, v in meta_out.items() if k != "zarr.json"})
    if "zarr.json" in meta_out:
        put_all(target, {"zarr.json": meta_out["zarr.json"]})
    return report


def _owners(reader: DraftShardedStore, keys: Sequence[str]) -> tuple[dict[str, str], dict[str, str]]:
    """``({array path: metadata key}, {chunk key: array path})`` of a listing."""
    arrays = {p: k for k in keys if (p := reader.array_path_of(k)) is not None}
    owner_of: dict[str, str] = {}
    for key in keys:
        if key.startswith(DATA_ROOT):
            owner = owning_array(key[len(DATA_ROOT) :], arrays, is_draft_chunk_segment)
            if owner is not None:
                owner_of[key] = owner
    return arrays, owner_of


def _copy_as_stored(
    reader: DraftShardedStore,
    target: KVStore,
    plain: Sequence[str],
    owner_of: Mapping[str, str],
    meta_out: dict[str, bytes],
    report: DraftConvertReport,
) -> None:
    """Copy keys as they are, in batches; metadata documents are kept in ``meta_out`` to be written last."""
    for start in range(0, len(plain), _BATCH_KEYS):
        batch = plain[start : start + _BATCH_KEYS]
        values = reader.getitems(batch)
        meta_out.update({k: v for k, v in values.items() if k == "zarr.json" or k.startswith("meta/")})
        data = {k: v for k, v in values.items() if k not in meta_out}
        put_all(target, data)
        report.chunks += sum(1 for k in data if k in owner_of)
        report.other_keys += sum(1 for k in values if k not in owner_of)


def _pack(
    reader: DraftShardedStore,
    transformer: ShardingStorageTransformer,
    chunk_keys: Sequence[str],
    report: DraftConvertReport,
    bar: Any,
) -> None:
    """Copy one array's chunks into shards, whole shards per batch."""
    grid = transformer.chunk_grid_shape
    by_shard: dict[str, list[str]] = {}
    for key in chunk_keys:
        try:
            coords = transformer.encoding.decode(key[len(transformer.key_prefix) :], transformer.ndim)
        except ValueError as exc:
            raise InvalidKeyError(key, f"not a chunk key of array {transformer.array_path!r}: {exc}") from None
        if grid is not None and any(c >= g for c, g in zip(coords, grid, strict=True)):
            report.stale_chunks += 1
            bar.update(1)
            continue
        located = transformer.locate(key)
        by_shard.setdefault(located[0], []).append(key)
    pending: dict[str, bytes] = {}
    pending_nbytes = 0
    for shard_key in sorted(by_shard):
        values = reader.getitems(by_shard[shard_key])  # one shard's chunks per read
        pending.update(values)
        pending_nbytes += sum(len(v) for v in values.values())
        report.chunks += len(values)
        bar.update(len(by_shard[shard_key]))
        if pending_nbytes >= _BATCH_NBYTES:
            transformer.set_values(pending)  # whole shards: built without reading
            pending, pending_nbytes = {}, 0
    if pending:
        transformer.set_values(pending)
    report.shards += len(by_shard)
