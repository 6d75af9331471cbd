"""The shard engine over a ``KVStore``.

It reads indexes and chunks, merges and writes shards, and holds the index cache, the guards and the write-back.
"""
