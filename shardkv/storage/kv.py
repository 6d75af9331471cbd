"""The one store interface of shardkv: values with generations, in the kvstore style.

Every base store is reached through one :class:`KVStore` (docs/architecture.md,
"The store interface"). Three rules hold for every implementation
(``tests/kv_contract.py`` checks them):

1. all ranges of one read come from one stored value, whose generation is returned;
2. a read conditioned on a generation that no longer holds reads nothing and
   is ``"stale"``; "missing" is a state of a :class:`ReadResult`, never an
   exception, and every other error propagates unchanged;
3. a conditional put or delete whose condition fails writes nothing and
   returns ``None`` (put) / ``False`` (delete): a lost race is a result.

A :class:`StoreLocation` names a store's data (locks and process stamps key on
it); process stamps (:data:`STAMPS`) are the generations of stores that keep none.
"""

from __future__ import annotations

import enum
import os
import threading
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

from shardkv._types import BytesLike
from shardkv.errors import ReservedKeyError, UnsupportedError
from shardkv.format.ranges import ByteRange
from shardkv.format.tail import TailHow

Value = BytesLike | Sequence[BytesLike]
"""A value to store: one bytes-like object, or a ``list``/``tuple`` of its parts in order."""

TEMP_MARKER = ".shardkv-tmp-"
"""Part of the name of the temporary files of atomic local writes; never listed."""

LOCK_DIR = ".shardkv-locks"
"""Directory (in an array's directory) that holds the cross-process lock files; never listed."""


def hidden(key: str) -> bool:
    """True for the files shardkv keeps in a store for itself (temporary writes, lock files)."""
    return TEMP_MARKER in key or key == LOCK_DIR or key.startswith(LOCK_DIR + "/") or f"/{LOCK_DIR}/" in key


def check_not_reserved(key: str) -> None:
    """Refuse a key with a segment ``.shardkv-locks`` or containing ``.shardkv-tmp-`` (:class:`ReservedKeyError`)."""
    for segment in key.split("/"):
        if segment == LOCK_DIR or TEMP_MARKER in segment:
            raise ReservedKeyError(
                key,
                f"{segment!r} is a name shardkv keeps for its own files ({LOCK_DIR!r}, '*{TEMP_MARKER}*'); "
                "choose another name for this array or group",
            )


@dataclass(frozen=True)
class StoreLocation:
    """The identity of a base store's data: two stores over the same data share locks and process stamps.

    Parameters
    ----------
    namespace : tuple of hashable
        The backend in which paths are unique: ``("file",)``, ``("memory",)``,
        ``("s3", endpoint_url)``, ``("mapping", id(mapping))``.
    root : str
        The store root inside the namespace, without a trailing ``/``.
    local_dir : str or None
        The absolute directory of the root on a mounted file system (lock files can live there).
    """

    namespace: tuple[Hashable, ...]
    root: str
    local_dir: str | None = None

    def full_path(self, key: str) -> str:
        """The path of ``key`` inside the namespace (``root/key``)."""
        return f"{self.root}/{key}" if self.root else key


class _Token(enum.Enum):
    """The token of :data:`ANY` (an enum member: the same object after pickling)."""

    ANY = "ANY"


@dataclass(frozen=True, slots=True)
class Generation:
    """An opaque stamp of one stored value: equal generations mean the same stored value.

    Parameters
    ----------
    token : hashable
        The store's stamp: a local file's ``(st_ino, st_mtime_ns, st_size)``, an
        S3 ETag, a process stamp; ``None`` for :data:`NO_VALUE`.

    Notes
    -----
    As a condition (``if_generation=``): :data:`ANY` is none, :data:`NO_VALUE`
    "only if nothing is stored", any other "only if the stored value still has this stamp".
    """

    token: Hashable

    @property
    def is_any(self) -> bool:
        """True for :data:`ANY`."""
        return self.token is _Token.ANY

    @property
    def is_missing(self) -> bool:
        """True for :data:`NO_VALUE`."""
        return self.token is None

    def __repr__(self) -> str:
        return f"Generation({'ANY' if self.is_any else 'NO_VALUE' if self.is_missing else repr(self.token)})"


