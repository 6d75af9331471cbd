"""Transparent sharding for zarr-python 3: :class:`ShardedStore`, a ``zarr.abc.store.Store``.

Needs zarr-python >= 3 (``import shardkv`` does not import this package, and
works without zarr 3). The zarr 2 proxy is :class:`shardkv.ShardedStore`.

Example
-------
>>> import numpy as np, zarr
>>> from zarr.storage import MemoryStore
>>> from shardkv.zarr3 import ShardedStore
>>> data = {}
>>> store = ShardedStore(MemoryStore(data), chunks_per_shard=4)
>>> z = zarr.create_array(store, shape=(400, 400), chunks=(50, 50), dtype="f4")
>>> z[:] = 1
>>> len([k for k in data if k.startswith("c/")])   # 4 shards of 4 x 4 chunks
4
"""

try:
    import zarr.abc.store  # noqa: F401  (zarr-python 3 only)
except ImportError as exc:  # zarr 2.18 has no zarr.abc.store
    raise ImportError(
        'shardkv.zarr3 needs zarr-python >= 3 (pip install "shardkv[zarr3]": zarr 3.1 on Python 3.11, the newest '
        "zarr 3 on Python >= 3.12); with "
        'zarr-python 2.18 use shardkv.ShardedStore (pip install "shardkv[zarr2]")'
    ) from exc

from shardkv.zarr3.store import ShardedStore

__all__ = ["ShardedStore"]
