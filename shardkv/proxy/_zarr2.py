"""Let zarr-python 2 take a ShardedStore as a store in its own right.

zarr-python 2.11+ wraps any MutableMapping that is not a subclass of its
``BaseStore`` in ``KVStore``, which has no ``setitems``: every chunk would
then be written on its own. Registering the proxy as a virtual subclass of
``BaseStore`` (an ABC) lets zarr call the proxy's batch methods directly,
without shardkv depending on zarr. Done on first use, not at import.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Literal, Self

__all__ = ["register", "StoreCapabilities"]

_done: set[tuple[type, str]] = set()


def register(cls: type, protocol: Literal["BaseStore", "StoreV3"] = "BaseStore") -> None:
    """Register ``cls`` as a virtual subclass of zarr-python 2's ``protocol`` ABC, if zarr 2 is installed.

    ``"BaseStore"`` for the v2 proxy; ``"StoreV3"`` for the draft proxy, so
    zarr-python 2.18's experimental v3 API takes it as it is. Idempotent.
    """
    if (cls, protocol) in _done:
        return
    _done.add((cls, protocol))
    if importlib.util.find_spec("zarr") is None:
        return
    zarr = importlib.import_module("zarr")
    if not str(getattr(zarr, "__version__", "")).startswith("2."):
        return
    getattr(importlib.import_module("zarr._storage.store"), protocol).register(cls)


class StoreCapabilities:
    """What both proxies share as zarr-python 2 stores.

    The ``BaseStore`` capability checks (all true), use as a context manager
    (``close()`` on exit), identity equality, and a ``repr`` naming the base
    store and ``chunks_per_shard`` (``_raw_store`` and ``_cps`` of the subclass).
    """

    _raw_store: Any
    _cps: Any

    def close(self) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __eq__(self, other: object) -> bool:
        return self is other

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._raw_store!r}, chunks_per_shard={self._cps!r})"

    def is_readable(self) -> bool:
        return True

    def is_writeable(self) -> bool:
        return True

    def is_listable(self) -> bool:
        return True

    def is_erasable(self) -> bool:
        return True
