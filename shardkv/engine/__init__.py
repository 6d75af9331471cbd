"""The shard engine: reads indexes and chunks, merges and writes shards, caches indexes, write strategies and write-back, over a storage adapter."""
