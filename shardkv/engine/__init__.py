"""The shard engine: reads indexes and chunks, merges and writes shards, caches indexes, guards and write-back, over a ``KVStore``."""
