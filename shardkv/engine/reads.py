"""The one read path of the engine (:class:`ShardReader`): chunk bytes conditioned on the cached index's generation.

Every chunk read is a ranged ``get`` conditioned on the generation its cached index was read with; a
``"stale"`` answer drops the entry and the next round reads the index again (tensorstore's rule). Rounds,
whole-shard reads and listings: docs/architecture.md, "The read path".
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from math import prod

import numpy as np

from shardkv._types import BytesLike, LocalCoords
from shardkv.engine.cache import CacheEntry, IndexCache
from shardkv.engine.retry import READ_ATTEMPTS, READ_BACKOFF, EngineStats, attempts
from shardkv.errors import ConcurrentUpdateError, CorruptShardError
from shardkv.format.layout import ShardIndex
from shardkv.format.ranges import ByteRange, CoalescedRead, ReadPolicy, plan_reads
from shardkv.keys.listing import shard_chunk_count, shard_chunk_keys
from shardkv.keys.space import ChunkRef, ShardedArray
from shardkv.storage.kv import ANY, Generation, KVStore, ReadRequest, ReadResult

Listed = Mapping[str, Generation]  # shard key -> the generation a listing of the store returned
LIST_BATCH = 4096  # shards whose indexes one listing request reads at most
WHOLE_CHUNK = ByteRange(0)  # the range of a whole chunk: the one object the engine's chunk reads pass


def _whole_wanted(requests: Sequence[tuple[ChunkRef, ByteRange]], policy: ReadPolicy) -> set[str]:
    """Shards of which ``requests`` want enough whole chunks to read the shard whole (object stores)."""
    wanted: dict[str, tuple[ChunkRef, set[LocalCoords]]] = {}
    for ref, byte_range in requests:
        if byte_range == WHOLE_CHUNK:
            wanted.setdefault(ref.shard_key, (ref, set()))[1].add(ref.local_coords)
    whole: set[str] = set()
    for shard_key, (ref, chunks) in wanted.items():
        arr = ref.array
        enough = min(policy.whole_shard_fraction * prod(arr.chunks_per_shard), arr.n_chunks_in_shard(ref.shard_coords))
        if len(chunks) >= enough:
            whole.add(shard_key)
    return whole


def _span(index: ShardIndex, ref: ChunkRef, byte_range: ByteRange) -> tuple[int, int] | None:
    """The absolute ``(start, stop)`` in its shard of ``byte_range`` inside the chunk ``ref``; ``None`` if absent."""
    entry = index.get(ref.local_coords)
    if entry is None:
        return None
    offset, nbytes = entry
    if byte_range is WHOLE_CHUNK:
        return offset, offset + nbytes
    start, stop = byte_range.resolve(nbytes)
    return offset + start, offset + stop


def _slicer(value: BytesLike) -> Callable[[int, int], BytesLike]:
    """``value[start:stop]`` as a function: a view when ``value`` is read-only, else a ``bytes`` copy."""
    view = memoryview(value).cast("B")
    if view.readonly:
        return lambda start, stop: view[start:stop]
    return lambda start, stop: bytes(view[start:stop])


def _serve_from_whole(
    requests: Sequence[tuple[ChunkRef, ByteRange]],
    positions: list[int],
    blob: BytesLike,
    index: ShardIndex,
    out: list[BytesLike | None],
) -> None:
    """Fill ``out`` at ``positions`` from a whole shard read together with its index."""
    part = _slicer(blob)
    for pos in positions:
        span = _span(index, *requests[pos])
        if span is not None:
            out[pos] = part(*span)


def _read_unranged(
    kv: KVStore, requests: Sequence[tuple[ChunkRef, ByteRange]], by_shard: Mapping[str, list[int]]
) -> list[BytesLike | None]:
    """Reads from a store without ranged reads: each shard whole, once, nothing cached."""
    out: list[BytesLike | None] = [None] * len(requests)
    keys = list(by_shard)
    for shard_key, result in zip(keys, kv.get_many([(k, None, ANY) for k in keys]), strict=True):
        if result.found:
            blob = result.whole()
            index = requests[by_shard[shard_key][0]][0].array.layout.index_of_shard(blob, shard_key)
            _serve_from_whole(requests, by_shard[shard_key], blob, index, out)
    return out


def _relayed_values(results: Sequence[ReadResult]) -> list[BytesLike | None]:
    """The value of each relayed read (one range each), ``None`` where the key is not stored."""
    return [r.values[0] if r.found and r.values else None for r in results]


def _decode(arr: ShardedArray, shard_key: str, result: ReadResult, whole: bool) -> tuple[ShardIndex, int | None]:
    """The index of an index read (or of a whole-shard read) and the shard's size when known."""
    if whole:
        blob = result.whole()
        return arr.layout.index_of_shard(blob, shard_key), len(blob)
    values = result.values or [b""]
    return arr.layout.decode_index(values[0], shard_key, result.size), result.size


