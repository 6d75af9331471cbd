"""The MutableMapping proxies that code above (zarr-python 2, xarray, dask) uses.

``factory.open_store`` picks one (``layouts``: which layout a store holds):

* ``store.ShardedStore`` (v2 keys), routing only; beside it ``nodes`` (what each
  path is), ``mirror`` (the ``zarr.json`` view of each sharded ``.zarray``),
  ``writes`` (write-back), ``listing``, ``presenting`` (v3 nodes shown as v2);
* ``draft.DraftShardedStore`` (2022 draft keys), with ``draft_nodes``.
"""
