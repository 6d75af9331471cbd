"""Process stamps: generations for stores that keep none (mappings, zarr-python 2 stores, most fsspec filesystems).

They see the writes made *through shardkv in this process*, and only those.
Counters belong to the data (keyed by the location's namespace and the key's
full path) and are striped into a fixed table: a write of one key also
changes the stamp of the other keys of its stripe, which costs a needless
re-read, never a wrong answer. Seqlock-style: a writer marks its stripes in
flight and bumps their counters when it begins and ends; a read that
overlapped a write gets a generation equal to no other. Writers of a stripe
hold its lock from the condition check to the stamp of what they stored, so
a conditional put is atomic against every other shardkv write of this process
(not of other processes: ``Capabilities.conditional_put`` stays False).
Pure in-memory bookkeeping: no I/O.
"""

from __future__ import annotations

import os
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager

from shardkv._types import BytesLike
from shardkv.storage.buffers import Value
from shardkv.storage.kv import ANY, MISSING_RESULT, NO_VALUE, Generation, ReadRequest, ReadResult
from shardkv.storage.location import StoreLocation

N_STRIPES = 4096
"""Stripes of the process table (two ints and one lock each), whatever the number of keys."""

Ticket = tuple[int, int, bool]
"""``(stripe, counter, in flight)`` as a read saw them before it began."""


class ProcessStamps:
    """The striped write counters of this process (one instance, :data:`STAMPS`, serves every store).

    Parameters
    ----------
    n_stripes : int
        Number of stripes (counters, in-flight counts and locks kept).

    Raises
    ------
    ValueError
        If ``n_stripes`` is below 1.
    """

    def __init__(self, n_stripes: int = N_STRIPES) -> None:
        if n_stripes < 1:
            raise ValueError(f"n_stripes must be >= 1, got {n_stripes}")
        self._n = n_stripes
        self._reset()

    def _reset(self) -> None:
        self._counters = [0] * self._n
        self._in_flight = [0] * self._n
        self._guard = threading.Lock()  # guards counters and in-flight counts (held for a few ops)
        # serialise the writers of a stripe; re-entrant, so a store nested in another (a mapping over a
        # shardkv proxy) cannot deadlock on a shared stripe
        self._writers = [threading.RLock() for _ in range(self._n)]

    def after_fork_in_child(self) -> None:
        """A forked child has none of its parent's writer threads: no write is in flight, every lock is free.

        Counters move on (one more than any the parent handed out), so a
        generation read in the parent never holds in the child.
        """
        counters = [c + 2 for c in self._counters]
        self._reset()
        self._counters = counters

    def stripe(self, location: StoreLocation, key: str) -> int:
        """The stripe of ``key`` in the store at ``location`` (by the key's full path in its namespace)."""
        name = f"{location.namespace!r}\x00{location.full_path(key)}"
        return zlib.crc32(name.encode("utf-8", "surrogatepass")) % self._n

    # -- reads ----------------------------------------------------------------

    def begin_read(self, location: StoreLocation, key: str) -> Ticket:
        """The ticket of a read of ``key`` about to start."""
        s = self.stripe(location, key)
        with self._guard:
            return s, self._counters[s], self._in_flight[s] > 0

    def current(self, ticket: Ticket) -> Generation | None:
        """The generation the ticket's value has, if the stripe is still as the ticket saw it, else ``None``."""
        s, counter, busy = ticket
        with self._guard:
            if busy or self._in_flight[s] or self._counters[s] != counter:
                return None
        return Generation(("stamp", counter))

    def end_read(self, ticket: Ticket) -> Generation:
        """The generation of a value read between :meth:`begin_read` and now.

        A read that overlapped a write of its stripe gets a generation equal to
        no other (it may have seen either value).
        """
        generation = self.current(ticket)
        return Generation(object()) if generation is None else generation  # a token equal only to itself

    # -- writes ---------------------------------------------------------------

    @contextmanager
    def writing(self, location: StoreLocation, keys: Iterable[str]) -> Iterator[StampedWrite]:
        """Hold the writer locks of the keys' stripes around a write.

        Yields a :class:`StampedWrite`: its ``before`` are the keys' stamps as
        they stood before the write (to check ``if_generation`` conditions:
        nothing else of this process writes those stripes meanwhile). The
        caller then calls :meth:`StampedWrite.begin` with the keys it is about
        to write, which marks their stripes in flight; once the block is left,
        ``after`` holds the stamps of what is stored (unchanged for keys not
        begun).
        """
        keys = list(keys)
        stripes = {k: self.stripe(location, k) for k in keys}
        order = sorted(set(stripes.values()))  # one global order: no deadlock between batches
        for s in order:
            self._writers[s].acquire()
        try:
            with self._guard:
                write = StampedWrite(
                    self, stripes, {k: Generation(("stamp", self._counters[s])) for k, s in stripes.items()}
                )
            try:
                yield write
            finally:
                with self._guard:
                    for s in write.begun:
                        self._counters[s] += 1
                        self._in_flight[s] = max(0, self._in_flight[s] - 1)
                    write.after = {k: Generation(("stamp", self._counters[s])) for k, s in stripes.items()}
        finally:
            for s in reversed(order):
                self._writers[s].release()

    def _begin(self, stripes: Iterable[int]) -> None:
        with self._guard:
            for s in stripes:
                self._counters[s] += 1
                self._in_flight[s] += 1


