"""Shard writes as compare-and-swap transactions over an object store (issue 9, item 3).

An object store has no lock that other processes respect, so a shard write
(read the old shard, merge the new chunks, write the new shard) must instead
*notice* that another writer changed the shard in between, and start over.

:class:`GenerationTrackingAdapter` wraps the base store's adapter: inside a
transaction it remembers the generation of every value it reads whole
(``get`` / ``get_many``: the old shards a write merges into) and makes every
write of such a value conditional on that generation. A lost race raises
:class:`LostRaceError`; :func:`run_conditionally` then re-runs the whole write
(a fresh read and merge), with backoff, a bounded number of times.

Re-running a whole multi-shard write is correct because a write only
*replaces* chunk values (or deletes them): applying it again to a newer
shard, including one that already holds part of it, gives the same result.
Values written without being read first (shards the write covers whole) are
written unconditionally: a whole-shard write replaces every chunk, which is
last-writer-wins per chunk, as plain Zarr is.

Only the ``"rewrite"`` write strategy fits (positional ``append`` /
``inplace`` writes exist only on local files, which use lock files instead).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Hashable, Iterable, Iterator, Mapping, Sequence, TypeVar

from shardkv.engine.retry import Backoff, RetryStats
from shardkv.errors import ConcurrentUpdateError, ConfigurationError, LostRaceError
from shardkv.format.ranges import ByteRange
from shardkv.storage.adapters import StoreAdapter
from shardkv.storage.buffers import join_parts
from shardkv.storage.conditional import ConditionalStore

__all__ = ["GenerationTrackingAdapter", "run_conditionally"]

R = TypeVar("R")


class _Transaction(threading.local):
    active: bool = False
    generations: dict[str, Hashable]


class GenerationTrackingAdapter(StoreAdapter):
    """An adapter whose whole-value reads and writes are generation-checked inside a transaction.

    Parameters
    ----------
    inner : StoreAdapter
        The adapter over the base store (every call outside a transaction,
        and every non-tracked call, goes to it unchanged).
    conditional : ConditionalStore
        Generation-aware reads and writes of the same store.

    Notes
    -----
    Transactions are per thread: each thread's :func:`run_conditionally`
    tracks its own reads.
    """

    def __init__(self, inner: StoreAdapter, conditional: ConditionalStore) -> None:
        self.inner = inner
        self.conditional = conditional
        self.supports_ranges = inner.supports_ranges
        self.round_trips = getattr(inner, "round_trips", False)
        self._tx = _Transaction()

    # -- transactions -----------------------------------------------------------

    def begin(self) -> None:
        """Start tracking this thread's reads."""
        self._tx.active = True
        self._tx.generations = {}

    def end(self) -> None:
        """Stop tracking; later calls go straight to the inner adapter."""
        self._tx.active = False
        self._tx.generations = {}

    def _tracking(self) -> bool:
        return bool(getattr(self._tx, "active", False))

    def generation_of(self, key: str) -> Hashable:
        """The generation this thread's transaction last read or wrote for ``key``; ``None`` when unknown.

        After a conditional write, the generation of the value written: an
        index built for that value can be cached with it.
        """
        if not self._tracking():
            return None
        return self._tx.generations.get(key)

    # -- tracked calls ----------------------------------------------------------

    def get(self, key: str) -> bytes:
        if not self._tracking():
            return self.inner.get(key)
        value, generation = self.conditional.read_with_generation(key)
        self._tx.generations[key] = generation
        if value is None:
            raise KeyError(key)
        return value

    def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        if not self._tracking():
            return self.inner.get_many(keys)
        out = {}
        keys = list(keys)
        found = self.conditional.read_many_with_generation([(key, None) for key in keys])  # concurrently
        for key, (value, generation) in zip(keys, found):
            self._tx.generations[key] = generation  # None: "was not stored", also a condition
            if value is not None:
                out[key] = value
        return out

    def set_many(self, values: Mapping[str, bytes]) -> None:
        if not self._tracking():
            self.inner.set_many(values)
            return
        blind = {}
        for key, value in values.items():
            if key not in self._tx.generations:
                blind[key] = value
                continue
            ok, generation = self.conditional.swap(key, join_parts(value), self._tx.generations[key])
            if not ok:
                raise LostRaceError(key)
            self._tx.generations[key] = generation  # a second write in one transaction builds on ours
        if blind:
            self.inner.set_many(blind)

    def delete_many(self, keys: Iterable[str]) -> None:
        if not self._tracking():
            self.inner.delete_many(keys)
            return
        blind = []
        for key in keys:
            if key not in self._tx.generations:
                blind.append(key)
            elif not self.conditional.delete_if_generation(key, self._tx.generations[key]):
                raise LostRaceError(key)
            else:
                self._tx.generations[key] = None
        if blind:
            self.inner.delete_many(blind)

    # -- passed through -----------------------------------------------------------

    def get_ranges(self, requests: Sequence[tuple[str, ByteRange]]) -> list[bytes | None]:
        return self.inner.get_ranges(requests)

    def contains(self, key: str) -> bool:
        return self.inner.contains(key)

    def iter_keys(self, prefix: str = "") -> Iterator[str]:
        return self.inner.iter_keys(prefix)

    def list_dir(self, path: str = "") -> list[str]:
        return self.inner.list_dir(path)

    def rmdir(self, path: str) -> None:
        self.inner.rmdir(path)

    def size(self, key: str) -> int:
        return self.inner.size(key)

    def size_if_free(self, key: str) -> int | None:
        return self.inner.size_if_free(key)

    def validator(self, key: str) -> Hashable:
        return self.inner.validator(key)

    def close(self) -> None:
        self.inner.close()

    @property
    def location(self) -> Any:
        """The inner adapter's location."""
        return getattr(self.inner, "location", None)

    def __getattr__(self, name: str) -> Any:  # anything else a concrete adapter offers
        if name in ("inner", "conditional", "_tx"):
            raise AttributeError(name)
        return getattr(self.inner, name)


