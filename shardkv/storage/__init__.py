"""The only code that touches a base store: the :class:`~shardkv.storage.kv.KVStore` interface and its stores
(``local``, ``s3``, ``obstore``, ``fsspec``, ``mapping``; ``open.open_kv`` picks one)."""
