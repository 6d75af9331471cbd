"""The bytes of a shard, pure (no I/O): index and layouts, byte ranges, O(chunk) update plans, journal frames."""