def run_conditionally(
    fn: Callable[[], R],
    tracker: GenerationTrackingAdapter,
    *,
    max_attempts: int = 16,
    backoff: Backoff = Backoff(),
    sleep: Callable[[float], None] = time.sleep,
    stats: RetryStats | None = None,
) -> R:
    """Run ``fn`` (a whole shard write) as a transaction of ``tracker``; re-run it after a lost race.

    Parameters
    ----------
    fn : callable
        The write, for example ``lambda: shard_io.write_shards(by_shard)``;
        it must read through ``tracker`` the values it merges into.
    tracker : GenerationTrackingAdapter
        The adapter ``fn`` reads and writes through.
    max_attempts : int
        Runs at most (≥ 1).
    backoff : Backoff
        Waits between runs.
    sleep : callable
        ``sleep(seconds)``.
    stats : RetryStats, optional
        Filled with the attempts and lost races (for tests and metrics).

    Raises
    ------
    ConcurrentUpdateError
        When every run lost a race (the store holds other writers' complete values).
    ConfigurationError
        For ``max_attempts`` below 1.
    """
    if max_attempts < 1:
        raise ConfigurationError(f"max_attempts must be >= 1, got {max_attempts}")
    stats = stats if stats is not None else RetryStats()
    last = ""  # the key of the last lost race, for the error
    for attempt in range(1, max_attempts + 1):
        stats.attempts += 1
        tracker.begin()
        try:
            return fn()
        except LostRaceError as race:
            stats.precondition_failures += 1
            last = race.key
        finally:
            tracker.end()
        if attempt < max_attempts:
            wait = backoff.delay(attempt)
            stats.waited += wait
            sleep(wait)
    raise ConcurrentUpdateError(last, max_attempts, max_attempts)