ANY = Generation(_Token.ANY)
"""No condition; also the generation of a stale result when the store cannot say what is stored now."""

NO_VALUE = Generation(None)
"""The generation of a missing key; as a condition, "only if nothing is stored"."""

ReadState = Literal["value", "missing", "stale"]


@dataclass(frozen=True, slots=True)
class ReadResult:
    """What one read of one key returned (tensorstore's ``ReadResult``).

    Parameters
    ----------
    state : {"value", "missing", "stale"}
        ``"missing"``: not stored; ``"stale"``: the read's condition no longer
        holds and nothing was read (``values`` is ``None`` for both).
    values : list of bytes-like or None
        One read-only buffer per byte range asked for, in order (``[whole
        value]`` without ranges); a range past the end returns fewer bytes.
    generation : Generation
        Of the value read; :data:`NO_VALUE` when missing; for ``"stale"``, of
        what is stored now, or :data:`ANY` when the store cannot tell for free.
    size : int or None
        The stored value's size (bytes) when the read learnt it for free, else ``None``.
    """

    state: ReadState
    values: list[BytesLike] | None
    generation: Generation
    size: int | None = None

    @property
    def found(self) -> bool:
        """True when the key was read (``state == "value"``)."""
        return self.state == "value"

    def whole(self) -> BytesLike:
        """The value of a read made without byte ranges (``ValueError`` if it holds none or several)."""
        if self.values is None or len(self.values) != 1:
            raise ValueError(
                f"a read result in state {self.state!r} with "
                f"{0 if self.values is None else len(self.values)} buffers has no whole value"
            )
        return self.values[0]


MISSING_RESULT = ReadResult("missing", None, NO_VALUE)
"""The result of reading a key that is not stored."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a :class:`KVStore` can do, for the engine to plan with.

    Parameters
    ----------
    ranged : bool
        Byte-range reads read only the bytes asked for (else shards are read whole).
    round_trips : bool
        Every request is a network round trip (object stores).
    stamps : {"native", "process"}
        Generations from the store itself (seen by every process) or process stamps.
    conditional_put, conditional_delete : bool
        ``put``/``delete`` with ``if_generation`` is atomic against other processes.
    lock_dir : bool
        The data lives in mounted directories where lock files can be taken.
    in_process : bool
        The data lives only in this process: in-process locks are a complete guarantee.
    tail_updates : bool
        :meth:`KVStore.update_tail` can write a few chunks of a stored shard after its bytes.
    tail_min_kept : int
        Fewest leading bytes of a stored shard an update must keep (S3: 5 MiB).
    """

    ranged: bool = False
    round_trips: bool = False
    stamps: Literal["native", "process"] = "process"
    conditional_put: bool = False
    conditional_delete: bool = False
    lock_dir: bool = False
    in_process: bool = False
    tail_updates: bool = False
    tail_min_kept: int = 0


ReadRequest = tuple[str, "Sequence[ByteRange] | None", Generation]
"""One read of :meth:`KVStore.get_many`: ``(key, byte ranges or None for the whole value, if_generation)``."""


