"""The one write path of the engine (:class:`ShardWriter`): shard read-modify-write conditioned on the generation read.

One bounded loop under the shards' locks, group commit of one shard's concurrent writes, and the O(chunk)
updates of stored shards a change covers in part (the changed chunks and a new index, planned by
:func:`~shardkv.format.tail.plan_tail_update`): docs/architecture.md, "The write path".
"""

from __future__ import annotations

import errno
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from shardkv._types import BytesLike, LocalCoords
from shardkv.engine.cache import IndexCache
from shardkv.engine.locks import ShardLocks, holds_shard_locks, lock_prefix
from shardkv.engine.merge import ChunkPatch, ChunkUpdate, ShardChange, join_changes, merge_chunks, out_of_grid
from shardkv.engine.options import Options
from shardkv.engine.reads import current_indexes
from shardkv.engine.retry import WRITE_ATTEMPTS, WRITE_BACKOFF, EngineStats, attempts
from shardkv.errors import ConcurrentUpdateError, CorruptShardError
from shardkv.format.layout import ShardIndex
from shardkv.format.ranges import ByteRange
from shardkv.format.tail import TailHow, TailPlan, dead_fraction, plan_tail_update
from shardkv.keys.space import ShardedArray
from shardkv.storage.kv import ANY, MISSING_RESULT, NO_VALUE, Generation, KVStore, ReadRequest, ReadResult, Value

_WRITERS: weakref.WeakSet[ShardWriter] = weakref.WeakSet()  # every writer of this process (a forked child forgets)

RESERVE_GROWTH = 2  # a shard gets a reserve when its expected size is at least this many times tail_min_kept


@dataclass(eq=False)
class _Commit:
    """One read-modify-write of one shard, for every change that joined it before it started.

    ``done`` is set once it finished, with ``error`` the exception that stopped it (``None``: every change
    is stored but those of ``refused``: position in ``changes`` -> why it was not).
    """

    changes: list[ShardChange] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    refused: dict[int, Exception] = field(default_factory=dict)