def _serve_ranges(
    shard_key: str,
    arr: ShardedArray,
    wanted: list[tuple[int, int, int]],
    coalesced: list[CoalescedRead],
    guard: int,
    result: ReadResult,
    out: list[BytesLike | None],
) -> None:
    """Slice the chunk bytes of one shard's ranged read into ``out``, refusing bytes the shard does not hold."""
    layout = arr.layout
    data_end = None if result.size is None else layout.data_region(result.size)[1]
    for read, value in zip(coalesced, result.values or [], strict=True):
        # the end of the chunk data the read proves (a suffix read of a shard ends with its index)
        suffix = read.range.stop is None and layout.index_location == "end"
        limit = read.range.start + len(value) - (layout.index_nbytes if suffix else guard)
        if data_end is not None:  # the size the read itself found
            limit = min(limit, data_end)
        part = _slicer(value)
        for member, rel, nbytes in read.members:
            pos, start, stop = wanted[member]
            if stop > limit:
                raise CorruptShardError(
                    shard_key,
                    f"an index entry points at bytes [{start}, {stop}) but the chunk data ends at byte {limit}: "
                    f"the shard ends {stop - limit} bytes too early (truncated shard, or an entry pointing "
                    "into the index)",
                )
            out[pos] = part(rel, rel + nbytes)


def current_indexes(
    kv: KVStore, cache: IndexCache, shards: Mapping[str, ShardedArray], generations: Listed | None
) -> dict[str, CacheEntry]:
    """The current ``(index, generation, size)`` of the stored shards among ``shards``, in their order (as
    :meth:`ShardReader.read_indexes`, without its repair)."""
    keys = list(shards)
    if not kv.caps.ranged:
        out = {}
        for k, result in zip(keys, kv.get_many([(k, None, ANY) for k in keys]), strict=True):
            if result.found:
                blob = result.whole()
                out[k] = CacheEntry(shards[k].layout.index_of_shard(blob, k), result.generation, len(blob))
        return out
    entries: dict[str, CacheEntry] = {}
    checks: list[tuple[str, CacheEntry]] = []
    need: list[str] = []
    for k in keys:
        cached = cache.peek(k)
        listed = None if generations is None else generations.get(k)
        if cached is None or (listed is not None and not listed.is_any and listed != cached.generation):
            need.append(k)
        elif listed is not None and listed == cached.generation:
            entries[k] = cached
        else:
            checks.append((k, cached))
    if checks:
        for (k, cached), result in zip(checks, kv.get_many([(k, [], e.generation) for k, e in checks]), strict=True):
            if result.state == "value":
                entries[k] = CacheEntry(cached.index, result.generation, result.size)
            elif result.state == "stale":
                need.append(k)
            else:
                cache.discard(k)
    if need:
        for k, result in zip(
            need, kv.get_many([(k, [shards[k].layout.index_range()], ANY) for k in need]), strict=True
        ):
            if not result.found:
                cache.discard(k)
                continue
            index, size = _decode(shards[k], k, result, False)
            cache.put(k, index, result.generation, size)
            entries[k] = CacheEntry(index, result.generation, size)
    return {k: entries[k] for k in keys if k in entries}