class KVStore(ABC):
    """A base key/value store with generations. Keys are ``/``-separated ``str``.

    Implementations give :meth:`get_many`, :meth:`put_many`, :meth:`list_prefix`,
    :attr:`caps` (:class:`Capabilities`) and :attr:`location` (:class:`StoreLocation`); the single-key
    methods are built on them. Nothing here raises ``KeyError``: a missing key is a result.
    """

    caps: Capabilities
    location: StoreLocation  # the identity of the data this store reaches

    @abstractmethod
    def get_many(self, reads: Sequence[ReadRequest]) -> list[ReadResult]:
        """Read several keys, each whole or by byte ranges, each conditioned on a generation.

        Parameters
        ----------
        reads : sequence of (str, sequence of ByteRange or None, Generation)
            ``(key, ranges, if_generation)``. ``ranges=None`` reads the whole
            value; ``ranges=[]`` with a generation other than :data:`ANY` is the
            cheap "is it still ``g``?" check (``"value"`` with no buffers, or
            ``"stale"``/``"missing"``).

        Returns
        -------
        list of ReadResult
            In the order of ``reads``. All ranges of one result come from one
            stored value. Errors other than "not found" propagate.
        """

    @abstractmethod
    def put_many(self, writes: Mapping[str, tuple[Value | None, Generation]]) -> dict[str, Generation | None]:
        """Store or delete several values, each conditioned on a generation.

        Parameters
        ----------
        writes : mapping of str to (value or None, Generation)
            ``value`` is one bytes-like object or a ``list``/``tuple`` of its parts
            (stored as their concatenation); ``None`` deletes the key. The
            generation is the condition (:data:`ANY`: none).

        Returns
        -------
        dict of str to Generation or None
            Per key: the generation of what is stored now (:data:`NO_VALUE` after
            a delete), or ``None`` when the condition did not hold and nothing was
            written for that key.
        """

    @abstractmethod
    def list_prefix(self, prefix: str) -> Iterator[str]:
        """Every stored key that starts with ``prefix`` (``""``: all), never shardkv's hidden files."""

    def list_generations(
        self, prefix: str, wanted: Callable[[str], bool] | None = None
    ) -> Iterator[tuple[str, Generation | None]]:
        """Every stored key that starts with ``prefix``, with its generation where the listing gives it cheaply
        (never a request per key; docs/architecture.md, "The read path").

        Parameters
        ----------
        prefix : str
            Keys starting with it are listed (``""``: all).
        wanted : callable of str to bool, optional
            The keys whose generation the caller will use; a store that pays
            for each generation gives ``None`` for the others. ``None``: every key.

        Yields
        ------
        tuple of (str, Generation or None)
            ``(key, generation)``; ``None``: only a read tells. Hidden files are never listed.
        """
        for key in self.list_prefix(prefix):
            yield key, None

    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]:
        """The keys and the sub-prefixes directly below ``prefix`` (a path ending in ``/``, or ``""``).

        Returns
        -------
        tuple of (list of str, list of str)
            ``(names of keys, names of sub-prefixes)``, relative to ``prefix``, sorted.
        """
        keys: set[str] = set()
        dirs: set[str] = set()
        for key in self.list_prefix(prefix):
            head, sep, _ = key[len(prefix) :].partition("/")
            (dirs if sep else keys).add(head)
        return sorted(keys), sorted(dirs)

    def get(
        self, key: str, byte_ranges: Sequence[ByteRange] | None = None, *, if_generation: Generation = ANY
    ) -> ReadResult:
        """Read one key (see :meth:`get_many`)."""
        return self.get_many([(key, byte_ranges, if_generation)])[0]

    def put(self, key: str, value: Value, *, if_generation: Generation = ANY) -> Generation | None:
        """Store one value; the new generation, or ``None`` when ``if_generation`` did not hold."""
        return self.put_many({key: (value, if_generation)})[key]

    def delete(self, key: str, *, if_generation: Generation = ANY) -> bool:
        """Delete one key; ``False`` when ``if_generation`` did not hold (deleting a missing key is ``True``)."""
        return self.put_many({key: (None, if_generation)})[key] is not None

    def contains(self, key: str) -> bool:
        """True when a value is stored at ``key`` (a path holding keys is not a value); a zero-range read here."""
        return self.get(key, []).found

    def size(self, key: str) -> int | None:
        """The size in bytes of the value stored at ``key``, or ``None`` when nothing is stored there."""
        result = self.get(key, [])
        if result.found and result.size is None:  # the zero-range read did not learn it: a whole read
            result = self.get(key)
            return memoryview(result.whole()).nbytes if result.found else None
        return result.size if result.found else None

    def delete_prefix(self, prefix: str) -> None:
        """Delete every stored key that starts with ``prefix`` (``""``: every key; hidden files stay).

        Directories left empty go too. Not atomic: keys written meanwhile may stay.
        """
        keys = list(self.list_prefix(prefix))
        if keys:
            self.put_many({key: (None, ANY) for key in keys})
        self.prune_empty_dirs(prefix)

    def prune_empty_dirs(self, prefix: str) -> None:
        """Remove the directories left empty under ``prefix`` (stores with directories; a no-op elsewhere)."""
        return None  # a default for stores without directories, not an abstract method

    def values(self, keys: Sequence[str]) -> dict[str, BytesLike]:
        """The whole values of the stored keys among ``keys`` (metadata, the CLI); missing ones are left out."""
        results = self.get_many([(key, None, ANY) for key in keys])
        return {key: r.whole() for key, r in zip(keys, results, strict=True) if r.found}

    def tail_method(self, key: str, in_place: bool) -> TailHow | None:
        """How :meth:`update_tail` can write an update of the stored value at ``key``, or ``None`` (a whole put).

        ``"clone"`` where the store can copy the kept bytes (a file system that
        clones files, S3), ``"append"`` where it cannot and the caller accepts
        an in-place append (``in_place``: its readers may meet a torn tail while
        it is written); ``None`` on stores without :attr:`Capabilities.tail_updates`.
        """
        return None

    def update_tail(
        self,
        key: str,
        writes: Sequence[tuple[int, Value]],
        nbytes: int,
        if_generation: Generation,
        how: TailHow,
        intent_fd: int | None = None,
        intent_path: str | None = None,
        drop: int = 0,
    ) -> Generation | None:
        """Write ``writes`` into the stored value at ``key`` at their offsets (an O(chunk) shard update).

        Parameters
        ----------
        key : str
            The stored value.
        writes : sequence of (int, value)
            ``(offset, value)``, bytes, as :func:`shardkv.format.tail.plan_tail_update` plans them.
        nbytes : int
            The value's size after the writes (bytes).
        if_generation : Generation
            The generation the writes were planned on (:data:`ANY`: none).
        how : {"clone", "append"}
            As :meth:`tail_method` answered.
        intent_fd, intent_path : int, str, optional
            For ``"append"`` (required then): the held lock file that records
            the append's intent, and its path (made durable before its first intent).
        drop : int, optional
            Leading bytes of the stored value the new value leaves out (bytes;
            stores with :attr:`Capabilities.tail_min_kept` only).

        Returns
        -------
        Generation or None
            The new generation, or ``None`` when nothing was written (the
            condition did not hold, or a clone could not be made after all): plan again.

        Raises
        ------
        UnsupportedError
            On a store without :attr:`Capabilities.tail_updates`.
        """
        raise UnsupportedError(f"{type(self).__name__} cannot update a value after its bytes ({key!r})")

    def abort_incomplete_writes(self, prefix: str) -> list[str]:
        """Reclaim what killed writers left under ``prefix`` that no reader sees (S3: incomplete multipart
        uploads, once old enough); a name for each. Nothing on other stores (the default)."""
        return []

    def recover_tail(self, intent_fd: int, intent_path: str | None = None, repair: bool = True) -> str | None:
        """Finish or undo the interrupted append an intent in ``intent_fd`` records; the path repaired, if any.

        ``intent_path`` is that lock file's path (in the lock directory of the
        array whose files its records may name). With ``repair`` false,
        nothing is changed: the path a record names, if any.
        """
        return None

    def close(self) -> None:
        """Release resources of the base store, if it has any."""
        return None  # a default for stores that hold none, not an abstract method


