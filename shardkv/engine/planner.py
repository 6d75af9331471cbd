"""Shard I/O: reading indexes and inner chunks from shards, and writing shards, over a backend.

:class:`ShardIO` is the one shard engine of shardkv: the v2/v3 proxy
(:class:`shardkv.ShardedStore`) and the 2022 draft sharding storage
transformer (:class:`shardkv.transformers.ShardingStorageTransformer`) both
call it. It knows nothing of keys above them: it works on
:class:`~shardkv.keys.space.ChunkRef` (which shard, where in it) and on
updates grouped by shard, over a :class:`~shardkv.engine.backend.ShardBackend`.
Request plan:

* read, backend with ranged reads: one batched read of the indexes not in
  the :class:`~shardkv.engine.cache.IndexCache` (prefix or suffix ranges;
  keys the caller relays ride along), then one batched read of chunk ranges,
  merged per shard by a :class:`~shardkv.format.ranges.ReadPolicy` (or the
  whole shard when most is wanted). Where a shard's size is not free and its
  index is at the end, each range also asks for the ``index_nbytes`` bytes
  after it: at least the index follows every chunk, so fewer bytes mean a
  truncated shard or an entry pointing into the index (never served as data);
* read, backend without ranged reads: one batched read of whole shards;
* write: one batched read of the shards a call covers only in part (none for
  shards whose every available chunk is set whole), then one batched write;
  shards merge by :mod:`shardkv.engine.merge` (chunks outside the chunk grid
  are dropped). With the ``append``/``inplace`` strategies on a backend with
  positional writes, partly covered shards get positional writes instead
  (:mod:`shardkv.engine.strategies`);
* erase with the index updated in place (:meth:`ShardIO.erase_chunks`, the
  draft's plan): shards losing every available chunk are deleted without a
  read; the others get one index read (unless cached) and one positional
  write of the new index.

Writers of one shard are serialised by a lock per shard key.
"""

from __future__ import annotations

import threading
from contextlib import ExitStack, contextmanager
from typing import Any, Iterable, Iterator, Mapping, Sequence

from shardkv.engine.backend import ShardBackend
from shardkv.engine.cache import IndexCache
from shardkv.engine.merge import ChunkPatch, covers_shard, merge_chunks, out_of_grid
from shardkv.engine.strategies import WriteStrategy, plan_append
from shardkv.errors import ConfigurationError, CorruptShardError
from shardkv.format.index import ShardIndex
from shardkv.format.layout import ShardLayout
from shardkv.format.ranges import ByteRange, CoalescedRead, ReadPolicy, plan_reads
from shardkv.keys.space import ChunkRef, ShardedArray

__all__ = ["ShardIO", "ShardUpdates", "ShardErasures", "covers_shard"]

ShardUpdates = Mapping[str, tuple[ShardedArray, tuple[int, ...], Mapping[tuple[int, ...], Any]]]
"""shard key -> (array, shard coords, {local coords: encoded chunk bytes, ChunkPatch, or None to delete})."""
ShardErasures = Mapping[str, tuple[ShardedArray, tuple[int, ...], Iterable[tuple[int, ...]]]]
"""shard key -> (array, shard coords, local coords of the chunks to erase)."""
_BATCH = 4096  # shards whose indexes are read in one request while listing


