"""The one retry and wait loop of the engine (:func:`attempts`), its backoffs and the engine's counters.

The read path (:mod:`shardkv.engine.reads`), the write path
(:mod:`shardkv.engine.writes`) and the lock waits (:mod:`shardkv.engine.locks`)
each go round :func:`attempts`: bounded in count or by a deadline, waits
growing exponentially up to a cap, with full jitter so writers that collided
spread out.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass

READ_ATTEMPTS = 8
"""Rounds of one chunk read whose shards keep changing under it, at most."""
WRITE_ATTEMPTS = 16
"""Rounds of one conditional shard write that keeps losing its race, at most."""


@dataclass(frozen=True)
class Backoff:
    """Waits between attempts: a uniformly random part of ``initial * factor**n`` seconds, at most ``maximum``.

    The jitter spreads writers that collided.
    """

    initial: float = 0.005
    factor: float = 2.0
    maximum: float = 0.5

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1 for the first)."""
        return random.uniform(0.0, min(self.maximum, self.initial * self.factor ** max(0, attempt - 1)))


READ_BACKOFF = Backoff(0.001, 2.0, 0.05)
"""Waits between read rounds (seconds; 0.2 s in all at most)."""
WRITE_BACKOFF = Backoff()
"""Waits between write rounds (seconds)."""
LOCK_BACKOFF = Backoff(0.001, 2.0, 0.05)
"""Waits between tries of a lock file taken by another writer (seconds), while a lock timeout runs."""


def attempts(limit: int | None, backoff: Backoff, deadline: float | None = None, made: int = 0) -> Iterator[int]:
    """The one retry loop: attempt numbers from ``made + 1``, waiting ``backoff.delay(n)`` before attempt ``n + 1``.

    Parameters
    ----------
    limit : int or None
        Attempts at most (≥ 1), those already made included; ``None``: as
        many as ``deadline`` allows.
    backoff : Backoff
        Waits between attempts.
    deadline : float or None
        ``time.monotonic()`` after which no attempt starts (the first always
        does; no wait runs past it). ``None`` with ``limit=None`` runs as long
        as it takes: only for a wait the caller asked to last as long as it
        takes (a lock timeout of ``None``), each attempt of which blocks.
    made : int
        Attempts the caller already made, and that failed, before entering the
        loop (so that an attempt that succeeds at once never runs it): the
        loop then waits before its first.

    Yields
    ------
    int
        The attempt number. The caller breaks out (or returns) on success;
        when the generator ends, every attempt failed.
    """
    attempt = made
    while True:
        if attempt:
            if limit is not None and attempt >= limit:
                return
            delay = backoff.delay(attempt)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                delay = min(delay, left)
            time.sleep(delay)
        attempt += 1
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
    writes_queued : int
        Shard changes that arrived while a commit of their shard was running
        and went into its next commit (stored together with every change that
        arrived meanwhile, by one read-modify-write).
    tail_updates : int
        Stored shards updated by writing only their changed chunks and a new
        index (a clone renamed over the shard, or an in-place append), not
        rewritten whole.
    """

    read_attempts: int = 0
    read_stale: int = 0
    whole_shard_reads: int = 0
    write_attempts: int = 0
    write_lost: int = 0
    writes_queued: int = 0
    tail_updates: int = 0