class ShardReader:
    """The reads of a :class:`~shardkv.engine.engine.ShardEngine` (its ``reads``), on the engine's state.

    ``cache`` and ``stats`` are shared with the engine's writes; ``repair``, set by the engine, is asked once when
    a read meets a damaged shard (:meth:`~shardkv.engine.writes.ShardWriter.repair`; True: read again).
    """

    def __init__(self, kv: KVStore, cache: IndexCache, policy: ReadPolicy, stats: EngineStats) -> None:
        self.kv = kv
        self.cache = cache
        self.policy = policy
        self.stats = stats
        self.repair: Callable[[str, ShardedArray], bool] | None = None

    def read_chunks(self, refs: Sequence[ChunkRef]) -> dict[str, BytesLike]:
        """Encoded bytes of the stored chunks among ``refs``, by chunk key (missing ones left out).

        Parameters
        ----------
        refs : sequence of ChunkRef
            Chunks of any arrays and shards (one batched index read and one
            batched chunk read per round).

        Returns
        -------
        dict of str to bytes-like
            Read-only buffers (``bytes`` or read-only ``memoryview``).

        Raises
        ------
        CorruptShardError, ChecksumError
            For a damaged shard.
        ConcurrentUpdateError
            If a shard kept changing under every read round.
        """
        if len(refs) == 1:  # a warm single-chunk read: one exact conditional request, no read plan
            value = self._read_one_cached(refs[0])
            if value is not None:
                return {refs[0].chunk_key: value}
        values = self.read_ranges([(ref, WHOLE_CHUNK) for ref in refs])
        return {ref.chunk_key: v for ref, v in zip(refs, values, strict=True) if v is not None}

    def read_ranges(
        self, requests: Sequence[tuple[ChunkRef, ByteRange]], relayed: Sequence[tuple[str, ByteRange]] = ()
    ) -> list[BytesLike | None]:
        """Byte ranges inside chunks, each from the shard generation its index was read from.

        Parameters
        ----------
        requests : sequence of (ChunkRef, ByteRange)
            A chunk and a range *inside its bytes* (clipped to the chunk; a
            suffix range counts from the chunk's end); ``ByteRange(0)`` is the
            whole chunk.
        relayed : sequence of (str, ByteRange)
            Ranges of keys that are not chunks (the draft transformer's relayed
            keys), read along with the first index reads (one request fewer).

        Returns
        -------
        list of bytes-like or None
            The values of ``requests`` then of ``relayed``, in order; ``None``
            where the chunk or key is not stored.

        Raises
        ------
        CorruptShardError, ChecksumError
            For a damaged shard (an index entry past the shard's data included).
        ConcurrentUpdateError
            If a shard changed under every one of the read rounds.
        """
        try:
            return self._read_ranges(requests, relayed)
        except CorruptShardError as exc:
            self._repair(exc, next((ref.array for ref, _ in requests if ref.shard_key == exc.shard_key), None))
        return self._read_ranges(requests, relayed)

    def _repair(self, exc: CorruptShardError, arr: ShardedArray | None) -> None:
        """Repair the shard of ``exc`` (an in-place append in flight or killed) to read it again, or raise ``exc``."""
        if self.repair is None or arr is None or not self.repair(exc.shard_key, arr):
            raise exc
        self.cache.discard(exc.shard_key)

    def _read_ranges(
        self, requests: Sequence[tuple[ChunkRef, ByteRange]], relayed: Sequence[tuple[str, ByteRange]]
    ) -> list[BytesLike | None]:
        """:meth:`read_ranges`, once."""
        kv, cache, policy, stats = self.kv, self.cache, self.policy, self.stats
        by_shard: dict[str, list[int]] = {}
        for pos, (ref, _) in enumerate(requests):
            by_shard.setdefault(ref.shard_key, []).append(pos)
        extra: list[ReadRequest] = [(key, [byte_range], ANY) for key, byte_range in relayed]
        if not by_shard or not kv.caps.ranged:
            values = _read_unranged(kv, requests, by_shard) if by_shard else []
            return values + _relayed_values(kv.get_many(extra) if extra else [])
        arrays = {k: requests[positions[0]][0].array for k, positions in by_shard.items()}
        out: list[BytesLike | None] = [None] * len(requests)
        pending = set(by_shard)
        whole = _whole_wanted(requests, policy) if kv.caps.round_trips else set()
        stale: set[str] = set()
        for attempt in attempts(READ_ATTEMPTS, READ_BACKOFF):
            stats.read_attempts += 1
            if attempt >= 3:
                whole |= stale  # a shard rewritten without pause: one self-consistent request
            stale = set()  # this round's: changed while their index or chunks were read
            order = [k for k in by_shard if k in pending]
            cached = {k: None if k in whole else cache.entry(k) for k in order}
            entries = {k: e for k, e in cached.items() if e is not None}
            need = [k for k in order if k not in entries]
            fresh: set[str] = set()
            if need or extra:
                reads: list[ReadRequest] = [
                    (k, None if k in whole else [arrays[k].layout.index_range()], ANY) for k in need
                ]
                answers = kv.get_many(reads + extra)
                if extra:
                    out += _relayed_values(answers[len(need) :])
                    extra = []
                for k, result in zip(need, answers, strict=False):  # answers: need's, then extra's
                    if result.state == "stale":  # changed while it was read: read again next round
                        cache.discard(k)
                        stale.add(k)
                        continue
                    if not result.found:  # no shard: none of its chunks is stored
                        cache.discard(k)
                        pending.discard(k)
                        continue
                    index, size = _decode(arrays[k], k, result, k in whole)
                    cache.put(k, index, result.generation, size)
                    if k in whole:
                        stats.whole_shard_reads += 1
                        _serve_from_whole(requests, by_shard[k], result.whole(), index, out)
                        pending.discard(k)
                    else:
                        entries[k] = CacheEntry(index, result.generation, size)
                        fresh.add(k)
            chunk_reads: list[ReadRequest] = []
            plans: list[tuple[str, list[tuple[int, int, int]], list[CoalescedRead], int]] = []
            for k in order:
                if k not in pending or k not in entries:
                    continue
                index, generation, size = entries[k].index, entries[k].generation, entries[k].size
                layout = arrays[k].layout
                spans = [(pos, _span(index, *requests[pos])) for pos in by_shard[k]]
                wanted = [(pos, *span) for pos, span in spans if span is not None]  # (position, start, stop)
                absent = len(wanted) < len(spans)
                if not wanted and (not absent or k in fresh):
                    pending.discard(k)  # nothing to read; absence proved by an index read of this round
                    continue
                guard = layout.index_nbytes if layout.index_location == "end" and size is None else 0
                coalesced = plan_reads([ByteRange(a, b) for _, a, b in wanted], index.used_nbytes(), policy)
                ranges = [
                    c.range if c.range.stop is None else ByteRange(c.range.start, c.range.stop + guard)
                    for c in coalesced
                ]
                chunk_reads.append((k, ranges, generation))
                plans.append((k, wanted, coalesced, guard))
            for (k, wanted, coalesced, guard), result in zip(
                plans, kv.get_many(chunk_reads) if chunk_reads else [], strict=True
            ):
                if result.state != "value":  # changed or deleted since the index was read: read it again
                    stale.add(k)
                    stats.read_stale += 1
                    cache.discard(k)
                    continue
                _serve_ranges(k, arrays[k], wanted, coalesced, guard, result, out)
                pending.discard(k)
            if not pending:
                return out
        first = sorted(pending)[0]
        raise ConcurrentUpdateError(first, READ_ATTEMPTS, READ_ATTEMPTS, operation="read")

    def _read_one_cached(self, ref: ChunkRef) -> BytesLike | None:
        """A warm single-chunk read: one exact ranged ``get`` conditioned on the cached index's generation.

        ``None`` (the caller takes :meth:`read_ranges`, which makes the same requests) unless the index is
        cached with its shard's size (then validated: every entry in the data region) and holds the chunk.
        """
        kv, cache, stats = self.kv, self.cache, self.stats
        if not kv.caps.ranged or (kv.caps.round_trips and _whole_wanted([(ref, WHOLE_CHUNK)], self.policy)):
            return None  # no ranged reads, or a shard read_ranges reads whole
        found = cache.chunk_location(ref.shard_key, ref.local_coords)  # a hit only when it serves
        if found is None:
            return None
        entry, start, nbytes = found  # inside the data region: the index was validated against the shard's size
        stats.read_attempts += 1
        (result,) = kv.get_many([(ref.shard_key, [ByteRange(start, start + nbytes)], entry.generation)])
        if result.state != "value":  # changed since the index was read
            stats.read_stale += 1
            cache.discard(ref.shard_key)
            return None
        value = result.values[0] if result.values else b""
        if len(value) != nbytes:  # same generation, fewer bytes: read_ranges reports it
            return None
        if type(value) is bytes:
            return memoryview(value)  # what read_ranges serves: a read-only view
        return _slicer(value)(0, nbytes)  # a read-only view (or a copy of a writable buffer)

    def has_chunks(self, refs: Sequence[ChunkRef]) -> list[bool]:
        """Whether each chunk is stored now (``in``), from indexes confirmed current (as :meth:`read_indexes`)."""
        indexes = self.read_indexes({ref.shard_key: ref.array for ref in refs})
        return [ref.shard_key in indexes and indexes[ref.shard_key].get(ref.local_coords) is not None for ref in refs]

    def read_indexes(
        self, shards: Mapping[str, ShardedArray], generations: Listed | None = None
    ) -> dict[str, ShardIndex]:
        """The current indexes of the stored shards among ``shards`` (listings, ``in``, counts).

        A cached index is used when its generation equals the one a store
        listing returned (``generations``), or else when a zero-range ``get``
        conditioned on it succeeds; every other index is read (one batched
        request for all).

        Parameters
        ----------
        shards : mapping of str to ShardedArray
            Shard keys and their arrays.
        generations : mapping of str to Generation, optional
            Generations a listing of the store returned, by shard key.

        Returns
        -------
        dict of str to ShardIndex
            Shards not stored are left out. Do not modify the indexes (they are
            the cached objects); copy first.

        Raises
        ------
        CorruptShardError, ChecksumError
            For a damaged index (after one repair of an in-place append, as :meth:`read_ranges`).
        """
        try:
            entries = current_indexes(self.kv, self.cache, shards, generations)
        except CorruptShardError as exc:
            self._repair(exc, shards.get(exc.shard_key))
            entries = current_indexes(self.kv, self.cache, shards, generations)
        return {k: e.index for k, e in entries.items()}

    def chunk_keys(
        self, shards: Mapping[str, ShardedArray], *, generations: Listed | None = None, in_grid_only: bool = True
    ) -> Iterator[str]:
        """Keys of the chunks stored in ``shards``, from their current indexes (:data:`LIST_BATCH` per request).

        Parameters
        ----------
        shards : mapping of str to ShardedArray
            Stored shard keys and their arrays (a listing of one array's
            prefix touches only that array's shards).
        generations : mapping of str to Generation, optional
            Generations the store listing returned (cached indexes with the
            same generation are used without a request).
        in_grid_only : bool
            Leave out chunks outside the chunk grid (when it is known).
        """
        return itertools.chain.from_iterable(
            shard_chunk_keys(arr, coords, index.present_mask(), in_grid_only)
            for arr, coords, index in self._stored_indexes(shards, generations)
        )

    def count_chunks(self, shards: Mapping[str, ShardedArray], *, generations: Listed | None = None) -> int:
        """How many chunks in the grid ``shards`` store (as :meth:`chunk_keys`, without building keys)."""
        return sum(
            shard_chunk_count(arr, coords, index.present_mask())
            for arr, coords, index in self._stored_indexes(shards, generations)
        )

    def present_masks(
        self, shards: Mapping[str, ShardedArray], *, generations: Listed | None = None
    ) -> Iterator[tuple[tuple[int, ...], np.ndarray]]:
        """``(shard coords, present mask)`` of each stored shard among ``shards``, from its current index.

        The mask is boolean, of shape ``chunks_per_shard``, True where the index
        holds a chunk; indexes are read as for :meth:`chunk_keys`.
        """
        for _, coords, index in self._stored_indexes(shards, generations):
            yield coords, index.present_mask()

    def _stored_indexes(
        self, shards: Mapping[str, ShardedArray], generations: Listed | None
    ) -> Iterator[tuple[ShardedArray, tuple[int, ...], ShardIndex]]:
        """``(array, shard coords, current index)`` of the stored shards among ``shards`` (keys of no shard skipped)."""
        keys = list(shards)
        for batch in ({k: shards[k] for k in keys[i : i + LIST_BATCH]} for i in range(0, len(keys), LIST_BATCH)):
            for shard_key, index in self.read_indexes(batch, generations).items():
                arr = batch[shard_key]
                coords = arr.shard_coords_of(shard_key)
                if coords is not None:
                    yield arr, coords, index
