"""The MutableMapping proxies that code above (zarr-python 2, xarray, dask) uses: ShardedStore (v2 keys) and DraftShardedStore (2022 draft keys)."""
