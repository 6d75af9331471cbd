"""Generation-conditional reads and writes on obstore stores (issue 9, item 3).

:class:`ObstoreConditional` is the :class:`~shardkv.storage.conditional.ConditionalStore`
of an :class:`~shardkv.storage.obstore_adapter.ObstoreAdapter`:

* the *generation* of a value is its :class:`~shardkv.storage.obstore_adapter.Version`
  (``e_tag`` and ``version``) as the store reports it in the metadata of the
  same GET that returns the bytes (one request, a ``Range`` header for a byte range);
* :meth:`~ObstoreConditional.read_if_generation` is a GET with ``If-Match``;
* :meth:`~ObstoreConditional.swap` is one PUT with obstore's ``PutMode``:
  ``"create"`` (``If-None-Match: *``) when nothing may be stored yet, else
  ``{"e_tag": ..., "version": ...}`` (``If-Match``); a precondition failure
  (``PreconditionError``, ``AlreadyExistsError``, or ``NotFoundError`` for a
  value deleted meanwhile) is a lost race; ``NotFoundError`` on a create (a
  missing bucket) is a ``FileNotFoundError``;
* obstore (0.12) has no conditional delete: :attr:`supports_conditional_delete`
  is False and the engine stores an empty shard instead of deleting one
  (:meth:`shardkv.engine.shard_writes.ShardWrites.write_shards`).

Which stores qualify (:func:`obstore_conditional_for`): ``S3Store`` unless its
``conditional_put`` is ``"disabled"`` (obstore's default, ``"etag"``, sends
``If-Match`` / ``If-None-Match``), ``GCSStore`` and ``AzureStore`` (native
preconditions), and ``MemoryStore`` (atomic in the process). ``LocalStore``
does not: obstore refuses ``PutMode`` updates there (``NotImplementedError``);
its location is a directory, so ``concurrency="auto"`` takes lock files
instead. ``HTTPStore`` offers neither. Readers pin their chunk reads to the
index's generation (:mod:`shardkv.engine.generation_reads`) on the object
stores, on a ``S3Store`` whose conditional puts are disabled too (reads-only:
``obstore_conditional_for(adapter, for_writes=False)``), and on a
``MemoryStore`` (:attr:`ObstoreConditional.pins_reads`: it has no validator,
and several ``ShardedStore`` objects may share it).
"""

from __future__ import annotations

import errno
import os
from typing import Any, Sequence

from shardkv.errors import ConfigurationError
from shardkv.format.ranges import ByteRange
from shardkv.storage.conditional import ConditionalStore, Generation
from shardkv.storage.obstore_adapter import ObstoreAdapter, Version

__all__ = ["ObstoreConditional", "obstore_conditional_for", "conditional_put_disabled"]

_CONDITIONAL_STORES = frozenset({"S3Store", "GCSStore", "AzureStore", "MemoryStore"})
_REMOTE_STORES = frozenset({"S3Store", "GCSStore", "AzureStore"})


def conditional_put_disabled(store: Any) -> bool:
    """True for an ``S3Store`` whose conditional puts are turned off.

    Looks at the store's ``conditional_put`` option and, when it was not
    given, at the ``AWS_CONDITIONAL_PUT`` environment variable (obstore reads
    it when the store is made, but does not show it in ``store.config``).
    """
    if type(store).__name__ != "S3Store":
        return False
    config = getattr(store, "config", None) or {}
    mode = config.get("conditional_put") or os.environ.get("AWS_CONDITIONAL_PUT") or "etag"
    return str(mode).strip().lower() == "disabled"