class StampedWrite:
    """One write under :meth:`ProcessStamps.writing`: the stamps ``before`` it and ``after`` it."""

    __slots__ = ("_stamps", "_stripes", "before", "after", "begun")

    def __init__(self, stamps: ProcessStamps, stripes: dict[str, int], before: dict[str, Generation]) -> None:
        self._stamps = stamps
        self._stripes = stripes
        self.before = before
        self.after: dict[str, Generation] = {}
        self.begun: set[int] = set()

    def begin(self, keys: Iterable[str]) -> None:
        """The keys are about to be written (or deleted): reads of their stripes are unstable until the end."""
        new = {self._stripes[k] for k in keys} - self.begun
        self._stamps._begin(new)
        self.begun |= new


STAMPS = ProcessStamps()
"""The process's stamps, shared by every process-stamped store."""

os.register_at_fork(after_in_child=STAMPS.after_fork_in_child)


Fetched = tuple[list[BytesLike], "int | None"]
"""What a read fetched: its values (as a :class:`~shardkv.storage.kv.ReadResult` holds them) and the stored size."""


def read_stamped(
    location: StoreLocation, reads: Sequence[ReadRequest], fetch: Callable[[list[int]], Mapping[int, Fetched]]
) -> list[ReadResult]:
    """``get_many`` of a store whose generations are the process stamps of ``location``.

    A conditional read whose stamp no longer holds is stale before any I/O.
    ``fetch`` gets the indices (into ``reads``) of the others and returns
    index -> :data:`Fetched` for the keys it found (a conditional read that
    ``fetch`` gets holds its stamp so far). A read that overlapped a write of
    its stripe, or that asked for a missing key, is stale after the fetch.
    """
    tickets = [STAMPS.begin_read(location, key) for key, _, _ in reads]
    results: list[ReadResult | None] = [None] * len(reads)
    for i, ((_, _, cond), ticket) in enumerate(zip(reads, tickets, strict=True)):
        if not cond.is_any and not cond.is_missing and STAMPS.current(ticket) != cond:
            results[i] = ReadResult("stale", None, ANY)  # changed (or changing) since: read nothing
    found = fetch([i for i, result in enumerate(results) if result is None])
    for i, ((_, _, cond), ticket) in enumerate(zip(reads, tickets, strict=True)):
        if results[i] is not None:
            continue
        if i not in found:
            results[i] = MISSING_RESULT
            continue
        generation = STAMPS.end_read(ticket)
        if cond.is_missing or (not cond.is_any and generation != cond):
            results[i] = ReadResult("stale", None, generation)
        else:
            values, size = found[i]
            results[i] = ReadResult("value", values, generation, size)
    return [result for result in results if result is not None]


def write_stamped(
    location: StoreLocation,
    writes: Mapping[str, tuple[Value | None, Generation]],
    holds: Callable[[str, Generation, Generation], bool],
    write: Callable[[dict[str, Value | None]], None],
) -> dict[str, Generation | None]:
    """``put_many`` of a store whose generations are the process stamps of ``location``.

    Under the writer locks of the keys' stripes, ``holds(key, condition,
    stamp before)`` tells which conditions hold, and ``write`` gets those
    keys' values (``None``: delete). Returns the new stamps (:data:`NO_VALUE`
    for a delete, ``None`` where the condition did not hold).
    """
    out: dict[str, Generation | None] = {key: None for key in writes}
    if not writes:
        return out
    with STAMPS.writing(location, writes) as stamped:
        ok = [key for key, (_, cond) in writes.items() if holds(key, cond, stamped.before[key])]
        stamped.begin(ok)
        write({key: writes[key][0] for key in ok})
    for key in ok:
        out[key] = NO_VALUE if writes[key][0] is None else stamped.after[key]
    return out
