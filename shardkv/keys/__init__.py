"""Key spaces, pure logic (no I/O): key rules, chunk key encodings, chunk key -> (shard key, local coords)."""