class ShardWriter:
    """The writes of a :class:`~shardkv.engine.engine.ShardEngine` (its ``writes``), on the engine's state.

    ``cache`` and ``stats`` are shared with the engine's reads; ``shard_updates`` and ``max_dead_fraction`` come
    from ``options``; a ``read_only`` writer's :meth:`repair` never changes a byte.

    Attributes
    ----------
    observe : callable or None
        Called with the changes of each :meth:`write` once stored (the zarr 2
        proxy's advice about chunk-by-chunk rewrites, set by write-back
        without a buffer).
    """

    def __init__(
        self, kv: KVStore, cache: IndexCache, locks: ShardLocks, stats: EngineStats, options: Options, read_only: bool
    ) -> None:
        self.kv = kv
        self.read_only = read_only
        self.cache = cache
        self.locks = locks
        self.stats = stats
        self.observe: Callable[[Mapping[str, ShardChange]], None] | None = None
        self._tails = options.shard_updates != "rewrite" and kv.caps.tail_updates
        self._in_place = options.shard_updates == "append" and locks.cross_process
        self._max_dead_fraction = options.max_dead_fraction
        caps = kv.caps
        # other processes write here and a delete cannot be conditioned (obstore): an emptied shard is put empty
        self._put_empty = locks.optimistic and caps.conditional_put and not caps.conditional_delete
        # the size written stays true while the generation holds, unless other processes write unseen
        self._sizes_hold = caps.stamps == "native" or caps.in_process
        self._guard = threading.Lock()
        self._next: dict[str, _Commit] = {}  # shard key -> the commit writes join (not started yet)
        self._running: dict[str, _Commit] = {}  # shard key -> the commit under way
        _WRITERS.add(self)

    def write(self, changes: Mapping[str, ShardChange], *, observed: bool = True) -> None:
        """Apply chunk changes grouped by shard: one batched read (partly covered shards), one batched write.

        A shard left with no chunk is deleted (or stored empty where a delete
        cannot be conditioned); chunks outside the chunk grid are dropped.
        Concurrent writes of the same shards are merged (group commit): the
        call returns once its changes are stored, and raises the error of any
        commit they went into.

        Parameters
        ----------
        changes : mapping of str to ShardChange
            Shard key -> the shard's chunk changes.
        observed : bool
            False: :attr:`observe` is not told (trims of a resize).

        Raises
        ------
        ValueError
            If a :class:`~shardkv.engine.merge.ChunkPatch` would leave a gap in
            its chunk (that shard is left as it was; the call's other shards
            are stored).
        LockTimeoutError
            If a shard lock was not obtained within the lock timeout.
        ConcurrentUpdateError
            If a shard's conditional write lost its race in every round (mode ``"conditional"``).
        """
        if not changes:
            return
        led: dict[str, _Commit] = {}
        joined: list[tuple[_Commit, int]] = []
        try:
            with self._guard:
                for shard_key, change in changes.items():
                    commit = self._next.get(shard_key)
                    if commit is None:
                        commit = self._next[shard_key] = led[shard_key] = _Commit()
                    if shard_key in self._running:
                        self.stats.writes_queued += 1
                    joined.append((commit, len(commit.changes)))
                    commit.changes.append(change)
            if led:
                self._run(led)
        except BaseException as exc:  # interrupted: the commits this call started and never ran would wait forever
            self._end(led, dict.fromkeys(led, exc))
            raise
        for commit, _ in joined:
            commit.done.wait()  # bounded: its writer runs one bounded write (lock timeout, write attempts)
        for commit, position in joined:
            error = commit.error if commit.error is not None else commit.refused.get(position)
            if error is not None:
                raise error
        if observed and self.observe is not None:
            self.observe(changes)

    def _end(self, led: dict[str, _Commit], errors: Mapping[str, BaseException]) -> None:
        """End the commits of ``led`` not ended yet (nothing else would), each with its error (none: stored)."""
        with self._guard:
            for shard_key, commit in led.items():
                if commit.done.is_set():
                    continue
                for table in (self._next, self._running):
                    if table.get(shard_key) is commit:
                        del table[shard_key]
                commit.error = errors.get(shard_key)
                commit.done.set()

    def _run(self, led: dict[str, _Commit]) -> None:
        """Run the commits this call started, after the running commits of their shards, as one write.

        Raises only when interrupted; every other error is kept on the commits, for their writers.
        """
        for shard_key in led:  # only this call starts these shards' next commits: none can start meanwhile
            with self._guard:
                before = self._running.get(shard_key)
            if before is not None:
                before.done.wait()
        with self._guard:
            for shard_key, commit in led.items():
                del self._next[shard_key]
                self._running[shard_key] = commit
        errors: dict[str, BaseException] = {}
        try:
            joined: dict[str, ShardChange] = {}
            refused: dict[str, Exception] = {}
            for shard_key, commit in led.items():
                try:
                    joined[shard_key] = join_changes(commit.changes)
                except ValueError as refusal:
                    refused[shard_key] = refusal
            lost = self._write_held(joined, refused)
            errors = {k: ConcurrentUpdateError(k, WRITE_ATTEMPTS, WRITE_ATTEMPTS) for k in lost}
            for shard_key, why in refused.items():
                if len(led[shard_key].changes) == 1:
                    errors[shard_key] = why
                else:  # which change was refused is known only one at a time: the others are stored
                    self._write_one_by_one(shard_key, led[shard_key])
        except BaseException as exc:  # which of the shards were stored is unknown: every writer of them is told
            errors = dict.fromkeys(led, exc)
            if not isinstance(exc, Exception):
                raise  # interrupted: the writers waiting are still told, below
        finally:
            self._end(led, errors)

    def _write_one_by_one(self, shard_key: str, commit: _Commit) -> None:
        """Write the changes of ``commit`` (one shard) one after another, keeping each one's error in ``refused``."""
        for position, change in enumerate(commit.changes):
            refused: dict[str, Exception] = {}
            if self._write_held({shard_key: change}, refused):  # lost in every round
                refused[shard_key] = ConcurrentUpdateError(shard_key, WRITE_ATTEMPTS, WRITE_ATTEMPTS)
            if shard_key in refused:
                commit.refused[position] = refused[shard_key]

    def _write_held(self, changes: Mapping[str, ShardChange], refused: dict[str, Exception]) -> dict[str, ShardChange]:
        """The bounded rounds of one write under its shards' locks: the changes still lost (those the merge
        refuses go into ``refused``)."""
        todo = dict(changes)
        shards = {k: c.array for k, c in todo.items()}
        with self.locks.hold_arrays(shards) as marked:
            if marked:  # an in-place append its writer did not finish: kept or undone first
                self._recover(marked, shards)
            rounds: Iterator[int] | None = None  # the retry loop, only once a round lost a race
            while True:
                self.stats.write_attempts += 1
                todo = self._write_round(todo, refused)
                if not todo:
                    return {}
                self.stats.write_lost += len(todo)
                rounds = rounds or attempts(WRITE_ATTEMPTS, WRITE_BACKOFF, made=1)
                if next(rounds, None) is None:
                    return todo

    def _write_round(self, changes: Mapping[str, ShardChange], refused: dict[str, Exception]) -> dict[str, ShardChange]:
        """One read-merge-put round; the changes of the shards whose conditional put lost.

        A shard whose change the merge refuses (a patch leaving a gap) goes into ``refused``, unwritten.
        """
        kv, cache, optimistic = self.kv, self.cache, self.locks.optimistic
        partial = [k for k, c in changes.items() if not c.covers_shard()]
        lost: dict[str, ShardChange] = {}
        old: dict[str, ReadResult] = {}
        if partial and self._tails:  # stored shards covered in part: their changed chunks only, where it pays
            done, tail_lost, missing = self._update_tails({k: changes[k] for k in partial}, refused)
            lost = {k: changes[k] for k in tail_lost}
            old = dict.fromkeys(missing, MISSING_RESULT)  # read just now: not stored
            if done or tail_lost or refused:
                gone = done | tail_lost | refused.keys()
                changes = {k: c for k, c in changes.items() if k not in gone}
                partial = [k for k in partial if k in changes]
        unread = [k for k in partial if k not in old]
        if unread:
            old.update(zip(unread, kv.get_many([(k, None, ANY) for k in unread]), strict=True))
        puts: dict[str, tuple[Value | None, Generation]] = {}
        indexes: dict[str, tuple[ShardIndex, int]] = {}  # of the shards put with chunks
        for shard_key, change in changes.items():
            arr = change.array
            before = old.get(shard_key)
            stored = before is not None and before.found
            chunks = arr.layout.chunks_of_shard(before.whole(), shard_key) if before is not None and stored else {}
            try:
                merged = merge_chunks(arr, change.shard_coords, chunks, change.chunks)
            except ValueError as exc:  # this shard's change is refused; the round's other shards are written
                refused[shard_key] = exc
                continue
            condition = ANY  # written whole (blind), or under a lock
            if before is not None and optimistic:
                condition = before.generation if stored else NO_VALUE
            cache.discard(shard_key)
            if merged or (stored and self._put_empty):
                parts, index = self._reserve(change, *arr.layout.encode_shard_with_index(merged))
                puts[shard_key] = (parts, condition)
                indexes[shard_key] = (index, _nbytes(parts))
            elif stored:
                puts[shard_key] = (None, condition)
        won = kv.put_many(puts) if puts else {}
        for shard_key, generation in won.items():
            if generation is None:
                lost[shard_key] = changes[shard_key]
                continue
            if shard_key in indexes:
                new_index, size = indexes[shard_key]
                cache.put(shard_key, new_index, generation, size if self._sizes_hold else None)
        return lost

    # -- O(chunk) updates of stored shards -------------------------------------------------

    def _tail_how(self, shard_key: str, arr: ShardedArray) -> TailHow | None:
        """How an update of some chunks of the stored shard is written in O(chunk); ``None``: rewritten whole.

        ``"clone"`` where the store clones the shard; ``"append"`` where it does not, ``shard_updates="append"``
        in mode ``"files"`` and the layout has a CRC32C'd index at the end (a torn tail then fails the CRC32C).
        """
        how = self.kv.tail_method(shard_key, self._in_place)
        layout, minimum = arr.layout, self.kv.caps.tail_min_kept
        if minimum:  # the update would keep fewer bytes than the store copies: written whole, no index read
            entry = self.cache.peek(shard_key)
            size = None if entry is None else entry.size
            if layout.index_location == "start" or (size is not None and size < minimum):
                return None
        if how == "clone" or (how == "append" and layout.index_location == "end" and layout.index_checksum):
            return how
        return None

    def _update_tails(
        self, changes: Mapping[str, ShardChange], refused: dict[str, Exception]
    ) -> tuple[set[str], set[str], set[str]]:
        """Update the stored shards of ``changes`` (each covered in part) in O(chunk) where it pays.

        Returns the shards written, those changed since their index was read (lost) and those not stored. A
        shard whose patch leaves a gap goes into ``refused``; the others are left for a whole rewrite (too many
        dead bytes, no chunk left, or fewer bytes kept than the store copies).
        """
        hows: dict[str, TailHow] = {}
        for shard_key, change in changes.items():  # first where it can pay: no index read for a whole rewrite
            how = self._tail_how(shard_key, change.array)
            if how is not None:
                hows[shard_key] = how
        if not hows:
            return set(), set(), set()
        states = current_indexes(self.kv, self.cache, {k: changes[k].array for k in hows}, None)
        missing = hows.keys() - states.keys()  # not stored: written whole, with no read
        written: set[str] = set()
        lost: set[str] = set()
        plans: dict[str, tuple[TailHow, dict[LocalCoords, ChunkUpdate], ShardIndex, Generation, int]] = {}
        patched: dict[str, list[LocalCoords]] = {}
        reads: list[ReadRequest] = []  # the old bytes of the stored chunks patches change
        for shard_key, entry in states.items():
            index, generation, size = entry.index, entry.generation, entry.size
            if size is None:
                continue  # rewritten whole
            change = changes[shard_key]
            # what a merge drops (chunks a shrinking resize left outside the grid), then the changes; patches are
            # applied below, to the old chunks read
            dropped = out_of_grid(change.array, change.shard_coords, index.present())
            updates: dict[LocalCoords, ChunkUpdate] = {**dict.fromkeys(dropped), **change.chunks}
            spans = {k: index.get(k) for k, v in updates.items() if isinstance(v, ChunkPatch)}
            stored = {k: span for k, span in spans.items() if span is not None}
            if stored:
                patched[shard_key] = list(stored)
                reads.append((shard_key, [ByteRange(o, o + n) for o, n in stored.values()], generation))
            plans[shard_key] = (hows[shard_key], updates, index, generation, size)
        old_chunks: dict[str, dict[LocalCoords, BytesLike]] = {}
        for (shard_key, _, _), result in zip(reads, self.kv.get_many(reads) if reads else [], strict=True):
            if result.state != "value":  # changed since its index was read
                lost.add(shard_key)
                self.cache.discard(shard_key)
            else:
                old_chunks[shard_key] = dict(zip(patched[shard_key], result.values or [], strict=True))
        for shard_key, (how, updates, index, generation, size) in plans.items():
            if shard_key in lost:
                continue
            change = changes[shard_key]
            old = old_chunks.get(shard_key, {})
            try:
                whole = {k: v.apply(old.get(k)) if isinstance(v, ChunkPatch) else v for k, v in updates.items()}
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
            # rewritten whole: no chunk left (a delete), too many dead bytes, or fewer bytes kept than the store
            # copies (S3: 5 MiB)
            if plan.index.is_empty() or _dead(plan, reserve) > self._max_dead_fraction or plan.kept_nbytes < minimum:
                continue
            drop = lead if lead and plan.kept_nbytes - lead >= minimum else 0  # the leading dead bytes can go
            writes, new_index, nbytes = plan.writes, plan.index, plan.nbytes
            if drop:
                new_index = _shifted(plan.index, -drop)
                parts = plan.writes[0][1]
                writes = [(plan.kept_nbytes - drop, [*parts[:-1], layout.encode_index(new_index)])]
                nbytes -= drop
            intent = self.locks.held_lock_file(shard_key, change.array) if how == "append" else None
            if how == "append" and intent is None:
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

    def _reserve(
        self, change: ShardChange, parts: list[BytesLike], index: ShardIndex
    ) -> tuple[list[BytesLike], ShardIndex]:
        """The shard ``change`` writes whole (``parts``, ``index``), led by a reserve of zero bytes where it pays.

        Where updates must keep ``tail_min_kept`` bytes (S3), a shard written whole by a change that covers it in
        part, holding fewer bytes than that but expected to hold :data:`RESERVE_GROWTH` times as many (its chunks'
        mean size times its chunks in the grid), is led by the zero bytes that make its chunks and reserve
        ``tail_min_kept``, so its next updates are O(chunk) where they would rewrite it whole until it has grown
        that much. The reserve is dead bytes (at most ``tail_min_kept`` a shard), dropped by the first update that
        keeps as many bytes after it, or by ``compact``. Other shards are returned as they are.
        """
        minimum, layout = self.kv.caps.tail_min_kept, change.array.layout
        if not (self._tails and minimum and layout.index_location == "end" and index.count_present()):
            return parts, index
        data = sum(memoryview(p).nbytes for p in parts[:-1])
        n = change.array.n_chunks_in_shard(change.shard_coords)
        grows = data * n >= RESERVE_GROWTH * minimum * index.count_present()
        if data >= minimum or not grows or change.covers_shard() or index.count_present() >= n:
            return parts, index
        reserved = _shifted(index, minimum - data)
        return [bytes(minimum - data), *parts[:-1], layout.encode_index(reserved)], reserved

    def _recover(self, marked: Sequence[tuple[int, str]], shards: Iterable[str], repair: bool = True) -> bool:
        """Finish or undo the appends recorded in the held lock files ``marked`` (``(fd, path)``); whether any was.

        With ``repair`` false nothing is changed: whether any of them records an append not recovered. (Only
        stores with O(chunk) updates append: the others find none.)
        """
        found = [fd for fd, path in marked if self.kv.recover_tail(fd, path, repair) is not None]
        for shard_key in shards if found else ():
            self.cache.discard(shard_key)
        return bool(found)

    # -- whole shards, compaction, repair -------------------------------------------------

    def erase(self, shards: Mapping[str, ShardedArray]) -> None:
        """Delete whole shards (unconditionally, holding their locks) and forget their indexes."""
        if not shards:
            return
        with self.locks.hold_arrays(shards):
            for shard_key in shards:
                self.cache.discard(shard_key)
            self.kv.put_many({k: (None, ANY) for k in shards})

    def compact(self, arr: ShardedArray, shard_keys: Iterable[str] | None = None) -> int:
        """Rewrite the array's stored shards that hold unused bytes, each holding its lock; the bytes reclaimed.

        Interrupted appends are finished or undone first and old incomplete
        uploads aborted; a shard another writer changed meanwhile is left.

        Parameters
        ----------
        arr : ShardedArray
            The array.
        shard_keys : iterable of str, optional
            Its shards to look at (default: every shard of its shard grid).

        Raises
        ------
        LockTimeoutError, CorruptShardError, OSError
            As :meth:`write`; for a damaged shard.
        """
        kv, cache = self.kv, self.cache
        kv.abort_incomplete_writes(arr.key_prefix)
        keys = (k for k, _ in arr.shard_keys()) if shard_keys is None else shard_keys
        reclaimed = 0
        for shard_key in keys:
            with self.locks.hold_arrays({shard_key: arr}) as marked:
                self._recover(marked, [shard_key])
                result = kv.get(shard_key)
                if not result.found:
                    continue
                blob, layout = result.whole(), arr.layout
                index = layout.index_of_shard(blob, shard_key)
                size = len(memoryview(blob).cast("B"))
                if size - layout.index_nbytes - index.used_nbytes() <= 0:
                    continue
                parts, new_index = layout.encode_shard_with_index(layout.chunks_of_shard(blob, shard_key, index))
                new_size = _nbytes(parts)
                cache.discard(shard_key)
                generation = kv.put(shard_key, parts, if_generation=result.generation if self.locks.optimistic else ANY)
                if generation is None:
                    continue  # changed by another writer: its shard stays, compacted next time
                cache.put(shard_key, new_index, generation, new_size)
                reclaimed += size - new_size
        return reclaimed

    def repair(self, shard_key: str, arr: ShardedArray) -> bool:
        """Let an in-place append in the lock file of ``shard_key`` finish, or recover it; whether to read again.

        What a read that met a damaged index asks (docs/architecture.md, "The
        write path"): False where no append can be (no tail updates, no lock
        directory) or this thread holds shard locks. A read-only engine takes
        only an existing lock file and changes nothing.

        Raises
        ------
        CorruptShardError
            When this account may not open the lock file, or the file system
            is mounted read-only, or (read-only engine) the lock file records
            an append: the message names the shard and how an account that may
            write the array repairs it.
        LockTimeoutError, OSError
            As :meth:`write`.
        """
        if not self.kv.caps.tail_updates or not self.kv.caps.lock_dir or holds_shard_locks():
            return False
        locks = self.locks if self.locks.cross_process else ShardLocks(self.kv.location, "files", self.locks.timeout)
        lock_file = locks.lock_file(shard_key, lock_prefix(arr))
        if lock_file is None or not os.path.isdir(os.path.dirname(lock_file)):
            return False  # no writer with lock files, so no append, was there
        where = self.kv.location.local_dir or self.kv.location.root
        array = f" --array {arr.path}" if arr.path else ""
        if self.read_only and not os.path.exists(lock_file):
            return False  # no append was recorded for this shard: the damage is reported as it is
        try:
            with locks.hold_arrays({shard_key: arr}, make=not self.read_only) as marked:
                recorded = self._recover(marked, [shard_key], repair=not self.read_only)
        except FileNotFoundError:
            if not self.read_only:
                raise
            return False  # its lock file was removed meanwhile (the array deleted): no append recorded there
        except OSError as exc:
            if not isinstance(exc, PermissionError) and exc.errno != errno.EROFS:
                raise
            raise CorruptShardError(
                shard_key,
                "its index does not decode, and this reader cannot take the shard's lock file to repair an "
                f"in-place append (shard_updates='append') a killed writer may have left ({exc.strerror}): "
                f"as an account that may write the array, run `shardkv compact {where}{array}` or write to it",
            ) from exc
        if recorded and self.read_only:
            raise CorruptShardError(
                shard_key,
                "its index does not decode, and the shard's lock file records an in-place append "
                "(shard_updates='append') a killed writer left; a read-only store does not repair it: "
                f"run `shardkv compact {where}{array}` (or write to the array) to finish or undo it",
            )
        return True

    def rewrites_whole(self, shard_key: str, arr: ShardedArray) -> bool:
        """Whether an update of some chunks of ``shard_key`` rewrites it whole (an error examining it: True)."""
        try:
            return not self._tails or self._tail_how(shard_key, arr) is None
        except OSError:
            return True


def _forget_commits_after_fork() -> None:  # the parent's threads, and their commits, are not in the child
    for writer in list(_WRITERS):
        writer._guard, writer._next, writer._running = threading.Lock(), {}, {}


os.register_at_fork(after_in_child=_forget_commits_after_fork)


def _nbytes(parts: Sequence[BytesLike]) -> int:
    """Total bytes of a shard's parts (``len`` at C speed when they are all ``bytes``)."""
    if set(map(type, parts)) == {bytes}:
        return sum(map(len, parts))
    return sum([memoryview(p).nbytes for p in parts])


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
