"""Which shards a read batch takes whole, in one request, instead of index then chunk ranges.

On an object store every request is a round trip (and, on S3, a billed GET).
A batch that wants all or most of a shard's chunks, and does not have the
shard's index cached, therefore reads the whole shard in one request: the
index is decoded from its head or tail and checked against the object's real
size (which the whole read gives, so a truncated shard is caught), and the
chunks are sliced from the same buffer. A whole object is self-consistent: no
writer can slip in between an index read and a chunk read.

The choice is pure: :func:`shards_to_read_whole` looks only at the requests
and the :class:`~shardkv.format.ranges.ReadPolicy`; the engine
(:meth:`shardkv.engine.planner.ShardIO.read_ranges`) applies it on backends
whose requests are round trips (``round_trips``: s3fs and other remote fsspec
filesystems, obstore object stores) to the shards whose index is not cached
and whose size is not free. On local files, in-memory filesystems and
mappings the index then the coalesced ranges cost no round trips worth saving,
and the plan there stays as it was.
"""

from __future__ import annotations

from math import prod
from typing import Sequence

from shardkv.format.ranges import ByteRange, ReadPolicy
from shardkv.keys.space import ChunkRef

__all__ = ["shards_to_read_whole"]

_WHOLE_CHUNK = ByteRange(0)


def shards_to_read_whole(requests: Sequence[tuple[ChunkRef, ByteRange]], policy: ReadPolicy) -> frozenset[str]:
    """Keys of the shards of which ``requests`` want enough whole chunks to read the shard whole.

    Parameters
    ----------
    requests : sequence of (ChunkRef, ByteRange)
        Chunks and ranges inside them; only requests for a whole chunk
        (``ByteRange(0)``) count.
    policy : ReadPolicy
        ``whole_shard_fraction`` of the shard's chunk slots
        (``prod(chunks_per_shard)``) that must be wanted.

    Returns
    -------
    frozenset of str
        Shards where the distinct wanted chunks reach that fraction of the
        slots, or every chunk of the shard inside the chunk grid.
    """
    wanted: dict[str, set[tuple[int, ...]]] = {}
    refs: dict[str, ChunkRef] = {}
    for ref, byte_range in requests:
        if byte_range != _WHOLE_CHUNK:
            continue
        wanted.setdefault(ref.shard_key, set()).add(ref.local_coords)
        refs.setdefault(ref.shard_key, ref)
    whole = set()
    for shard_key, locals_ in wanted.items():
        ref = refs[shard_key]
        slots = prod(ref.array.chunks_per_shard)
        n = len(locals_)
        if n >= policy.whole_shard_fraction * slots or n >= ref.array.n_chunks_in_shard(ref.shard_coords):
            whole.add(shard_key)
    return frozenset(whole)
