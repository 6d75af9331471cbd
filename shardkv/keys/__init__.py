"""Key spaces, pure logic (no I/O).

Chunk key encodings and the mapping of an array's chunk keys to (shard key, local coords).
"""
