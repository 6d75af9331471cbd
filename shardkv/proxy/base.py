"""``ProxyBase``: what both zarr-python 2 proxies share (options, pickling, lifecycle, zarr 2 protocol, values).

Two classes because zarr-python 2.18 takes them through two protocols registered
per class (``BaseStore``, ``StoreV3``). A pickled proxy reopens over the same
data and writes through (nothing of one process travels). A proxy class is
registered as a virtual subclass of zarr 2's ABC on first use, so that zarr
calls its batch methods instead of wrapping it in a ``KVStore``.
"""

from __future__ import annotations

import importlib
import importlib.util
from abc import abstractmethod
from collections.abc import MutableMapping
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import Any, ClassVar, Literal, Self

import numpy as np

from shardkv.engine.options import Options
from shardkv.errors import ConfigurationError
from shardkv.keys.space import ShardedArray

ZarrProtocol = Literal["BaseStore", "StoreV3"]
"""The zarr-python 2 store ABC a proxy registers with (v2 keys, or the 2022 draft's v3 keys)."""

_registered: set[tuple[type, str]] = set()


def as_buffer(key: str, value: Any) -> memoryview:
    """A contiguous byte view of a value (numpy arrays in memory order, as zarr's own stores take them).

    Parameters
    ----------
    key : str
        The key the value is written to (named in errors).
    value : bytes-like or numpy.ndarray
        Anything with the buffer protocol; object arrays are refused.

    Raises
    ------
    TypeError
        If ``value`` is not bytes-like (names the key and the type received).
    """
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise TypeError(f"value for key {key!r} is an object array, not bytes-like")
        if not (value.flags.c_contiguous or value.flags.f_contiguous):
            value = np.ascontiguousarray(value)
        # F-contiguous arrays are taken in memory order, as zarr's own stores do
        return memoryview(value.reshape(-1, order="A").view(np.uint8))
    try:
        return memoryview(value).cast("B")
    except TypeError:
        raise TypeError(
            f"value for key {key!r} must be bytes-like (bytes, bytearray, memoryview, numpy array), "
            f"got {type(value).__name__}"
        ) from None


def to_bytes(key: str, value: Any) -> bytes:
    """:func:`as_buffer` copied into ``bytes`` (``bytes`` pass through).

    Raises
    ------
    TypeError
        If ``value`` is not bytes-like.
    """
    return value if isinstance(value, bytes) else bytes(as_buffer(key, value))


def register(cls: type, protocol: ZarrProtocol) -> None:
    """Register ``cls`` as a virtual subclass of zarr-python 2's ``protocol`` ABC, if zarr 2 is installed.

    ``"BaseStore"`` for the v2 proxy; ``"StoreV3"`` for the draft proxy, so
    zarr-python 2.18's experimental v3 API takes it as it is. Idempotent.
    """
    if (cls, protocol) in _registered:
        return
    _registered.add((cls, protocol))
    if importlib.util.find_spec("zarr") is None:
        return
    zarr = importlib.import_module("zarr")
    if not str(getattr(zarr, "__version__", "")).startswith("2."):
        return
    getattr(importlib.import_module("zarr._storage.store"), protocol).register(cls)


@cache
def _installed_zarr() -> str | None:
    """The installed zarr-python's version, ``None`` without one (read once per process)."""
    try:
        return version("zarr")
    except PackageNotFoundError:
        return None


def refuse_zarr3(store: str, instead: str) -> None:
    """Refuse to make the zarr-python 2 store named ``store`` where zarr-python 3 or later is installed.

    Only the public constructors ask: an unpickled copy and the command line
    (which reads stores without zarr-python) do not.

    Parameters
    ----------
    store : str
        The public name of the proxy class, as the message names it.
    instead : str
        What to do instead, with the extras that install it.

    Raises
    ------
    ConfigurationError
        If the installed zarr-python is 3 or later (the message names the
        store, that version and ``instead``).
    """
    installed = _installed_zarr()
    if installed is not None and not installed.startswith(("0.", "1.", "2.")):
        raise ConfigurationError(
            f"{store} is a zarr-python 2 store, but zarr-python {installed} is installed: {instead}"
        )


def reopen(cls: type[ProxyBase], store: Any, options: Options) -> ProxyBase:
    """A new proxy of class ``cls`` over ``store`` with ``options`` (what a pickled proxy unpickles to)."""
    return cls._reopen(store, options)


class ProxyBase(MutableMapping[str, Any]):
    """The part of a sharding proxy that does not depend on its key space.

    Attributes
    ----------
    options : Options
        The runtime options, validated once (never changed afterwards).
    """

    _store_version: ClassVar[int]
    _zarr_protocol: ClassVar[ZarrProtocol]
    options: Options
    _raw_store: Any  # what the user passed, for repr

    def _init_proxy(self, raw_store: Any, options: Options) -> None:
        """Record what every proxy has; called first by the subclass's setup."""
        self._raw_store = raw_store
        self.options = options
        register(type(self), self._zarr_protocol)

    @property
    @abstractmethod
    def base(self) -> object:
        """What the proxy stores into: the base store (as the subclass names it)."""

    # -- pickling ------------------------------------------------------------------

    @classmethod
    @abstractmethod
    def _reopen(cls, store: Any, options: Options) -> Self:
        """A proxy over ``store`` (as :meth:`_pickled_store` gave it) with ``options``, without a journal."""

    @abstractmethod
    def _pickled_store(self) -> Any:
        """What stands for the base store in a pickle (it pickles as its location, never as the proxy)."""

    def _check_picklable(self) -> None:
        """Raise if this store holds what a copy could not carry (the v2 proxy: unflushed writes)."""

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as ``(reopen, (class, base store, options))``; the copy writes through (no write-back).

        Raises
        ------
        UnflushedWritesError
            If the store holds buffered writes not yet in the base store.
        """
        self._check_picklable()
        return (reopen, (type(self), self._pickled_store(), self.options.for_copy()))

    # -- introspection -------------------------------------------------------------

    @abstractmethod
    def sharded_array(self, path: str) -> ShardedArray | None:
        """The key mapping of the sharded array at ``path``, or ``None`` (used by :func:`shardkv.rechunk_to_shards`)."""

    # -- lifecycle -----------------------------------------------------------------

    @abstractmethod
    def flush(self) -> None:
        """Write whatever is buffered to the base store."""

    @abstractmethod
    def close(self) -> None:
        """Write what is buffered and release the base store."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- zarr-python 2 store protocol -----------------------------------------------

    def __eq__(self, other: object) -> bool:
        return self is other

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._raw_store!r}, chunks_per_shard={self.options.chunks_per_shard.value!r})"

    def is_readable(self) -> bool:
        return True

    def is_writeable(self) -> bool:
        return True

    def is_listable(self) -> bool:
        return True

    def is_erasable(self) -> bool:
        return True
