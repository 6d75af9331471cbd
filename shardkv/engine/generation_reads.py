"""Chunk reads pinned to the generation of the index they use (issue 9, item 4: readers never see a torn state).

A chunk read takes two requests: the shard's index (or a cached copy of it),
then the chunk's bytes at the offsets the index gives. On an object store a
writer in *another process* can replace the shard in between, or long after
this process cached the index; offsets of the old index read in the new
bytes give wrong numbers (silently, for uncompressed chunks) or a decode
error. Local files catch this with a validator (inode, mtime, size) checked
before and after; an object store has no cheap one, but it has generations
(ETags) and conditional reads. As tensorstore does, the engine then:

* reads each index *with its generation*
  (:meth:`~shardkv.storage.conditional.ConditionalStore.read_many_with_generation`:
  one ``GetObject`` per index, concurrent) and caches it with that
  generation (:meth:`~shardkv.engine.cache.IndexCache.get_generation`); a
  shard read whole gives its generation too;
* takes a cached index only together with its generation (this object's
  own compare-and-swap writes cache the ETag their ``PutObject`` returned;
  an entry cached without one counts as not cached), and only when it holds
  every chunk the read wants (an absent entry proves nothing: the planner
  then reads the index again);
* reads the chunk ranges only if the shard's generation is still the
  index's (:meth:`~shardkv.storage.conditional.ConditionalStore.read_many_if_generation`:
  ``If-Match``, one ``GetObject`` per merged range). A refusal (``412``)
  or a vanished shard comes back as ``None``, which
  :meth:`shardkv.engine.planner.ShardIO.read_ranges` already treats as
  "changed": it drops the cached index and reads again, index first.

Request counts stay those of the plain plan (one request per index not
cached, one per merged chunk range), except that a read of a chunk the
cached index lacks costs an index read. :class:`PinnedReads` is the bookkeeping
of one read attempt (one per call, so threads sharing a ``ShardIO`` never
share it); :func:`pinned_store_for` decides where it applies: wherever the
base store's :class:`~shardkv.storage.conditional.ConditionalStore`
``pins_reads`` (S3 through s3fs, obstore object stores and ``MemoryStore``),
whatever the ``concurrency=`` mode of the writers.
"""

from __future__ import annotations

from typing import Any, Sequence

from shardkv.engine.cache import IndexCache
from shardkv.format.index import ShardIndex
from shardkv.format.ranges import ByteRange
from shardkv.storage.choose_conditional import conditional_store_for
from shardkv.storage.conditional import ConditionalStore, Generation

__all__ = ["PinnedReads", "pinned_store_for"]

_WHOLE = ByteRange(0)


def pinned_store_for(base: Any) -> ConditionalStore | None:
    """The conditional store whose generations a reader of ``base`` must pin its chunk reads to, or ``None``.

    ``None`` where no other process can change the data behind this
    process's back unseen: local files (validators), ``memory://`` and
    mappings (in-process), stores without conditional reads. Decided by
    :attr:`~shardkv.storage.conditional.ConditionalStore.pins_reads` (object
    stores; an obstore ``MemoryStore``, which has no validator). The store is
    asked for reads only: an obstore ``S3Store`` whose conditional puts are
    disabled still pins its reads (``If-Match`` GETs), whatever the
    ``concurrency=`` mode.
    """
    store = conditional_store_for(base, for_writes=False)
    return store if store is not None and store.pins_reads else None


class PinnedReads:
    """The generations of the indexes one read attempt uses, and its reads pinned to them.

    Parameters
    ----------
    store : ConditionalStore
        Generation-aware reads of the base store (same keys).

    Attributes
    ----------
    generations : dict of str to Generation
        Shard key -> generation of the index this attempt took (read or cached).
    refused : int
        Chunk ranges whose read was refused because the shard changed (or
        vanished) since its index was read.
    """

    def __init__(self, store: ConditionalStore) -> None:
        self.store = store
        self.generations: dict[str, Generation] = {}
        self.refused = 0

    def cached(self, cache: IndexCache, shard_key: str) -> ShardIndex | None:
        """The cached index of ``shard_key`` if it was cached with its generation (which is recorded), else ``None``."""
        entry = cache.get_generation(shard_key)
        if entry is None:
            return None
        self.generations[shard_key] = entry[1]
        return entry[0]

    def read_indexes(self, requests: Sequence[tuple[str, ByteRange]]) -> list[bytes | None]:
        """Index ranges (or whole shards: ``ByteRange(0)``) with their generations, concurrently; ``None``: not stored.

        Raises
        ------
        OSError
            Errors of the store other than "not found".
        """
        found = self.store.read_many_with_generation([(k, None if r == _WHOLE else r) for k, r in requests])
        for (shard_key, _), (data, generation) in zip(requests, found):
            if data is not None:
                self.generations[shard_key] = generation
        return [data for data, _ in found]

    def read_ranges(self, requests: Sequence[tuple[str, ByteRange]]) -> list[bytes | None]:
        """Chunk ranges of shards whose index this attempt took, each only if its generation still holds.

        Returns the bytes, or ``None`` where the shard changed or vanished
        since its index was read (read it again, index first).

        Raises
        ------
        OSError
            Errors of the store other than a changed or missing value.
        """
        found = self.store.read_many_if_generation([(k, r, self.generations.get(k)) for k, r in requests])
        out = [data if ok else None for ok, data in found]
        self.refused += sum(data is None for data in out)
        return out
