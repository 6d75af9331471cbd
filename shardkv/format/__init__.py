"""The bytes of a shard, pure logic (no I/O).

The index of (offset, nbytes) pairs, the draft-2022 and v1.0 binary layouts, byte ranges and read planning.
"""