def obstore_conditional_for(adapter: ObstoreAdapter, for_writes: bool = True) -> ObstoreConditional | None:
    """The :class:`ObstoreConditional` of ``adapter``, or ``None`` when its store has no conditional puts.

    Parameters
    ----------
    adapter : ObstoreAdapter
        The store's adapter.
    for_writes : bool
        True (the default): for compare-and-swap writes, so an ``S3Store``
        whose conditional puts are disabled is refused. False: for reads
        pinned to generations only (``GET`` with ``If-Match`` needs no
        conditional put), so that store gets one too.

    Raises
    ------
    ConfigurationError
        With ``for_writes``, for an ``S3Store`` made with
        ``conditional_put="disabled"`` (or ``AWS_CONDITIONAL_PUT=disabled``):
        compare-and-swap would be refused, and a weaker guarantee is never
        chosen silently.
    """
    kind = type(adapter.store).__name__
    if kind not in _CONDITIONAL_STORES:
        return None
    if for_writes and conditional_put_disabled(adapter.store):
        raise ConfigurationError(
            f"the obstore S3Store at {adapter.location!r} has conditional puts disabled "
            "(conditional_put='disabled' or AWS_CONDITIONAL_PUT=disabled), so concurrent writers could lose "
            "updates: make the store with conditional_put='etag' (the default), or pass "
            "concurrency='process' (this process only) or concurrency='none' (one writer per shard)"
        )
    return ObstoreConditional(adapter)


