"""Dask arrays cut into whole shards of a target array, so no two tasks write one shard (user guide)."""

from __future__ import annotations

from typing import Any

from shardkv.errors import ConfigurationError
from shardkv.proxy.base import ProxyBase
from shardkv.proxy.open import open_store


def _shard_shape(target: Any, path: str) -> tuple[int, ...]:
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
    target : zarr.Array, ShardedStore, DraftShardedStore, str or sequence of int
        The sharded array to write into: a zarr 2 array on a sharding proxy,
        a proxy or a URL (with ``path``), or the shard shape (elements).
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
    shape = _shard_shape(target, path)
    if len(shape) != array.ndim:
        raise ConfigurationError(
            f"the target's shards have {len(shape)} dimensions ({shape}) but the array has {array.ndim}",
            path,
        )
    return array.rechunk(shape)
