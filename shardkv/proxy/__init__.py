"""The zarr-python 2 MutableMapping proxies: ``store.ShardedStore`` (v2 keys) and ``draft.DraftShardedStore``.

``open.open_store`` picks one (the only code that detects a layout).
"""
