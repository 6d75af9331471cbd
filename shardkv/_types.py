"""Type aliases that more than one layer uses, defined once (the bottom layer: imports nothing of shardkv).

An alias that belongs to one idea of one layer lives in that layer (``IndexLocation`` in
:mod:`shardkv.format.layout`, ``Concurrency`` in :mod:`shardkv.engine.locks`); this module holds
only the ones with no better home.
"""

from __future__ import annotations

BytesLike = bytes | bytearray | memoryview
"""Bytes as the stores hand them over: a value read, a part of a value to write (never a ``str``)."""
LocalCoords = tuple[int, ...]
"""The coordinates of an inner chunk inside its shard (``local_coords``), one per dimension."""
