"""The one write path of the engine (:class:`ShardWriter`): shard read-modify-write conditioned on the generation read.

:meth:`ShardWriter.write` holds the shards' locks and runs one bounded loop:
one batched whole-shard ``get`` of the shards covered only in part, the merge
(:func:`~shardkv.engine.merge.merge_chunks`), one batched ``put`` (conditioned
in mode ``"conditional"``; blind for shards written whole), the winners'
indexes cached; only shards that lost their race go round again. Writes of one
shard made at once by threads of one engine are merged (group commit). Both
are described in docs/architecture.md, "The write path".
"""

from __future__ import annotations

import errno
import os
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from shardkv._types import BytesLike
from shardkv.engine.cache import IndexCache
from shardkv.engine.locks import ShardLocks, holds_shard_locks, lock_prefix
from shardkv.engine.merge import ShardChange, join_changes, merge_chunks
from shardkv.engine.retry import WRITE_ATTEMPTS, WRITE_BACKOFF, EngineStats, attempts
from shardkv.engine.tail import TailUpdater
from shardkv.errors import ConcurrentUpdateError, CorruptShardError
from shardkv.format.layout import ShardIndex
from shardkv.keys.space import ShardedArray
from shardkv.storage.kv import ANY, MISSING_RESULT, NO_VALUE, Generation, KVStore, ReadResult, Value

_WRITERS: weakref.WeakSet[ShardWriter] = weakref.WeakSet()
"""Every writer of this process (a forked child forgets their commits)."""


@dataclass(eq=False)
class _Commit:
    """One read-modify-write of one shard, for every change that joined it before it started.

    ``done`` is set once the commit has finished, with ``error`` the
    exception that stopped it (``None``: every change of it is stored, but
    those of ``refused``: position in ``changes`` -> why it was not stored).
    """

    changes: list[ShardChange] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    refused: dict[int, Exception] = field(default_factory=dict)


