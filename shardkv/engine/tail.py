"""O(chunk) updates of stored shards: the changed chunks and a new index, not the whole shard.

:class:`TailUpdater` is the part of a write round (:mod:`shardkv.engine.writes`)
that serves the shards a change covers only in part, where the store can
write after a shard's bytes (:attr:`~shardkv.storage.kv.Capabilities.tail_updates`)
and the ``shard_updates`` option allows:

1. the shards' indexes: the cached one where a zero-range ``get`` conditioned
   on its generation still holds (and tells the size), else the index bytes
   (one ranged ``get``); never the chunks;
2. the chunks that :class:`~shardkv.engine.merge.ChunkPatch` changes patch,
   read by their ranges conditioned on that generation;
3. the plan (:func:`~shardkv.format.tail.plan_tail_update`): unchanged chunks
   keep their offsets, changed ones go after the data, deleted ones (and
   chunks outside the chunk grid, which a merge drops) are cleared;
4. a shard the plan would leave with more than ``max_dead_fraction`` of its
   bytes unused, or with no chunk, is handed back to be rewritten whole
   (compacted); the others are written by
   :meth:`~shardkv.storage.kv.KVStore.update_tail` conditioned on the
   generation read, and their new indexes cached.

``"auto"`` takes the store's clone path only (S3: a multipart upload that
copies the kept bytes on the server, where at least
:attr:`~shardkv.storage.kv.Capabilities.tail_min_kept` bytes stay: a shard
written whole by a change that covers it in part, and expected to grow past
twice that, is led by a *reserve* of zero bytes so that it does from its
first update on (:meth:`TailUpdater.reserve`); the first update that keeps as
many bytes after the reserve drops it); ``"append"`` takes an
in-place append where no clone can be made, in mode ``"files"`` only and for
layouts whose index is at the end and checksummed (a torn tail then fails
the CRC32C, never gives wrong offsets), recording its intent in the shard's
lock file. :meth:`TailUpdater.recover` finishes or undoes an append whose
writer died, holding the lock.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from shardkv._types import BytesLike, LocalCoords
from shardkv.engine.cache import IndexCache
from shardkv.engine.locks import ShardLocks
from shardkv.engine.merge import ChunkPatch, ChunkUpdate, ShardChange, out_of_grid
from shardkv.engine.retry import EngineStats
from shardkv.format.layout import ShardIndex
from shardkv.format.ranges import ByteRange
from shardkv.format.tail import TailHow, TailPlan, dead_fraction, plan_tail_update
from shardkv.keys.space import ShardedArray
from shardkv.storage.kv import ANY, Generation, KVStore, ReadRequest

__all__ = ["TailUpdater", "RESERVE_GROWTH"]

RESERVE_GROWTH = 2
"""A shard gets a reserve when its expected size is at least this many times ``tail_min_kept``."""


class TailUpdater:
    """The O(chunk) updates of a :class:`~shardkv.engine.writes.ShardWriter` (see the module docstring).

    Parameters
    ----------
    kv : KVStore
        The base store.
    cache : IndexCache
        The engine's index cache (read for the current index, given the new one).
    locks : ShardLocks
        The engine's shard locks (their lock files hold append intents).
    stats : EngineStats
        Counters (``tail_updates``).
    shard_updates : {"auto", "append", "rewrite"}
        The option (:class:`~shardkv.engine.options.Options`).
    max_dead_fraction : float
        Largest fraction of unused bytes an updated shard may keep (``0 < x <= 1``).
    """

    def __init__(
        self,
        kv: KVStore,
        cache: IndexCache,
        locks: ShardLocks,
        stats: EngineStats,
        shard_updates: str,
        max_dead_fraction: float,
    ) -> None:
        self.kv = kv
        self.cache = cache
        self.locks = locks
        self.stats = stats
        self.enabled = shard_updates != "rewrite" and kv.caps.tail_updates
        self.in_place = shard_updates == "append" and locks.cross_process
        self.max_dead_fraction = max_dead_fraction

    def method(self, shard_key: str, arr: ShardedArray) -> TailHow | None:
        """How an update of some chunks of the stored shard ``shard_key`` is written in O(chunk); ``None``: whole.

        ``"clone"`` where the store clones the shard's file; ``"append"`` where
        it does not, in place updates are allowed (``shard_updates="append"``,
        mode ``"files"``) and the layout has its index at the end with a
        CRC32C; else ``None`` (the shard is rewritten whole).

        Raises
        ------
        OSError
            If the shard's directory cannot be examined (permissions).
        """
        if not self.enabled:
            return None
        how = self.kv.tail_method(shard_key, self.in_place)
        layout = arr.layout
        if self.kv.caps.tail_min_kept and (layout.index_location == "start" or self._small(shard_key)):
            return None  # the update would keep fewer bytes than the store copies: written whole, no index read
        if how == "clone" or (how == "append" and layout.index_location == "end" and layout.index_checksum):
            return how
        return None

    def update(
        self, changes: Mapping[str, ShardChange], refused: dict[str, Exception]
    ) -> tuple[set[str], set[str], set[str]]:
        """Update the stored shards of ``changes`` (each covered only in part) where it pays; what was done.

        Returns
        -------
        tuple of (set of str, set of str, set of str)
            The shards written (their new indexes cached); those whose shard
            changed since its index was read (lost: the round goes again); and
            those found not stored (written whole, with no read). A shard
            refused by its change (a patch leaving a gap) is put into
            ``refused``; every other shard is left for a whole rewrite.
        """
        if not self.enabled or not changes:
            return set(), set(), set()
        hows: dict[str, TailHow] = {}
        for shard_key, change in changes.items():  # first where it can pay: no index read for a whole rewrite
            how = self.method(shard_key, change.array)
            if how is not None:
                hows[shard_key] = how
        if not hows:
            return set(), set(), set()
        states, missing = self._indexes({k: changes[k] for k in hows})
        written: set[str] = set()
        lost: set[str] = set()
        plans: dict[str, tuple[TailHow, dict[LocalCoords, ChunkUpdate], ShardIndex, Generation, int]] = {}
        patched: dict[str, list[LocalCoords]] = {}
        for shard_key, (index, generation, size) in states.items():
            change, how = changes[shard_key], hows[shard_key]
            updates: dict[LocalCoords, ChunkUpdate] = {}
            for local in out_of_grid(change.array, change.shard_coords, index.present()):
                updates[local] = None  # what a merge drops: chunks a shrinking resize left outside the grid
            updates.update(change.chunks)  # patches are applied below, to the old chunks read
            patches = [k for k, v in updates.items() if isinstance(v, ChunkPatch) and index.get(k) is not None]
            if patches:
                patched[shard_key] = patches
            plans[shard_key] = (how, updates, index, generation, size)
        old_chunks = self._read_patched(plans, patched, lost)
        for shard_key, (how, updates, index, generation, size) in plans.items():
            if shard_key in lost:
                continue
            change = changes[shard_key]
            try:
                whole = self._apply_patches(updates, old_chunks.get(shard_key, {}))
            except ValueError as exc:
                refused[shard_key] = exc
                continue
            whole = {k: v for k, v in whole.items() if v is not None or index.get(k) is not None}
            if not whole:  # only deletes of chunks not stored: nothing to write
                written.add(shard_key)
                continue
            layout = change.array.layout
            plan = plan_tail_update(layout, index, size, whole, how)
            minimum = self.kv.caps.tail_min_kept
            lead = _lead(plan.index) if minimum and layout.index_location == "end" else 0
            reserve = min(lead, minimum)  # a reserve's dead bytes are not held against the shard
            if plan.index.is_empty() or _dead(plan, reserve) > self.max_dead_fraction:
                continue  # no chunk left (a delete), or too many dead bytes: rewritten whole
            if plan.kept_nbytes < minimum:
                continue  # fewer bytes kept than the store copies (S3: 5 MiB): rewritten whole
            drop = lead if lead and plan.kept_nbytes - lead >= minimum else 0  # the leading dead bytes can go
            writes, new_index, nbytes = plan.writes, plan.index, plan.nbytes
            if drop:
                new_index = _shifted(plan.index, -drop)
                parts = plan.writes[0][1]
                writes = [(plan.kept_nbytes - drop, [*parts[:-1], layout.encode_index(new_index)])]
                nbytes -= drop
            intent: tuple[int, str] | None = None
            if how == "append":
                intent = self.locks.held_lock_files({shard_key: change.array}).get(shard_key)
                if intent is None:
                    continue  # no lock file held to record the intent in: rewritten whole
            self.cache.discard(shard_key)
            fd, path = intent or (None, None)
            new_generation = self.kv.update_tail(shard_key, writes, nbytes, generation, how, fd, path, drop=drop)
            if new_generation is None:
                lost.add(shard_key)
                continue
            self.cache.put(shard_key, new_index, new_generation, nbytes)
            self.stats.tail_updates += 1
            written.add(shard_key)
        return written, lost, missing

    def reserve(
        self, change: ShardChange, parts: list[BytesLike], index: ShardIndex
    ) -> tuple[list[BytesLike], ShardIndex]:
        """The shard ``change`` writes whole (``parts``, ``index``), led by a reserve of zero bytes where it pays.

        Where updates must keep ``tail_min_kept`` bytes (S3), a shard written
        whole by a change that covers it in part, holding fewer bytes than
        that but expected to hold :data:`RESERVE_GROWTH` times as many (its
        chunks' mean size times its chunks in the grid), is led by the zero
        bytes that make its chunks and reserve ``tail_min_kept``: its next
        updates are O(chunk), where they would rewrite it whole until it has
        grown that much. The reserve is dead bytes (at most ``tail_min_kept``
        a shard), dropped by the first update that keeps as many bytes after
        it, or by ``compact``. Other shards are returned as they are.
        """
        minimum, layout = self.kv.caps.tail_min_kept, change.array.layout
        if not (self.enabled and minimum and layout.index_location == "end" and index.count_present()):
            return parts, index
        data = sum(memoryview(p).nbytes for p in parts[:-1])
        n = change.array.n_chunks_in_shard(change.shard_coords)
        grows = data * n >= RESERVE_GROWTH * minimum * index.count_present()
        if data >= minimum or not grows or change.covers_shard() or index.count_present() >= n:
            return parts, index
        reserved = _shifted(index, minimum - data)
        return [bytes(minimum - data), *parts[:-1], layout.encode_index(reserved)], reserved

    def _small(self, shard_key: str) -> bool:
        """Whether the cached size of the shard is known to be below what the store copies."""
        entry = self.cache.peek(shard_key)
        return entry is not None and entry.size is not None and entry.size < self.kv.caps.tail_min_kept

    def _indexes(
        self, changes: Mapping[str, ShardChange]
    ) -> tuple[dict[str, tuple[ShardIndex, Generation, int]], set[str]]:
        """``(index, generation, size)`` of each stored shard of ``changes``, and the shards found not stored.

        A cached index is used when a zero-range ``get`` conditioned on its
        generation still holds (it tells the size too); the others' index
        bytes are read (one ranged ``get`` each, in one batch).
        """
        checked: list[tuple[str, ShardIndex]] = []
        reads: list[ReadRequest] = []
        for shard_key in changes:
            entry = self.cache.peek(shard_key)
            if entry is not None:
                checked.append((shard_key, entry.index))
                reads.append((shard_key, [], entry.generation))
        out: dict[str, tuple[ShardIndex, Generation, int]] = {}
        missing: set[str] = set()
        cached = {k for k, _ in checked}
        need = [k for k in changes if k not in cached]
        for (shard_key, index), result in zip(checked, self.kv.get_many(reads) if reads else [], strict=True):
            if result.found and result.size is not None:
                out[shard_key] = (index, result.generation, result.size)
            elif result.state == "stale":
                need.append(shard_key)
            elif result.state == "missing":
                missing.add(shard_key)
        if need:
            ranges = [(k, [changes[k].array.layout.index_range()], ANY) for k in need]
            for shard_key, result in zip(need, self.kv.get_many(ranges), strict=True):
                if result.state == "missing":
                    missing.add(shard_key)  # not stored: written whole, with no read
                if not result.found or result.size is None:
                    continue
                layout = changes[shard_key].array.layout
                index = layout.decode_index((result.values or [b""])[0], shard_key, result.size)
                out[shard_key] = (index, result.generation, result.size)
        return out, missing

    def _read_patched(
        self,
        plans: Mapping[str, tuple[TailHow, dict[LocalCoords, ChunkUpdate], ShardIndex, Generation, int]],
        patched: Mapping[str, list[LocalCoords]],
        lost: set[str],
    ) -> dict[str, dict[LocalCoords, BytesLike]]:
        """The old bytes of the chunks patches change, read conditioned on the generation planned on."""
        keys = list(patched)
        if not keys:
            return {}
        reads: list[ReadRequest] = []
        for shard_key in keys:
            index, generation = plans[shard_key][2], plans[shard_key][3]
            spans = [index.get(local) for local in patched[shard_key]]  # all stored: patches of absent chunks need none
            reads.append((shard_key, [ByteRange(s[0], s[0] + s[1]) for s in spans if s is not None], generation))
        out: dict[str, dict[LocalCoords, BytesLike]] = {}
        for shard_key, result in zip(keys, self.kv.get_many(reads), strict=True):
            if result.state != "value":
                lost.add(shard_key)  # changed since its index was read
                self.cache.discard(shard_key)
                continue
            out[shard_key] = dict(zip(patched[shard_key], result.values or [], strict=True))
        return out

    @staticmethod
    def _apply_patches(
        updates: Mapping[LocalCoords, ChunkUpdate], old: Mapping[LocalCoords, BytesLike]
    ) -> dict[LocalCoords, BytesLike | None]:
        """``updates`` with each patch applied to its chunk's old bytes (``ValueError``: a patch leaves a gap)."""
        return {k: v.apply(old.get(k)) if isinstance(v, ChunkPatch) else v for k, v in updates.items()}

    def recover(self, shards: Mapping[str, ShardedArray], locks: ShardLocks | None = None, repair: bool = True) -> bool:
        """Finish or undo the interrupted appends recorded in the held lock files of ``shards``; whether any was.

        Call holding the shards' locks (``locks``, default the engine's).
        Without lock files (or on a store without tail updates) there is
        nothing to recover. With ``repair`` false nothing is changed: whether
        any held lock file records an append not recovered.
        """
        if not self.kv.caps.tail_updates:
            return False
        found = False
        for fd, path in sorted(set((locks or self.locks).held_lock_files(shards).values())):
            if self.kv.recover_tail(fd, path, repair) is not None:
                found = True
        if found:
            for shard_key in shards:
                self.cache.discard(shard_key)
        return found


def _lead(index: ShardIndex) -> int:
    """Bytes before the first chunk of a shard whose index is at the end (a reserve, or chunks replaced)."""
    mask = index.present_mask()
    return int(index.entries[..., 0][mask].min()) if mask.any() else 0


def _shifted(index: ShardIndex, by: int) -> ShardIndex:
    """``index`` with every stored chunk's offset moved by ``by`` bytes."""
    out = index.copy()
    offsets = out.entries[..., 0]
    mask = out.present_mask()
    offsets[mask] = (offsets[mask].astype(np.int64) + by).astype(np.uint64)
    return out


def _dead(plan: TailPlan, reserve: int) -> float:
    """The fraction of the updated shard's bytes unused, not counting ``reserve`` leading dead bytes."""
    return dead_fraction(plan) if not reserve else (plan.nbytes - plan.used_nbytes - reserve) / (plan.nbytes - reserve)