# -- process stamps ------------------------------------------------------------

N_STRIPES = 4096  # stripes of the process table (two ints and one lock each)

Ticket = tuple[int, int, bool]  # (stripe, counter, in flight) as a read saw them before it began


class ProcessStamps:
    """The striped write counters of this process: generations for stores that keep none
    (docs/architecture.md, "The store interface").

    A write also changes the stamps of its stripe's other keys (a needless
    re-read, never a wrong answer); a read that overlapped a write of its
    stripe gets a generation equal to no other. Writers hold their stripes'
    locks from the condition check to the stamp of what they stored.

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
        # shardkv proxy) cannot deadlock on a shared stripe; made on a stripe's first write, not at import
        self._writers: dict[int, threading.RLock] = {}

    def after_fork_in_child(self) -> None:
        """New locks, no write in flight; counters moved past the parent's (its generations never hold here)."""
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

    # -- writes ---------------------------------------------------------------

    @contextmanager
    def writing(self, location: StoreLocation, keys: Iterable[str]) -> Iterator[StampedWrite]:
        """Hold the writer locks of the keys' stripes around a write; yields its :class:`StampedWrite`.

        ``before`` holds the keys' stamps before the write (for conditions);
        the caller calls :meth:`StampedWrite.begin` with the keys it writes;
        after the block, ``after`` holds the stamps of what is stored.
        """
        keys = list(keys)
        stripes = {k: self.stripe(location, k) for k in keys}
        order = sorted(set(stripes.values()))  # one global order: no deadlock between batches
        for s in order:
            self._writers.setdefault(s, threading.RLock()).acquire()  # setdefault: one lock per stripe
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


