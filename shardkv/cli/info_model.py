"""What ``shardkv info`` reports about one array, and the index statistics it is made of."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from shardkv.format.layout import ShardLayout
from shardkv.storage.kv import ANY, KVStore

__all__ = ["ArrayInfo", "shard_stats"]

_INDEX_BATCH = 1024  # shards whose indexes are read in one batched request


@dataclass
class ArrayInfo:
    """What ``shardkv info`` reports about one array.

    Attributes
    ----------
    path : str
        Array path (``""`` for a root array).
    shape, chunks : tuple of int
        Array shape and (inner) chunk shape, in elements.
    dtype : str
        The v2 dtype string.
    shard_shape, chunks_per_shard : tuple of int or None
        Shard shape (elements) and inner chunks per shard; ``None`` when unsharded.
    index_location : {"start", "end"} or None
    index_checksum : bool or None
    chunks_present : int
        Stored inner chunks inside the chunk grid.
    shards : int
        Stored shards (0 when unsharded).
    objects : int
        Stored data objects (shards, or chunks when unsharded), metadata excluded.
    bytes_stored : int
        Bytes of those data objects.
    bytes_unused : int
        Bytes inside shards that no present chunk and no index uses: shard
        bytes - index bytes - bytes referenced by present chunks (0 when unsharded).
    v3_readable : bool or None
        Whether zarr-python 3 opening the hierarchy at its root reads the array as
        Zarr v3 (:func:`shardkv.cli.info_v3.zarr3_view`); ``None`` when the root is
        Zarr v2 (zarr-python 3 reads the whole hierarchy as v2).
    v3_problems : list of str
        Why not, when it does not; when it does, what other v3 readers (tensorstore) refuse.
    """

    path: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: str
    shard_shape: tuple[int, ...] | None
    chunks_per_shard: tuple[int, ...] | None
    index_location: str | None
    index_checksum: bool | None
    chunks_present: int
    shards: int
    objects: int
    bytes_stored: int
    bytes_unused: int
    v3_readable: bool | None
    v3_problems: list[str]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (tuples become lists)."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}


def shard_stats(
    store: KVStore,
    shard_keys: Sequence[str],
    coords_of: Callable[[str], tuple[int, ...] | None],
    layout: ShardLayout,
    grid: Sequence[int],
) -> tuple[int, int, int, int]:
    """Read the indexes of ``shard_keys`` in batches.

    Each index is one ranged read that also gives the shard's size (checked
    against the index: a truncated shard is reported); ``coords_of(key)`` gives
    a shard key's shard coords.

    Returns
    -------
    tuple of int
        ``(in-grid chunks present, bytes used by chunks, index bytes, shard bytes)``.

    Raises
    ------
    CorruptShardError, ChecksumError
        If an index is damaged.
    OSError
        If a shard cannot be read (permissions; a directory, FIFO or socket at its key).
    """
    present = used = index_bytes = stored = 0
    cps = layout.chunks_per_shard
    for start in range(0, len(shard_keys), _INDEX_BATCH):
        batch = shard_keys[start : start + _INDEX_BATCH]
        results = store.get_many([(k, [layout.index_range()], ANY) for k in batch])
        unsized = [k for k, r in zip(batch, results, strict=True) if r.found and r.size is None]
        whole = store.values(unsized)  # stores that cannot tell a size with a ranged read
        for k, result in zip(batch, results, strict=True):
            if not result.found or result.values is None:
                continue  # deleted since the listing
            size = result.size if result.size is not None else len(whole.get(k, b""))
            index = layout.decode_index(result.values[0], k, size)
            shard_coords = coords_of(k)
            if shard_coords is None:
                continue
            for local in index.present():
                chunk = tuple(s * n + c for s, n, c in zip(shard_coords, cps, local, strict=True))
                if all(c < g for c, g in zip(chunk, grid, strict=True)):
                    present += 1
            used += index.used_nbytes()
            index_bytes += layout.index_nbytes
            stored += size
    return present, used, index_bytes, stored
