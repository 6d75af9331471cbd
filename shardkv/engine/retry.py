"""The optimistic update loop: read, merge, conditionally write, retry with backoff (issue 9).

Pure control flow over three callables, so it works with any
:class:`~shardkv.storage.conditional.ConditionalStore` (one key:
:func:`update_with_retry`) and underlies the shard-write transactions of
:mod:`shardkv.engine.cas`. Every loop is bounded by ``max_attempts``; waits
grow exponentially up to a cap, with full jitter so writers that collided
spread out.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Hashable, Iterator, TypeVar

from shardkv.errors import ConcurrentUpdateError, ConfigurationError

__all__ = ["Backoff", "RetryStats", "EngineStats", "attempts", "update_with_retry", "READ_ATTEMPTS", "WRITE_ATTEMPTS"]

READ_ATTEMPTS = 8
"""Rounds of one chunk read whose shards keep changing under it, at most."""
WRITE_ATTEMPTS = 16
"""Rounds of one conditional shard write that keeps losing its race, at most."""

Generation = Hashable


@dataclass(frozen=True)
class Backoff:
    """Waits between attempts: ``initial * factor**n`` seconds, at most ``maximum``, with full jitter.

    Parameters
    ----------
    initial : float
        First wait (seconds).
    factor : float
        Growth per attempt (≥ 1).
    maximum : float
        Longest single wait (seconds).
    jitter : bool
        Wait a uniformly random part of the delay (spreads writers that collided).

    Raises
    ------
    ConfigurationError
        For negative times or a factor below 1.
    """

    initial: float = 0.005
    factor: float = 2.0
    maximum: float = 0.5
    jitter: bool = True

    def __post_init__(self) -> None:
        if self.initial < 0 or self.maximum < 0 or self.factor < 1:
            raise ConfigurationError(
                f"backoff needs initial >= 0, maximum >= 0 (seconds) and factor >= 1, got {self!r}"
            )

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1 for the first)."""
        base = min(self.maximum, self.initial * self.factor ** max(0, attempt - 1))
        return (rng or random).uniform(0.0, base) if self.jitter else base


T = TypeVar("T")
V = TypeVar("V")


@dataclass
class RetryStats(Generic[V]):
    """What :func:`update_with_retry` did: attempts, precondition failures and the value written."""

    attempts: int = 0
    precondition_failures: int = 0
    value: Any = None
    generation: Generation = None
    waited: float = field(default=0.0)


def update_with_retry(
    read_fn: Callable[[], tuple[T, Generation]],
    merge_fn: Callable[[T], V],
    write_fn: Callable[[V, Generation], bool | tuple[bool, Generation]],
    *,
    max_attempts: int = 16,
    backoff: Backoff = Backoff(),
    key: str = "",
    sleep: Callable[[float], None] = time.sleep,
) -> RetryStats[V]:
    """Read, merge, conditionally write; on a precondition failure wait and start over (bounded).

    Parameters
    ----------
    read_fn : callable
        ``read_fn() -> (current, generation)``; ``generation`` is ``None`` when
        nothing is stored.
    merge_fn : callable
        ``merge_fn(current) -> new``: the value to write, computed from what was
        read (called again after every lost race, so it must be pure).
    write_fn : callable
        ``write_fn(new, generation) -> bool`` (or ``(bool, new generation)``,
        as :meth:`ConditionalStore.swap` returns): False when the store refused
        because the generation changed.
    max_attempts : int
        Read-merge-write rounds at most (≥ 1).
    backoff : Backoff
        Waits between rounds.
    key : str
        Named in the error when every attempt failed.
    sleep : callable
        ``sleep(seconds)``; tests may pass a recorder.

    Returns
    -------
    RetryStats
        ``attempts`` (rounds run), ``precondition_failures``, the ``value``
        written and its ``generation`` (where ``write_fn`` gives it).

    Raises
    ------
    ConcurrentUpdateError
        When all ``max_attempts`` rounds lost their race (nothing was written).
    ConfigurationError
        For ``max_attempts`` below 1.
    """
    if max_attempts < 1:
        raise ConfigurationError(f"max_attempts must be >= 1, got {max_attempts}")
    stats: RetryStats[V] = RetryStats()
    for attempt in range(1, max_attempts + 1):
        stats.attempts = attempt
        current, generation = read_fn()
        new = merge_fn(current)
        outcome = write_fn(new, generation)
        ok, new_generation = outcome if isinstance(outcome, tuple) else (bool(outcome), None)
        if ok:
            stats.value = new
            stats.generation = new_generation
            return stats
        stats.precondition_failures += 1
        if attempt < max_attempts:
            wait = backoff.delay(attempt)
            stats.waited += wait
            sleep(wait)
    raise ConcurrentUpdateError(key, stats.attempts, stats.precondition_failures)


READ_BACKOFF = Backoff(0.001, 2.0, 0.05)
"""Waits between read rounds (seconds; 0.2 s in all at most)."""
WRITE_BACKOFF = Backoff()
"""Waits between write rounds (seconds)."""


def attempts(limit: int, backoff: Backoff, sleep: Callable[[float], None] = time.sleep) -> Iterator[int]:
    """The one retry loop: attempt numbers ``1..limit``, waiting ``backoff.delay(n)`` before attempt ``n + 1``.

    Parameters
    ----------
    limit : int
        Attempts at most (≥ 1).
    backoff : Backoff
        Waits between attempts.
    sleep : callable
        ``sleep(seconds)``.

    Yields
    ------
    int
        The attempt number, from 1. The caller breaks out (or returns) on
        success; when the generator ends, every attempt failed.
    """
    for attempt in range(1, limit + 1):
        if attempt > 1:
            sleep(backoff.delay(attempt - 1))
        yield attempt


@dataclass
class EngineStats:
    """Counters of one :class:`~shardkv.engine.engine.ShardEngine` (a public probe for tests and users).

    Attributes
    ----------
    read_attempts : int
        Rounds of chunk reads (one per read call, more when shards changed under it).
    read_stale : int
        Chunk reads refused because their shard changed since its index was
        cached (a conditional read found another generation); each cost one
        index read again.
    whole_shard_reads : int
        Shards read whole (index and chunks in one request).
    write_attempts : int
        Rounds of shard writes (one per write call, more after lost races).
    write_lost : int
        Conditional shard puts refused because another writer changed the shard.
    """

    read_attempts: int = 0
    read_stale: int = 0
    whole_shard_reads: int = 0
    write_attempts: int = 0
    write_lost: int = 0
