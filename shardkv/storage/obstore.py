"""A :class:`~shardkv.storage.kv.KVStore` over an obstore store (S3Store, GCSStore, AzureStore, MemoryStore).

Generations are the store's ``(e_tag, version)``, reported by the GET that
reads the bytes. Every byte range is one GET (``if_match`` when conditioned:
a ``PreconditionError`` is "stale"), run concurrently on a thread pool (obstore
releases the GIL while it waits). Puts use ``PutMode`` (``"create"``, or the
e_tag/version of an update; a lost race is ``None``). obstore has no
conditional delete, and stores that refuse ``PutMode`` updates (an ``S3Store``
with ``conditional_put="disabled"``) report ``conditional_put=False``: such
conditions are checked first, under the in-process writer lock (not atomic
across processes). An obstore ``LocalStore`` is opened as shardkv's own
:class:`~shardkv.storage.local.LocalStore` (:func:`~shardkv.storage.open.open_kv`).
obstore is imported only when a store is made, so shardkv works without it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from shardkv.errors import ConfigurationError
from shardkv.format.ranges import ByteRange
from shardkv.storage.files import byte_parts
from shardkv.storage.kv import (
    ANY,
    NO_VALUE,
    STAMPS,
    Capabilities,
    Generation,
    KVStore,
    ReadRequest,
    ReadResult,
    StoreLocation,
    Value,
    hidden,
)
from shardkv.storage.objects import Fetched, Leaf, Outcome, child_names, metadata_only, read_objects

T = TypeVar("T")
_MAX_CONCURRENCY = 16  # requests in flight per call
_REMOTE = frozenset({"S3Store", "GCSStore", "AzureStore", "HTTPStore"})


def is_obstore_store(store: Any) -> bool:
    """True if ``store`` is an obstore store object (checked without importing obstore)."""
    module = type(store).__module__ or ""
    return module == "obstore" or module.startswith(("obstore.", "obstore._"))


def _obstore() -> Any:
    try:
        import obstore
    except ImportError as exc:
        raise ConfigurationError(
            "the obstore client was asked for but the package is not installed (pip install obstore)"
        ) from exc
    return obstore


def open_obstore_url(url: str, options: Mapping[str, Any] | None = None) -> Any:
    """The obstore store of ``url`` (``s3://bucket/prefix``, ...), its path as prefix; options to ``from_url``.

    Raises
    ------
    ConfigurationError
        If obstore is not installed.
    """
    _obstore()
    from obstore.store import from_url

    return from_url(url, **dict(options or {}))


def _join(*parts: Any) -> str:
    return "/".join(str(p).strip("/") for p in parts if p and str(p).strip("/"))


def obstore_location(store: Any) -> StoreLocation:
    """The :class:`StoreLocation` of an obstore store object.

    ``S3Store``: ``("s3", endpoint)`` as for s3fs (so both clients of one bucket
    share locks in a process), ``GCSStore``: ``("gs", None)``, ``AzureStore``:
    ``("az", account)``, with root ``bucket/prefix``; ``MemoryStore``: that object.
    """
    kind = type(store).__name__
    config = getattr(store, "config", None) or {}
    prefix = getattr(store, "prefix", None)
    if kind == "S3Store":
        return StoreLocation(("s3", config.get("endpoint")), _join(config.get("bucket"), prefix))
    if kind == "GCSStore":
        return StoreLocation(("gs", None), _join(config.get("bucket"), prefix))
    if kind == "AzureStore":
        return StoreLocation(("az", config.get("account_name")), _join(config.get("container_name"), prefix))
    if kind == "HTTPStore":
        return StoreLocation(("http", str(getattr(store, "url", ""))), "")
    return StoreLocation(("obstore", kind, id(store)), "")


def conditional_put_disabled(store: Any) -> bool:
    """True for an ``S3Store`` whose conditional puts are off (its option, else ``AWS_CONDITIONAL_PUT``)."""
    if type(store).__name__ != "S3Store":
        return False
    config = getattr(store, "config", None) or {}
    mode = config.get("conditional_put") or os.environ.get("AWS_CONDITIONAL_PUT") or "etag"
    return str(mode).strip().lower() == "disabled"


def _range_option(byte_range: ByteRange) -> Any:
    if byte_range.is_suffix:
        return {"suffix": -byte_range.start}
    if byte_range.stop is None:
        return {"offset": byte_range.start}
    return (byte_range.start, byte_range.stop)


def _generation(meta: Mapping[str, Any]) -> Generation:
    return Generation((meta.get("e_tag"), meta.get("version")))


class ObstoreStore(KVStore):
    """An obstore store as a :class:`KVStore` (see the module docstring).

    Parameters
    ----------
    store : obstore store
        An obstore store object; its prefix applies to every key. (An obstore
        ``LocalStore`` is opened as shardkv's ``LocalStore`` by ``open_kv``.)
    max_concurrency : int
        Requests in flight at once for one call.

    Raises
    ------
    ConfigurationError
        If obstore is not installed.
    """

    def __init__(self, store: Any, max_concurrency: int = _MAX_CONCURRENCY) -> None:
        self._obs = _obstore()
        from obstore.exceptions import AlreadyExistsError, GenericError, NotFoundError, PreconditionError

        self.store = store
        kind = type(store).__name__
        self._missing = (NotFoundError, FileNotFoundError)  # obstore raises the builtin for a missing key
        self._lost = (PreconditionError, AlreadyExistsError)
        self._precondition = PreconditionError
        self._generic = GenericError
        self._max_concurrency = max(1, int(max_concurrency))
        self._pool: ThreadPoolExecutor | None = None
        self.location = obstore_location(store)
        self._updates = kind in ("S3Store", "GCSStore", "AzureStore", "MemoryStore") and not conditional_put_disabled(
            store
        )
        self.caps = Capabilities(
            ranged=True,
            round_trips=kind in _REMOTE,
            stamps="native",
            conditional_put=self._updates,
            in_process=kind == "MemoryStore",
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # the store pickles as its configuration (obstore >= 0.5; a MemoryStore does not)
        return (type(self), (self.store, self._max_concurrency))

    def __repr__(self) -> str:
        return f"ObstoreStore({type(self.store).__name__}, {self.location.root!r})"

    def _map(self, fn: Callable[[Any], T], items: Sequence[Any]) -> list[T]:
        """``[fn(x) for x in items]``, concurrently when there is more than one."""
        if len(items) <= 1:
            return [fn(x) for x in items]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._max_concurrency, thread_name_prefix="shardkv-obstore")
        return list(self._pool.map(fn, items))

    # -- reads ----------------------------------------------------------------

    @staticmethod
    def _if_match(cond: Generation) -> dict[str, Any]:
        if cond.is_any or cond.is_missing or not isinstance(cond.token, tuple):
            return {}
        return {"if_match": cond.token[0]}

    def _head(self, key: str, cond: Generation) -> Fetched:
        """The object's generation and size (one GET with ``head``; errors propagate)."""
        meta = self._obs.get(self.store, key, options={**self._if_match(cond), "head": True}).meta
        return b"", _generation(meta), int(meta["size"])

    def _get(self, key: str, byte_range: ByteRange | None, cond: Generation) -> Fetched:
        """One GET of a range (or the whole value): its bytes (a read-only view), generation and size."""
        if byte_range is not None and byte_range.nbytes == 0:
            return self._head(key, cond)
        options = self._if_match(cond)
        if byte_range is not None:
            options["range"] = _range_option(byte_range)
        try:
            result = self._obs.get(self.store, key, options=options or None)
        except self._generic:
            if byte_range is None:
                raise
            # a range the server would not serve as one (starting past the end, a suffix of an empty
            # object answered in full): the whole value, sliced (a real error raises again)
            whole, generation, size = self._get(key, None, cond)
            view = memoryview(whole)
            return view[slice(*byte_range.resolve(view.nbytes))], generation, size
        return memoryview(result.bytes()), _generation(result.meta), int(result.meta["size"])

    def _request(self, leaf: Leaf) -> Outcome:
        """One request of a read; "not found" and "changed" are answers, other errors are returned."""
        request, byte_range = leaf
        key, _, cond = request
        try:
            return self._head(key, cond) if metadata_only(request) else self._get(key, byte_range, cond)
        except self._missing:
            return "missing"
        except self._precondition as exc:
            return exc if cond.is_any else "stale"
        except Exception as exc:  # raised by get_many once every request of the call is over
            return exc

    def get_many(self, reads: Sequence[ReadRequest]) -> list[ReadResult]:
        # every request of every read on the pool at once (one level: no task waits on another)
        return read_objects(reads, lambda leaves: self._map(self._request, leaves))

    # -- writes ---------------------------------------------------------------

    def _current(self, key: str) -> Generation:
        try:
            return self._head(key, ANY)[1]
        except self._missing:
            return NO_VALUE

    def _put(self, key: str, value: Value, mode: Any) -> Generation:
        parts = byte_parts(value)  # flat uint8 views, as obstore takes them; no copy
        body: Any = parts[0] if len(parts) == 1 else (parts or b"")
        try:
            result = self._obs.put(self.store, key, body, mode=mode, use_multipart=False)
        except self._missing as exc:  # a put finds nothing to write into
            raise FileNotFoundError(
                f"cannot write {key!r} to {self.location!r}: not found (does its bucket exist?)"
            ) from exc
        return Generation((result.get("e_tag"), result.get("version")))

    def _write(self, item: tuple[str, tuple[Value | None, Generation]]) -> Generation | None:
        key, (value, cond) = item
        if value is None:
            if not cond.is_any and self._current(key) != cond:  # no conditional delete in obstore: checked first
                return None
            with contextlib.suppress(*self._missing):  # S3 deletes a missing key quietly; other stores say "not found"
                self._obs.delete(self.store, key)
            return NO_VALUE
        if cond.is_any:
            return self._put(key, value, None)
        if cond.is_missing:
            mode: Any = "create"
        elif self._updates and isinstance(cond.token, tuple):
            mode = {k: v for k, v in zip(("e_tag", "version"), cond.token, strict=True) if v is not None}
        else:  # no PutMode update here: checked first (the caller holds the in-process writer lock)
            return self._put(key, value, None) if self._current(key) == cond else None
        try:
            return self._put(key, value, mode)
        except self._lost:
            return None
        except self._missing:
            if cond.is_missing:
                raise  # a create that finds no bucket: not a lost race
            return None  # an update of a key deleted since its generation was read

    def put_many(self, writes: Mapping[str, tuple[Value | None, Generation]]) -> dict[str, Generation | None]:
        items = list(writes.items())
        # a store without PutMode updates checks conditions first, and so does every conditional delete:
        # then no other write of this process may come between check and write
        checked = not self._updates or any(v is None and not c.is_any for _, (v, c) in items)
        with STAMPS.writing(self.location, writes) if checked else contextlib.nullcontext():
            return dict(zip(writes, self._map(self._write, items), strict=True))

    # -- listings -------------------------------------------------------------

    def list_generations(
        self, prefix: str, wanted: Callable[[str], bool] | None = None
    ) -> Iterator[tuple[str, Generation | None]]:
        """Every key under ``prefix`` with the ``(e_tag, version)`` its listing returns (no request per key)."""
        base = prefix.rpartition("/")[0]  # object_store prefixes are whole path segments
        for batch in self._obs.list(self.store, base or None):
            for meta in batch:
                key = meta["path"]
                if key.startswith(prefix) and not hidden(key):
                    yield key, _generation(meta)

    def list_prefix(self, prefix: str) -> Iterator[str]:
        return (key for key, _ in self.list_generations(prefix))

    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]:
        result = self._obs.list_with_delimiter(self.store, prefix.rstrip("/") or None)
        return child_names(m["path"] for m in result["objects"]), child_names(result["common_prefixes"])

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