class ShardWriter:
    """The writes of a :class:`~shardkv.engine.engine.ShardEngine` (its ``writes``), on the engine's state.

    Parameters
    ----------
    kv : KVStore
        The base store.
    cache : IndexCache
        Decoded indexes (a written shard's is replaced by the one written;
        shared with the engine's reads).
    locks : ShardLocks
        The shard locks, in the engine's concurrency mode.
    stats : EngineStats
        Counters the writes update (shared with the engine's reads).
    shard_updates : {"auto", "append", "rewrite"}
        How updates of some chunks of stored shards are written
        (:class:`~shardkv.engine.options.Options`; :mod:`shardkv.engine.tail`).
    max_dead_fraction : float
        Largest fraction of unused bytes an updated shard may keep before it is rewritten whole.
    read_only : bool
        The engine of a read-only store: :meth:`repair` never changes a byte.
    """

    def __init__(
        self,
        kv: KVStore,
        cache: IndexCache,
        locks: ShardLocks,
        stats: EngineStats,
        shard_updates: str = "auto",
        max_dead_fraction: float = 0.5,
        read_only: bool = False,
    ) -> None:
        self.kv = kv
        self.read_only = read_only
        self.cache = cache
        self.locks = locks
        self.stats = stats
        self.tail = TailUpdater(kv, cache, locks, stats, shard_updates, max_dead_fraction)
        self._guard = threading.Lock()
        self._next: dict[str, _Commit] = {}  # shard key -> the commit writes join (not started yet)
        self._running: dict[str, _Commit] = {}  # shard key -> the commit under way
        _WRITERS.add(self)

    def _forget_commits(self) -> None:
        """Start with no commit (in a forked child: the parent's threads, and the commits they ran, are not there)."""
        self._guard = threading.Lock()
        self._next = {}
        self._running = {}

    def write(self, changes: Mapping[str, ShardChange]) -> None:
        """Apply chunk changes grouped by shard: one batched read (partly covered shards), one batched write.

        A shard left with no chunk is deleted (where deletes cannot be
        conditioned, in mode ``"conditional"``, it is stored as an empty shard
        instead, which readers read as fill values). Chunks outside the chunk
        grid are dropped. See the module docstring for the rounds. Writes of
        the same shards made meanwhile by other threads are merged with these
        (group commit, module docstring); the call returns once every change
        it made is stored, and raises the error of any commit they went into.

        Parameters
        ----------
        changes : mapping of str to ShardChange
            Shard key -> the shard's chunk changes.

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
            self._abandon(led, exc)
            raise
        for commit, _ in joined:
            commit.done.wait()  # bounded: its writer runs one bounded write (lock timeout, write attempts)
        for commit, position in joined:
            error = commit.error if commit.error is not None else commit.refused.get(position)
            if error is not None:
                raise error

    def _abandon(self, led: dict[str, _Commit], exc: BaseException) -> None:
        """End the commits of ``led`` that did not finish, telling their writers ``exc``.

        Called once this call's :meth:`_run` is over: a commit of ``led`` not
        done by then never ran (still next, or moved to running just before
        the interruption), and nothing else would end it.
        """
        with self._guard:
            for shard_key, commit in led.items():
                if commit.done.is_set():
                    continue
                for table in (self._next, self._running):
                    if table.get(shard_key) is commit:
                        del table[shard_key]
                commit.error = exc
                commit.done.set()

    def _run(self, led: dict[str, _Commit]) -> None:
        """Run the commits this call started: after the running commits of their shards, as one write.

        Raises only when interrupted (not an ``Exception``): every other error
        is kept on the commits, for their writers.
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
            lost, refused_now = self._write_held(joined)
            refused.update(refused_now)
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
            with self._guard:
                for shard_key, commit in led.items():
                    del self._running[shard_key]
                    commit.error = errors.get(shard_key)
                    commit.done.set()

    def _write_one_by_one(self, shard_key: str, commit: _Commit) -> None:
        """Write the changes of ``commit`` (one shard) one after another, keeping each one's error in ``refused``."""
        for position, change in enumerate(commit.changes):
            lost, refused = self._write_held({shard_key: change})
            if shard_key in refused:
                commit.refused[position] = refused[shard_key]
            elif lost:
                commit.refused[position] = ConcurrentUpdateError(shard_key, WRITE_ATTEMPTS, WRITE_ATTEMPTS)

    def _write_held(self, changes: Mapping[str, ShardChange]) -> tuple[dict[str, ShardChange], dict[str, Exception]]:
        """The bounded rounds of one write, holding its shards' locks.

        Returns the changes still lost after the last round, and the shards
        whose changes the merge refused (shard key -> its ``ValueError``;
        nothing of those shards is written).
        """
        todo = dict(changes)
        refused: dict[str, Exception] = {}
        shards = {k: c.array for k, c in todo.items()}
        with self.locks.hold_arrays(shards):
            self.tail.recover(shards)  # an in-place append its writer did not finish: kept or undone first
            rounds: Iterator[int] | None = None  # the retry loop, only once a round lost a race
            while True:
                self.stats.write_attempts += 1
                todo = self._write_round(todo, refused)
                if not todo:
                    return {}, refused
                self.stats.write_lost += len(todo)
                rounds = rounds or attempts(WRITE_ATTEMPTS, WRITE_BACKOFF, made=1)
                if next(rounds, None) is None:
                    return todo, refused

    def _write_round(self, changes: Mapping[str, ShardChange], refused: dict[str, Exception]) -> dict[str, ShardChange]:
        """One read-merge-put round; the changes of the shards whose conditional put lost.

        A shard whose changes the merge refuses (``ValueError``: a patch that
        would leave a gap) is put into ``refused`` and not written; the others are.
        """
        kv, cache, optimistic = self.kv, self.cache, self.locks.optimistic
        partial = [k for k, c in changes.items() if not c.covers_shard()]
        lost: dict[str, ShardChange] = {}
        old: dict[str, ReadResult] = {}
        if partial and self.tail.enabled:  # stored shards covered in part: their changed chunks only, where it pays
            done, tail_lost, missing = self.tail.update({k: changes[k] for k in partial}, refused)
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
        indexes: dict[str, tuple[ShardIndex | None, int]] = {}
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
            if before is None:
                condition = ANY  # written whole: blind
            elif optimistic:
                condition = before.generation if stored else NO_VALUE
            else:
                condition = ANY
            cache.discard(shard_key)
            if merged:
                parts, index = self.tail.reserve(change, *arr.layout.encode_shard_with_index(merged))
                puts[shard_key] = (parts, condition)
                indexes[shard_key] = (index, _nbytes(parts))
            elif stored and optimistic and kv.caps.conditional_put and not kv.caps.conditional_delete:
                # other processes write here and a delete cannot be conditioned (obstore): an empty shard, swapped in
                parts, index = arr.layout.encode_shard_with_index({})
                puts[shard_key] = (parts, condition)
                indexes[shard_key] = (index, _nbytes(parts))
            elif stored:
                puts[shard_key] = (None, condition)
                indexes[shard_key] = (None, 0)
        won = kv.put_many(puts) if puts else {}
        # the size written stays true while the generation holds, unless other processes write unseen
        sizes_hold = kv.caps.stamps == "native" or kv.caps.in_process
        for shard_key, generation in won.items():
            if generation is None:
                lost[shard_key] = changes[shard_key]
                continue
            new_index, size = indexes[shard_key]
            if new_index is not None:
                cache.put(shard_key, new_index, generation, size if sizes_hold else None)
        return lost

    def erase(self, shards: Mapping[str, ShardedArray]) -> None:
        """Delete whole shards (unconditionally, holding their locks) and forget their indexes."""
        if not shards:
            return
        with self.locks.hold_arrays(shards):
            for shard_key in shards:
                self.cache.discard(shard_key)
            self.kv.put_many({k: (None, ANY) for k in shards})

    def compact(self, arr: ShardedArray, shard_keys: Iterable[str] | None = None) -> int:
        """Rewrite the array's stored shards that hold unused bytes; the bytes reclaimed.

        Unused bytes are those of chunks replaced by O(chunk) updates and their
        old indexes (:mod:`shardkv.engine.tail`), or left by other writers. An
        in-place append interrupted by a killed writer is finished or undone
        first (:meth:`repair`); the incomplete multipart uploads killed
        writers left under the array's prefix on S3 are aborted
        (:meth:`~shardkv.storage.kv.KVStore.abort_incomplete_writes`).
        Each shard is compacted holding its lock; in mode ``"conditional"`` the
        new shard is written only if the shard is still the one read (a shard
        another writer changed meanwhile is left for the next compaction).

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
            with self.locks.hold_arrays({shard_key: arr}):
                self.tail.recover({shard_key: arr})  # an interrupted in-place append is repaired first
                result = kv.get(shard_key)
                if not result.found:
                    continue
                blob = result.whole()
                index = arr.layout.index_of_shard(blob, shard_key)
                size = len(memoryview(blob).cast("B"))
                if size - arr.layout.index_nbytes - index.used_nbytes() <= 0:
                    continue
                parts, new_index = arr.layout.encode_shard_with_index(
                    arr.layout.chunks_of_shard(blob, shard_key, index)
                )
                new_size = _nbytes(parts)
                cache.discard(shard_key)
                condition = result.generation if self.locks.optimistic else ANY
                generation = kv.put(shard_key, parts, if_generation=condition)
                if generation is None:
                    continue  # changed by another writer: its shard stays, compacted next time
                cache.put(shard_key, new_index, generation, new_size)
                reclaimed += size - new_size
        return reclaimed

    def repair(self, shard_key: str, arr: ShardedArray) -> bool:
        """Let an in-place append in the stripe of ``shard_key`` finish, or recover it; whether to read again.

        What a read that met a damaged index asks before it reads once more: it
        takes the shard's lock file, so it waits for a live writer's append to
        end (a killed writer's lock is gone), and recovers the append the lock
        file records, if any. An engine without lock files of its own (a
        read-only zarr 3 store resolves to mode ``"none"``) takes the shard's
        lock file for this, where the array has a lock directory already (a
        writer in mode ``"files"`` made it; none is made here). False (the
        damage is reported as it is) on stores without tail updates, where no
        lock directory exists (no writer with lock files, so no append, was
        there), or when this thread holds shard locks already (it would wait
        for itself).

        A read-only engine (:attr:`read_only`) changes nothing: it takes the
        lock file only if it exists (none is made), so it still waits for a
        live writer's append, and then reads again if no append is recorded
        there, else raises.

        Raises
        ------
        CorruptShardError
            When this account may not open the lock file, or the file system
            is mounted read-only, or (read-only engine) the lock file records
            an append: the message names the shard and how an account that may
            write the array repairs an interrupted append.
        LockTimeoutError, OSError
            As :meth:`write`.
        """
        if not self.kv.caps.tail_updates or not self.kv.caps.lock_dir or holds_shard_locks():
            return False
        locks = self.locks
        if not locks.cross_process:
            locks = ShardLocks(self.kv.location, mode="files", timeout=self.locks.timeout)
        if not locks.has_lock_dir(arr):
            return False
        where = self.kv.location.local_dir or self.kv.location.root
        array = f" --array {arr.path}" if arr.path else ""
        if self.read_only:
            ((lock_dir, (stripe,)),) = locks.file_stripes_by_dir([shard_key], {shard_key: lock_prefix(arr)}).items()
            if not os.path.exists(os.path.join(lock_dir, f"{stripe}.lock")):
                return False  # no append was recorded for this shard: the damage is reported as it is
        try:
            with locks.hold_arrays({shard_key: arr}, make=not self.read_only):  # read-only: no file made, no mode
                recorded = self.tail.recover({shard_key: arr}, locks, repair=not self.read_only)
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
        """Whether an update of some chunks of ``shard_key`` rewrites it whole (no O(chunk) path: :mod:`.tail`).

        An error examining the shard's directory answers True (what is then done).
        """
        try:
            return self.tail.method(shard_key, arr) is None
        except OSError:
            return True

    def hold(self, shards: Mapping[str, ShardedArray]) -> AbstractContextManager[None]:
        """The locks of ``shards`` for a ``with`` block (for a caller's own reads and puts; not re-entrant:
        a :meth:`write` in it waits for the locks its own thread holds, until the lock timeout).
        """
        return self.locks.hold_arrays(shards)


def _forget_commits_after_fork() -> None:
    for writer in list(_WRITERS):
        writer._forget_commits()


os.register_at_fork(after_in_child=_forget_commits_after_fork)


def _nbytes(parts: Sequence[BytesLike]) -> int:
    """Total bytes of a shard's parts (``len`` at C speed when they are all ``bytes``)."""
    if set(map(type, parts)) == {bytes}:
        return sum(map(len, parts))
    return sum([memoryview(p).nbytes for p in parts])