@dataclass(slots=True)
class StampedWrite:
    """One write under :meth:`ProcessStamps.writing`: the stamps ``before`` it and ``after`` it."""

    _stamps: ProcessStamps
    _stripes: dict[str, int]
    before: dict[str, Generation]
    after: dict[str, Generation] = field(default_factory=dict)
    begun: set[int] = field(default_factory=set)

    def begin(self, keys: Iterable[str]) -> None:
        """The keys are about to be written (or deleted): reads of their stripes are unstable until the end."""
        new = {self._stripes[k] for k in keys} - self.begun
        with self._stamps._guard:
            for s in new:
                self._stamps._counters[s] += 1
                self._stamps._in_flight[s] += 1
        self.begun |= new


STAMPS = ProcessStamps()
"""The process's stamps, shared by every store."""

os.register_at_fork(after_in_child=STAMPS.after_fork_in_child)


Fetched = tuple[list[BytesLike], "int | None"]  # what a read fetched: its values and the stored size


def read_stamped(
    location: StoreLocation, reads: Sequence[ReadRequest], fetch: Callable[[list[int]], Mapping[int, Fetched]]
) -> list[ReadResult]:
    """``get_many`` of a process-stamped store: ``fetch(indices)`` gives index -> :data:`Fetched` of the keys found.

    A conditional read whose stamp no longer holds is stale before any I/O;
    one that overlapped a write of its stripe is stale after the fetch (its size dropped).
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
        values, size = found[i]
        generation = STAMPS.current(ticket)
        if generation is None:  # a write overlapped: a generation equal to no other, and no size to trust
            generation, size = Generation(object()), None
        if cond.is_missing or (not cond.is_any and generation != cond):
            results[i] = ReadResult("stale", None, generation)
        else:
            results[i] = ReadResult("value", values, generation, size)
    return [result for result in results if result is not None]


def write_stamped(
    location: StoreLocation,
    writes: Mapping[str, tuple[Value | None, Generation]],
    exists: Callable[[str], bool],
    write: Callable[[dict[str, Value | None]], None],
) -> dict[str, Generation | None]:
    """``put_many`` of a process-stamped store: under the stripes' writer locks, the keys whose conditions hold
    (``exists(key)`` asked for :data:`NO_VALUE` only) go to ``write`` with their values (``None``: delete)."""
    out: dict[str, Generation | None] = {key: None for key in writes}
    if not writes:
        return out
    with STAMPS.writing(location, writes) as stamped:
        ok = [
            key
            for key, (_, cond) in writes.items()
            if cond.is_any or (not exists(key) if cond.is_missing else stamped.before[key] == cond)
        ]
        stamped.begin(ok)
        write({key: writes[key][0] for key in ok})
    for key in ok:
        out[key] = NO_VALUE if writes[key][0] is None else stamped.after[key]
    return out
