"""Dask arrays cut into whole shards of a target array: :func:`rechunk_to_shards`.

Writing a dask array into a sharded array is correct with any block shape:
tasks that write chunks of one shard take that shard's lock in turn (or, on
S3, retry a compare-and-swap). But they *serialise*: sixteen 64 x 64 blocks
of one 256 x 256 shard become sixteen read-modify-writes of that shard, one
after the other. Rechunking to whole shards first makes every task write
complete shards: no shard is read, no task waits for another, and each shard
is written once.
"""

from __future__ import annotations

from typing import Any, Sequence

from shardkv.errors import ConfigurationError
from shardkv.proxy.base import ProxyBase
from shardkv.proxy.open import open_store

__all__ = ["rechunk_to_shards", "shard_shape_of"]


def shard_shape_of(target: Any, path: str = "") -> tuple[int, ...]:
    """The shard shape (elements per dimension) of a sharded array.

    Parameters
    ----------
    target : zarr.Array, ShardedStore, DraftShardedStore, str or sequence of int
        A zarr-python 2 array opened on a sharding proxy (a
        :class:`~shardkv.ShardedStore`, or a
        :class:`~shardkv.proxy.draft.DraftShardedStore` for a 2022 draft
        hierarchy); a proxy (with ``path``); a URL or local path of one (with
        ``path``, opened with :func:`~shardkv.open_store`); or the shard shape itself.
    path : str
        The array's path in ``target`` when that is a store or a URL.

    Raises
    ------
    ConfigurationError
        If the array is not sharded (or not found).
    """
    if isinstance(target, (tuple, list)):
        return tuple(int(n) for n in target)
    store = getattr(target, "store", None)
    if isinstance(store, ProxyBase):  # a zarr array
        target, path = store, getattr(target, "path", "")
    if isinstance(target, str):
        target = open_store(target)
    if not isinstance(target, ProxyBase):
        raise ConfigurationError(
            f"cannot find shards in {type(target).__name__}: pass a zarr array on a ShardedStore, "
            "a ShardedStore and a path, a URL and a path, or the shard shape"
        )
    arr = target.sharded_array(path)
    shape = None if arr is None else arr.shard_shape
    if shape is None:
        raise ConfigurationError(f"no sharded array with a known chunk shape at {path!r}", path)
    return tuple(int(n) for n in shape)


def rechunk_to_shards(array: Any, target: Any, path: str = "") -> Any:
    """``array`` rechunked so that every block is one whole shard of ``target`` (edge blocks cut by the array's end).

    Parameters
    ----------
    array : dask.array.Array
        The data to write, to be stored from the target's origin
        (``da.to_zarr(array, ...)`` without a ``region``).
    target : zarr.Array, ShardedStore, str or sequence of int
        The sharded array to write into (see :func:`shard_shape_of`).
    path : str
        The array's path when ``target`` is a store or a URL.

    Returns
    -------
    dask.array.Array
        The same data with blocks of the shard shape.

    Raises
    ------
    ConfigurationError
        If ``target`` is not a sharded array, or its number of dimensions
        differs from ``array``'s.

    Examples
    --------
    >>> store = ShardedStore("data.zarr", chunks_per_shard=4)  # doctest: +SKIP
    >>> z = zarr.create(x.shape, chunks=(64, 64), dtype=x.dtype, store=store)  # doctest: +SKIP
    >>> rechunk_to_shards(x, z).store(z, lock=False)  # doctest: +SKIP
    """
    shape: Sequence[int] = shard_shape_of(target, path)
    if len(shape) != array.ndim:
        raise ConfigurationError(
            f"the target's shards have {len(shape)} dimensions ({tuple(shape)}) but the array has {array.ndim}",
            path,
        )
    return array.rechunk(tuple(shape))