class ObstoreConditional(ConditionalStore):
    """Conditional reads and writes through an :class:`ObstoreAdapter` (see the module docstring).

    Parameters
    ----------
    adapter : ObstoreAdapter
        The adapter whose store is read and written (its thread pool runs the batches).

    Notes
    -----
    Values are returned as ``memoryview`` objects over obstore's buffers (no
    copy), as :class:`ObstoreAdapter` returns them. Whole-object PUTs only
    (S3 takes up to 5 GiB in one).
    """

    supports_conditional_delete = False

    def __init__(self, adapter: ObstoreAdapter) -> None:
        from obstore.exceptions import AlreadyExistsError, GenericError, NotFoundError, PreconditionError

        self.adapter = adapter
        self.store = adapter.store
        self._obs = adapter._obs
        self.location = adapter.location
        self.remote = type(adapter.store).__name__ in _REMOTE_STORES
        # a MemoryStore object may be shared by several ShardedStores and has no validator:
        # its readers pin chunk reads to the index's e_tag like those of object stores
        self._pins_reads = self.remote or type(adapter.store).__name__ == "MemoryStore"
        self._missing = (NotFoundError, FileNotFoundError)
        self._lost = (PreconditionError, AlreadyExistsError)
        self._stale = (PreconditionError, NotFoundError, FileNotFoundError)
        self._generic = GenericError

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.adapter,))

    @property
    def pins_reads(self) -> bool:
        """True for object stores and ``MemoryStore`` (see :attr:`ConditionalStore.pins_reads`)."""
        return self._pins_reads

    # -- reads ------------------------------------------------------------------

    @staticmethod
    def _version(meta: Any) -> Version:
        return Version(meta.get("e_tag"), meta.get("version"))

    @staticmethod
    def _range_option(byte_range: ByteRange) -> Any:
        if byte_range.is_suffix:
            return {"suffix": -byte_range.start}
        if byte_range.stop is None:
            return {"offset": byte_range.start}
        return (byte_range.start, byte_range.stop)

    def _get(self, key: str, byte_range: ByteRange | None, if_match: str | None) -> tuple[memoryview, Version]:
        """One GET (a HEAD-like GET for an empty range): the bytes and their version; errors propagate."""
        options: dict[str, Any] = {} if if_match is None else {"if_match": if_match}
        if byte_range is not None and byte_range.stop == byte_range.start:
            result = self._obs.get(self.store, key, options={**options, "head": True})  # HTTP has no empty range
            return memoryview(b""), self._version(result.meta)
        if byte_range is not None:
            options["range"] = self._range_option(byte_range)
        try:
            result = self._obs.get(self.store, key, options=options or None)
        except self._generic:
            if byte_range is None or byte_range.is_suffix:
                raise
            # a range starting at or past the end (HTTP 416): nothing of it, if the object is that short
            head = self._obs.get(self.store, key, options={k: v for k, v in options.items() if k != "range"} | {"head": True})
            if int(head.meta["size"]) > byte_range.start:
                raise
            return memoryview(b""), self._version(head.meta)
        return memoryview(result.bytes()), self._version(result.meta)

    def read_with_generation(
        self, key: str, byte_range: ByteRange | None = None
    ) -> tuple[memoryview | None, Generation]:
        try:
            return self._get(key, byte_range, None)
        except self._missing:
            return None, None

    def read_if_generation(
        self, key: str, byte_range: ByteRange | None, expected: Generation
    ) -> tuple[bool, memoryview | None]:
        if not isinstance(expected, Version) or expected.e_tag is None:
            return False, None
        try:
            data, _ = self._get(key, byte_range, expected.e_tag)
        except self._stale:  # changed (412) or gone: the caller reads the index again
            return False, None
        return True, data

    def read_many_with_generation(
        self, requests: Sequence[tuple[str, ByteRange | None]]
    ) -> list[tuple[memoryview | None, Generation]]:
        """:meth:`read_with_generation` of every request, concurrently on the adapter's thread pool.

        Raises
        ------
        obstore.exceptions.BaseError
            Errors of the store other than "not found".
        """
        return self.adapter._map(lambda req: self.read_with_generation(*req), list(requests))

    def read_many_if_generation(
        self, requests: Sequence[tuple[str, ByteRange | None, Generation]]
    ) -> list[tuple[bool, memoryview | None]]:
        """:meth:`read_if_generation` of every request, concurrently on the adapter's thread pool.

        Raises
        ------
        obstore.exceptions.BaseError
            Errors of the store other than a changed or missing value.
        """
        return self.adapter._map(lambda req: self.read_if_generation(*req), list(requests))

    # -- writes -----------------------------------------------------------------

    def swap(self, key: str, value: bytes, expected: Generation) -> tuple[bool, Generation]:
        """Store ``value`` only if the stored version is ``expected`` (``None``: only if not stored).

        Returns ``(True, new Version)``, or ``(False, None)`` after a
        precondition failure (nothing was written), or when the value was
        deleted since ``expected`` was read ("not found" on an update).

        Raises
        ------
        FileNotFoundError
            When creating (``expected`` None) and the store answers "not
            found": its bucket (or container) does not exist. Never retried as
            a lost race.
        ConfigurationError
            If the store refuses conditional puts (``NotImplementedError`` from
            obstore: an ``S3Store`` whose ``conditional_put`` is disabled, a ``LocalStore``).
        obstore.exceptions.BaseError
            Errors of the store other than a precondition failure.
        """
        if expected is None:
            mode: Any = "create"
        elif isinstance(expected, Version):
            mode = {k: v for k, v in (("e_tag", expected.e_tag), ("version", expected.version)) if v is not None}
        else:
            return False, None  # not a generation this store gave: it cannot match
        try:
            result = self.adapter._put(key, value, mode)
        except self._lost:
            return False, None
        except self._missing as exc:
            if expected is None:  # nothing to lose a race with: the bucket (or container) is not there
                raise FileNotFoundError(
                    errno.ENOENT, f"cannot create {key!r}: the obstore store at {self.location!r} was not found "
                    "(does its bucket exist?)",
                ) from exc
            return False, None  # the value was deleted since it was read: a lost race (the retry creates it)
        except NotImplementedError as exc:
            raise ConfigurationError(
                f"the obstore store at {self.location!r} refused a conditional put ({exc}); for S3 make the "
                "store with conditional_put='etag', or pass concurrency='process' or concurrency='none'"
            ) from exc
        return True, Version(result.get("e_tag"), result.get("version"))

    def delete_if_generation(self, key: str, expected: Generation) -> bool:
        """Not offered: obstore has no conditional delete.

        Raises
        ------
        NotImplementedError
            Always. The engine checks :attr:`supports_conditional_delete` and
            stores an empty shard by :meth:`swap` instead.
        """
        raise NotImplementedError(
            f"obstore has no conditional delete, so {key!r} cannot be deleted only if unchanged; "
            "store an empty value with swap() instead (ObstoreConditional.supports_conditional_delete is False)"
        )
