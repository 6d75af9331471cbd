"""Shard writes of :class:`~shardkv.engine.planner.ShardIO`: merge and write, append, erase, compact.

A mixin of ``ShardIO`` (which holds the state it uses: ``base``,
``index_cache``, ``plan``, ``epochs``, ``retry_stats``, the write options),
kept apart so that each module has one job: :mod:`shardkv.engine.planner`
reads, this module writes. Every method here holds the shards' locks
(:meth:`ShardIO.hold`) around its read-modify-write, and records each store
or delete in the write epochs before caching the new index.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Iterable, Iterator, Mapping

from shardkv.engine.backend import ShardBackend
from shardkv.engine.cas import GenerationTrackingAdapter, run_conditionally
from shardkv.engine.merge import ChunkPatch, covers_shard, merge_chunks, out_of_grid
from shardkv.engine.strategies import plan_append
from shardkv.format.index import ShardIndex
from shardkv.format.layout import ShardLayout
from shardkv.keys.space import ShardedArray

__all__ = ["ShardWrites", "ShardUpdates", "ShardErasures"]

ShardUpdates = Mapping[str, tuple[ShardedArray, tuple[int, ...], Mapping[tuple[int, ...], Any]]]
"""shard key -> (array, shard coords, {local coords: encoded chunk bytes, ChunkPatch, or None to delete})."""
ShardErasures = Mapping[str, tuple[ShardedArray, tuple[int, ...], Iterable[tuple[int, ...]]]]
"""shard key -> (array, shard coords, local coords of the chunks to erase)."""
_WRITE_ATTEMPTS = 16  # compare-and-swap runs of one shard write, at most


def _keeps_empty_shards(rw: Any) -> bool:
    """True when ``rw`` writes conditionally but cannot delete conditionally (obstore).

    An unconditional delete there could remove a concurrent writer's new
    chunks, so a shard left with no chunk is stored as an *empty shard* (an
    index with every entry missing, which zarr 3 and tensorstore read as fill
    values) by a compare-and-swap write instead.
    """
    conditional = getattr(rw, "conditional", None)
    return conditional is not None and not getattr(conditional, "supports_conditional_delete", True)


def _lock_prefix(arr: ShardedArray) -> str:
    """The key prefix of the directory whose ``.shardkv-locks`` holds the array's shard locks.

    The array's own directory where its shards live beside its metadata (v2
    and v3 layouts); the store root for the 2022 draft layout, whose data
    directories other readers list.
    """
    own = f"{arr.path}/" if arr.path else ""
    return arr.key_prefix if arr.key_prefix == own else ""


class ShardWrites:
    """The write half of :class:`~shardkv.engine.planner.ShardIO` (a mixin: ``ShardIO`` holds the state)."""

    base: Any
    index_cache: Any
    plan: Any
    epochs: Any
    retry_stats: Any
    validate_index_cache: bool
    write_strategy: str
    slack_bytes: int
    _rw: Any

    def hold(
        self, shard_keys: Iterable[str], arrays: Mapping[str, ShardedArray] | None = None
    ) -> AbstractContextManager[Any]:
        """The locks of ``shard_keys`` (see :meth:`ShardLocks.hold`; a no-op for ``concurrency="none"``).

        ``arrays`` (shard key -> its array) puts each shard's lock file in its
        array's directory, the same for every store root. Not re-entrant:
        never nest two ``hold`` calls (or a write) in one thread.
        """
        locks = self.plan.locks
        if locks is None:
            return nullcontext()
        prefixes = None if arrays is None else {k: _lock_prefix(arr) for k, arr in arrays.items()}
        return locks.hold(shard_keys, prefixes)

    @contextmanager
    def _writing(self, shards: Mapping[str, Any]) -> Iterator[None]:
        """Hold the locks of ``shards`` (shard key -> its array, or a tuple led by it); mark their write in flight.

        No reader caches their indexes meanwhile.
        """
        keys = list(shards)
        arrays = {k: v if isinstance(v, ShardedArray) else v[0] for k, v in shards.items()}
        with self.hold(keys, arrays):
            self.epochs.begin(keys)
            try:
                for shard_key in keys:
                    self.index_cache.discard(shard_key)
                yield
            finally:
                self.epochs.end(keys)

    def _stored(
        self,
        shard_keys: Iterable[str],
        indexes: Mapping[str, ShardIndex] | None = None,
        generations: Mapping[str, Any] | None = None,
    ) -> None:
        """Record that this object stored or deleted shards, then cache their new indexes.

        ``generations``: the generation (ETag) of each shard as written, where a
        conditional write returned one; cached beside its index, so a reader
        that pins generations can use the index without reading it again.
        """
        for shard_key in shard_keys:
            self.epochs.bump(shard_key)
        if indexes and not self.validate_index_cache:
            # under lock files (or the in-process compare-and-swap of memory:// and mappings) no other
            # writer can have stored the shard since: its validator now is that of what we wrote
            locked = self.plan.mode == "files" or (self.plan.mode == "conditional" and self._rw is None)
            for shard_key, index in indexes.items():
                tag = (generations or {}).get(shard_key)
                if tag is None and locked:
                    tag = self.base.validator(shard_key)
                self.index_cache.put(shard_key, index, tag)

    def write_shards(self, by_shard: ShardUpdates) -> None:
        """Apply chunk updates grouped by shard: one batched read (partly covered shards), one batched write.

        A shard left with no chunk is deleted, except on stores without a
        conditional delete (obstore) in ``"conditional"`` mode: there it is
        stored as an empty shard (every index entry missing; listed chunk
        keys: none; read: fill values), so a concurrent writer's chunks are
        never deleted. Chunks outside the chunk grid
        are dropped (:func:`~shardkv.engine.merge.merge_chunks`). The shards'
        locks are held throughout; in ``"conditional"`` mode the write runs as
        a compare-and-swap transaction, re-run (up to 16 times) when another
        process changed a shard it merged into.

        Raises
        ------
        ValueError
            If a :class:`~shardkv.engine.merge.ChunkPatch` would leave a gap in its chunk.
        LockTimeoutError
            If a shard lock was not obtained within ``lock_timeout``.
        ConcurrentUpdateError
            If every compare-and-swap run lost its race.
        """
        if not by_shard:
            return
        with self._writing(by_shard):
            rw = self._rw
            if rw is None:
                self._write_locked(by_shard, self.base)
            else:
                run_conditionally(
                    lambda: self._write_locked(by_shard, rw), rw, max_attempts=_WRITE_ATTEMPTS, stats=self.retry_stats
                )

    def _write_locked(self, by_shard: ShardUpdates, rw: ShardBackend) -> None:
        """The body of :meth:`write_shards` (locks held): old shards read and new ones written through ``rw``."""
        need_old = [sk for sk, (arr, coords, updates) in by_shard.items() if not covers_shard(arr, coords, updates)]
        if need_old and self.write_strategy != "rewrite" and self.base.supports_append:
            positional = [sk for sk in need_old if not any(isinstance(v, ChunkPatch) for v in by_shard[sk][2].values())]
            done = set(positional) - set(self._append_to_shards({sk: by_shard[sk] for sk in positional}))
            by_shard = {sk: v for sk, v in by_shard.items() if sk not in done}
            need_old = [sk for sk in need_old if sk not in done]
        old = rw.get_many(need_old) if need_old else {}
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
            elif shard_key in old and not _keeps_empty_shards(rw):
                empty.append(shard_key)
            elif shard_key in old and stored:  # no conditional delete: an empty shard, swapped in
                new_shards[shard_key], new_indexes[shard_key] = arr.layout.encode_shard_with_index({})
        for shard_key in by_shard:
            self.index_cache.discard(shard_key)
        try:
            rw.set_many(new_shards)
            if empty:
                rw.delete_many(empty)
        finally:  # even a lost race may have stored some shards: older tickets must not cache
            self._stored(by_shard)
        generations = {k: rw.generation_of(k) for k in new_indexes} if isinstance(rw, GenerationTrackingAdapter) else None
        self._stored((), new_indexes, generations)

    def _trust_cache_under_lock(self) -> bool:
        """True when an index cached by this object is known current while its shard's lock is held."""
        return self.plan.mode == "none" or self.validate_index_cache

    def _append_to_shards(self, by_shard: ShardUpdates) -> list[str]:
        """Apply updates to stored shards by positional writes (see :mod:`shardkv.engine.strategies`).

        Called with the shards' locks held; the indexes are read from the
        store (another process may have appended since this object cached
        them). Returns the shards that are not stored yet (to be written whole).
        """
        fresh = not self._trust_cache_under_lock()
        indexes, _ = self.read_indexes({sk: v[0] for sk, v in by_shard.items()}, fresh=fresh)
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
        try:
            if index.is_empty():
                self.base.delete_many([shard_key])
                return
            self.base.write_at(shard_key, writes)
        finally:
            self.epochs.bump(shard_key)
        validator = self.base.validator(shard_key) if self.validate_index_cache else None
        self.index_cache.put(shard_key, index, validator)

    def erase_chunks(self, by_shard: ShardErasures) -> None:
        """Erase chunks, updating each shard's index in place (the 2022 draft's ``erase_values`` plan).

        A shard that loses every available chunk is deleted without a read
        (one batched delete). The others get their index read (one batched
        request, unless cached), the erased entries (and those of chunks
        outside the chunk grid) set empty, and the new index written in place
        with :meth:`ShardBackend.write_at` (the chunk bytes stay, unused); a
        shard left without chunks is deleted. In ``"conditional"`` mode the
        shards are rewritten by :meth:`write_shards` instead (a positional
        write cannot be made conditional).

        Notes
        -----
        With the index at the end, the backend must accept a negative
        ``write_at`` offset (from the end) where its sizes are not free.
        """
        erasures = {sk: (arr, coords, set(locals_)) for sk, (arr, coords, locals_) in by_shard.items()}
        if self._rw is not None:
            self.write_shards({sk: (arr, c, dict.fromkeys(locals_)) for sk, (arr, c, locals_) in erasures.items()})
            return
        with self._writing(erasures):
            whole, partial = [], {}
            for shard_key, (arr, coords, locals_) in erasures.items():
                available = {local for _, local in arr.chunks_in_shard(coords)}
                if available and available <= locals_:
                    whole.append(shard_key)
                else:
                    partial[shard_key] = arr
            indexes, _ = self.read_indexes(partial, fresh=not self._trust_cache_under_lock())
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
                try:
                    self.base.delete_many(whole)
                finally:
                    self._stored(whole)

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
        """Rewrite the stored shards among ``shard_keys`` that hold unused bytes; returns the bytes reclaimed.

        Each shard is compacted holding its lock; on S3 (``"conditional"``) the
        new shard is written only if the shard is still the one read (a shard
        another process changed meanwhile is left for the next compaction).
        """
        reclaimed = 0
        for shard_key in shard_keys:
            with self._writing({shard_key: arr}):
                reclaimed += self._compact_one(arr, shard_key)
        return reclaimed

    def _compact_one(self, arr: ShardedArray, shard_key: str) -> int:
        """Compact one shard (its lock held); the bytes reclaimed."""
        conditional = self._rw.conditional if self._rw is not None else None
        if conditional is not None:
            blob, generation = conditional.read_with_generation(shard_key)
            if blob is None:
                return 0
        else:
            try:
                blob = self.base.get(shard_key)
            except KeyError:
                return 0
        index = arr.layout.index_of_shard(blob, shard_key)
        if len(blob) - arr.layout.index_nbytes - index.used_nbytes() <= 0:
            return 0
        new = arr.layout.encode_shard(arr.layout.chunks_of_shard(blob, shard_key, index))
        self.index_cache.discard(shard_key)
        try:
            if conditional is not None:
                if not conditional.swap(shard_key, new, generation)[0]:
                    return 0  # changed by another writer: its shard stays, compacted next time
            else:
                self.base.set(shard_key, new)
        finally:
            self.epochs.bump(shard_key)
        return len(blob) - len(new)