class ShardIO:
    """Batched shard reads and writes over one backend.

    Parameters
    ----------
    base : ShardBackend
        The store below (a :class:`~shardkv.storage.adapters.StoreAdapter`,
        or the backend of a transformer's underlying store).
    index_cache_bytes : int
        Limit (bytes) of the decoded-index cache; 0 disables it.
    validate_index_cache : bool
        Check cached indexes against the backend's cheap validator first.
    read_policy : ReadPolicy
        Merging of chunk ranges and the whole-shard threshold.
    write_strategy : {"rewrite", "append", "inplace"}
        How partly covered shards are updated (append/inplace only where the
        backend supports positional writes).
    slack_bytes : int
        Zero bytes after each chunk written with ``"inplace"`` (bytes).

    Raises
    ------
    ConfigurationError
        For an unknown strategy or a negative slack.
    """

    def __init__(
        self,
        base: ShardBackend,
        *,
        index_cache_bytes: int,
        validate_index_cache: bool,
        read_policy: ReadPolicy,
        write_strategy: WriteStrategy,
        slack_bytes: int,
    ) -> None:
        if write_strategy not in ("rewrite", "append", "inplace"):
            raise ConfigurationError(f"write_strategy must be 'rewrite', 'append' or 'inplace', got {write_strategy!r}")
        if slack_bytes < 0:
            raise ConfigurationError(f"slack_bytes must be >= 0, got {slack_bytes}")
        self.base = base
        self.index_cache = IndexCache(index_cache_bytes)
        self.validate_index_cache = bool(validate_index_cache)
        self.read_policy = read_policy
        self.write_strategy = write_strategy
        self.slack_bytes = int(slack_bytes)
        self._lock = threading.Lock()
        self._shard_locks: dict[str, threading.Lock] = {}

    def shard_lock(self, shard_key: str) -> threading.Lock:
        """The lock that serialises writers of one shard in this process."""
        with self._lock:
            lock = self._shard_locks.get(shard_key)
            if lock is None:
                lock = self._shard_locks[shard_key] = threading.Lock()
            return lock

    @contextmanager
    def _locked(self, shard_keys: Iterable[str]) -> Iterator[None]:
        """Hold the locks of several shards (taken in sorted order: no deadlock between writers)."""
        with ExitStack() as stack:
            for shard_key in sorted(set(shard_keys)):
                stack.enter_context(self.shard_lock(shard_key))
            yield

    # -- reads ------------------------------------------------------------------

    def read_indexes(self, shards: Mapping[str, ShardedArray]) -> tuple[dict[str, ShardIndex], dict[str, bytes]]:
        """Indexes of the stored shards among ``shards`` (at most one batched request).

        Returns the indexes and, for a backend without ranged reads, the
        whole shards that were read to get them.

        Raises
        ------
        CorruptShardError, ChecksumError
            For a damaged index.
        """
        indexes, blobs, _ = self._read_indexes(shards, ())
        return indexes, blobs

    def _read_indexes(
        self, shards: Mapping[str, ShardedArray], relayed: Sequence[tuple[str, ByteRange]]
    ) -> tuple[dict[str, ShardIndex], dict[str, bytes], list[bytes | None]]:
        """:meth:`read_indexes`, with ``relayed`` ranges of other keys read in the same batch."""
        keys = list(shards)
        if not self.base.supports_ranges:
            blobs = self.base.get_many(keys) if keys else {}
            extra = self.base.get_ranges(relayed) if relayed else []
            return {k: shards[k].layout.index_of_shard(b, k) for k, b in blobs.items()}, blobs, extra
        indexes: dict[str, ShardIndex] = {}
        validators: dict[str, Any] = {}
        missing: list[str] = []
        for k in keys:
            validator = self.base.validator(k) if self.validate_index_cache else None
            cached = self.index_cache.get(k, validator)
            if cached is None:
                missing.append(k)
                validators[k] = validator
            else:
                indexes[k] = cached
        if not missing and not relayed:
            return indexes, {}, []
        raw = self.base.get_ranges([(k, shards[k].layout.index_range()) for k in missing] + list(relayed))
        for k, data in zip(missing, raw):
            if data is not None:
                # checked against the shard's size where that is free: a suffix read
                # alone cannot tell a truncated shard from an intact one
                index = indexes[k] = shards[k].layout.decode_index(data, k, self.base.size_if_free(k))
                self.index_cache.put(k, index, validators[k])
        return indexes, {}, list(raw[len(missing) :])

    def read_chunks(self, refs: Sequence[ChunkRef]) -> dict[str, bytes]:
        """Encoded bytes of the stored chunks among ``refs``, by chunk key (missing ones left out).

        Raises
        ------
        CorruptShardError, ChecksumError
            For a damaged shard (an index entry past the shard's end included).
        """
        values = self.read_ranges([(ref, ByteRange(0)) for ref in refs])
        return {ref.chunk_key: v for ref, v in zip(refs, values) if v is not None}

    def read_ranges(
        self, requests: Sequence[tuple[ChunkRef, ByteRange]], relayed: Sequence[tuple[str, ByteRange]] = ()
    ) -> list[bytes | None]:
        """Byte ranges inside chunks, and ranges of other keys read along (two batched requests at most).

        Parameters
        ----------
        requests : sequence of (ChunkRef, ByteRange)
            A chunk and a range *inside its bytes* (clipped to the chunk; a
            suffix range counts from the chunk's end).
        relayed : sequence of (str, ByteRange)
            Ranges of keys that are not chunks, read in the same batch as the
            indexes (the draft transformer's relayed keys).

        Returns
        -------
        list of bytes or None
            The values of ``requests`` then of ``relayed``, in order; ``None``
            where a chunk or key is not stored.

        Raises
        ------
        CorruptShardError, ChecksumError
            For a damaged shard (an index entry past the shard's data included).
        """
        shards = {ref.shard_key: ref.array for ref, _ in requests}
        indexes, blobs, extra = self._read_indexes(shards, relayed)
        out: list[bytes | None] = [None] * len(requests)
        wanted: list[tuple[int, ChunkRef, int, int]] = []  # (position, ref, start, stop) in the shard
        for i, (ref, byte_range) in enumerate(requests):
            index = indexes.get(ref.shard_key)
            entry = None if index is None else index.get(ref.local_coords)
            if entry is None:
                continue
            start, stop = byte_range.resolve(entry[1])
            if start == stop:
                out[i] = b""
            elif ref.shard_key in blobs:  # whole shards, their indexes checked against their sizes
                blob = memoryview(blobs[ref.shard_key])
                part = blob[entry[0] + start : entry[0] + stop]
                out[i] = part if blob.readonly else bytes(part)  # a view (no copy) unless the blob is mutable
            else:
                wanted.append((i, ref, entry[0] + start, entry[0] + stop))
        if wanted:
            self._read_wanted(wanted, indexes, out)
        return out + extra

    def _read_wanted(
        self, wanted: list[tuple[int, ChunkRef, int, int]], indexes: Mapping[str, ShardIndex], out: list[Any]
    ) -> None:
        """One batched read of the wanted shard ranges, merged per shard by the read policy."""
        by_shard: dict[str, list[tuple[int, ChunkRef, int, int]]] = {}
        for item in wanted:
            by_shard.setdefault(item[1].shard_key, []).append(item)
        requests: list[tuple[str, ByteRange]] = []
        plans: list[tuple[list[tuple[int, ChunkRef, int, int]], CoalescedRead, int]] = []
        for shard_key, items in by_shard.items():
            layout = items[0][1].array.layout
            guard = 0
            if layout.index_location == "end" and self.base.size_if_free(shard_key) is None:
                guard = layout.index_nbytes
            ranges = [ByteRange(a, b) for _, _, a, b in items]
            for read in plan_reads(ranges, indexes[shard_key].used_nbytes(), self.read_policy):
                r = read.range
                requests.append((shard_key, r if r.stop is None else ByteRange(r.start, r.stop + guard)))
                plans.append((items, read, guard))
        for (items, read, guard), value in zip(plans, self.base.get_ranges(requests)):
            if value is None:
                continue  # the shard was deleted between the two reads
            layout = items[0][1].array.layout
            limit = read.range.start + len(value)  # the end of the chunk data the read proves
            if read.range.stop is None and layout.index_location == "end":
                limit -= layout.index_nbytes
            else:
                limit -= guard
            view = memoryview(value)
            for member, rel, nbytes in read.members:
                i, ref, start, stop = items[member]
                if stop > limit:
                    raise CorruptShardError(
                        ref.shard_key,
                        f"index entry {ref.local_coords} of chunk {ref.chunk_key!r} points at bytes "
                        f"[{start}, {stop}) but the chunk data ends at byte {limit}: the shard ends "
                        f"{stop - limit} bytes too early (truncated shard, or an entry pointing into the index)",
                    )
                part = view[rel : rel + nbytes]
                out[i] = part if view.readonly else bytes(part)  # a view (no copy) unless the value is mutable

    def chunk_keys(self, shards: Mapping[str, ShardedArray], *, in_grid_only: bool = True) -> Iterator[str]:
        """Keys of the chunks stored in ``shards`` (indexes read 4096 shards per request).

        Parameters
        ----------
        shards : mapping of shard key to ShardedArray
            Stored shard keys and their arrays.
        in_grid_only : bool
            Leave out chunks outside the chunk grid (when it is known).
        """
        keys = list(shards)
        for start in range(0, len(keys), _BATCH):
            batch = {k: shards[k] for k in keys[start : start + _BATCH]}
            indexes, _ = self.read_indexes(batch)
            for shard_key, index in indexes.items():
                arr = batch[shard_key]
                shard_coords = arr.shard_coords_of(shard_key)
                for local in index.present():
                    chunk = arr.chunk_coords(shard_coords, local)  # type: ignore[arg-type]
                    if not in_grid_only or arr.in_grid(chunk):
                        yield arr.chunk_key(chunk)

    # -- writes -----------------------------------------------------------------

    def write_shards(self, by_shard: ShardUpdates) -> None:
        """Apply chunk updates grouped by shard: one batched read (partly covered shards), one batched write.

        A shard left with no chunk is deleted. Chunks outside the chunk grid
        are dropped (:func:`~shardkv.engine.merge.merge_chunks`).

        Raises
        ------
        ValueError
            If a :class:`~shardkv.engine.merge.ChunkPatch` would leave a gap in its chunk.
        """
        with self._locked(by_shard):
            need_old = [sk for sk, (arr, coords, updates) in by_shard.items() if not covers_shard(arr, coords, updates)]
            if need_old and self.write_strategy != "rewrite" and self.base.supports_append:
                positional = [sk for sk in need_old if not any(isinstance(v, ChunkPatch) for v in by_shard[sk][2].values())]
                done = set(positional) - set(self._append_to_shards({sk: by_shard[sk] for sk in positional}))
                by_shard = {sk: v for sk, v in by_shard.items() if sk not in done}
                need_old = [sk for sk in need_old if sk not in done]
            old = self.base.get_many(need_old) if need_old else {}
            new_shards: dict[str, list[Any]] = {}  # shard key -> parts (written without joining)
            new_indexes: dict[str, ShardIndex] = {}
            empty: list[str] = []
            # slack only where in-place writes can use it (elsewhere "inplace" falls back to rewrite)
            slack = self.slack_bytes if self.write_strategy == "inplace" and self.base.supports_append else 0
            for shard_key, (arr, coords, updates) in by_shard.items():
                stored = arr.layout.chunks_of_shard(old[shard_key], shard_key) if shard_key in old else {}
                chunks = merge_chunks(arr, coords, stored, updates)
                if chunks:
                    new_shards[shard_key], new_indexes[shard_key] = arr.layout.encode_shard_with_index(chunks, slack)
                elif shard_key in old:
                    empty.append(shard_key)
            for shard_key in by_shard:
                self.index_cache.discard(shard_key)
            self.base.set_many(new_shards)
            if empty:
                self.base.delete_many(empty)
            if not self.validate_index_cache:
                for shard_key, index in new_indexes.items():
                    self.index_cache.put(shard_key, index)

    def _append_to_shards(self, by_shard: ShardUpdates) -> list[str]:
        """Apply updates to stored shards by positional writes (see :mod:`shardkv.engine.strategies`).

        Called with the shards' locks held. Returns the shards that are not
        stored yet (to be written whole).
        """
        indexes, _ = self.read_indexes({sk: v[0] for sk, v in by_shard.items()})
        not_stored = [sk for sk in by_shard if sk not in indexes]
        for shard_key, index in indexes.items():
            arr, coords, updates = by_shard[shard_key]
            changes: dict[tuple[int, ...], bytes | None] = {
                local: None if v is None else bytes(v) for local, v in updates.items()
            }
            for local in out_of_grid(arr, coords, list(index.present())):
                changes[local] = None  # left behind by a shrinking resize
            plan = plan_append(
                arr.layout, index, self.base.size(shard_key), changes,
                inplace=self.write_strategy == "inplace", slack_bytes=self.slack_bytes,
            )  # fmt: skip
            self._store_positional(shard_key, plan.index, [(w.offset, w.data) for w in plan.writes])  # type: ignore[arg-type]
        return not_stored

    def _store_positional(self, shard_key: str, index: ShardIndex, writes: list[tuple[int, bytes]]) -> None:
        """Write pieces of a stored shard whose new index is ``index`` (deleted when it is empty)."""
        self.index_cache.discard(shard_key)
        if index.is_empty():
            self.base.delete_many([shard_key])
            return
        self.base.write_at(shard_key, writes)
        validator = self.base.validator(shard_key) if self.validate_index_cache else None
        self.index_cache.put(shard_key, index, validator)

    def erase_chunks(self, by_shard: ShardErasures) -> None:
        """Erase chunks, updating each shard's index in place (the 2022 draft's ``erase_values`` plan).

        A shard that loses every available chunk is deleted without a read
        (one batched delete). The others get their index read (one batched
        request, unless cached), the erased entries (and those of chunks
        outside the chunk grid) set empty, and the new index written in place
        with :meth:`ShardBackend.write_at` (the chunk bytes stay, unused); a
        shard left without chunks is deleted.

        Notes
        -----
        With the index at the end, the backend must accept a negative
        ``write_at`` offset (from the end) where its sizes are not free.
        """
        erasures = {sk: (arr, coords, set(locals_)) for sk, (arr, coords, locals_) in by_shard.items()}
        with self._locked(erasures):
            whole, partial = [], {}
            for shard_key, (arr, coords, locals_) in erasures.items():
                available = {local for _, local in arr.chunks_in_shard(coords)}
                if available and available <= locals_:
                    whole.append(shard_key)
                else:
                    partial[shard_key] = arr
            indexes, _ = self.read_indexes(partial)
            for shard_key, index in indexes.items():
                arr, coords, locals_ = erasures[shard_key]
                new = index.copy()
                for local in locals_ | set(out_of_grid(arr, coords, list(index.present()))):
                    new.clear(local)
                if new.is_empty():
                    whole.append(shard_key)
                elif new != index:
                    offset = self._index_offset(shard_key, arr.layout)
                    self._store_positional(shard_key, new, [(offset, arr.layout.encode_index(new))])
            for shard_key in whole:
                self.index_cache.discard(shard_key)
            if whole:
                self.base.delete_many(whole)

    def _index_offset(self, shard_key: str, layout: ShardLayout) -> int:
        """Where a shard's index starts: from the start, or negative from the end when the size is not free."""
        if layout.index_location == "start":
            return 0
        size = self.base.size_if_free(shard_key)
        return -layout.index_nbytes if size is None else size - layout.index_nbytes

    # -- maintenance --------------------------------------------------------------

    def compact_array(self, arr: ShardedArray) -> int:
        """Rewrite the array's shards that hold unused bytes; returns the bytes reclaimed."""
        return self.compact_shards(arr, (shard_key for shard_key, _ in arr.shard_keys()))

    def compact_shards(self, arr: ShardedArray, shard_keys: Iterable[str]) -> int:
        """Rewrite the stored shards among ``shard_keys`` that hold unused bytes; returns the bytes reclaimed."""
        reclaimed = 0
        for shard_key in shard_keys:
            with self.shard_lock(shard_key):
                try:
                    blob = self.base.get(shard_key)
                except KeyError:
                    continue
                index = arr.layout.index_of_shard(blob, shard_key)
                if len(blob) - arr.layout.index_nbytes - index.used_nbytes() <= 0:
                    continue
                new = arr.layout.encode_shard(arr.layout.chunks_of_shard(blob, shard_key, index))
                self.base.set(shard_key, new)
                self.index_cache.discard(shard_key)
                reclaimed += len(blob) - len(new)
        return reclaimed
