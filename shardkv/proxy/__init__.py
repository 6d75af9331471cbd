"""The MutableMapping proxies that code above (zarr-python 2, xarray, dask) uses.

``open.open_store`` picks one (the only code that detects a layout):

* ``store.ShardedStore`` (v2 keys): routing; beside it ``nodes`` (the node
  table: what each path is and the v2 documents presenting v3 nodes),
  ``metadata_writes`` (metadata written from above, stored as v3),
  ``writes`` (write-back), ``listing``;
* ``draft.DraftShardedStore`` (2022 draft keys), with ``draft_nodes``;
* both on ``base.ProxyBase`` (pickling, lifecycle) with ``options.Options``.
"""
