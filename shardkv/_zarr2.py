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

__all__ = ["register", "StoreCapabilities"]

_done: set[type] = set()


def register(cls: type) -> None:
    """Register ``cls`` as a zarr-python 2 ``BaseStore`` if zarr 2 is installed (idempotent)."""
    if cls in _done:
        return
    _done.add(cls)
    if importlib.util.find_spec("zarr") is None:
        return
    zarr = importlib.import_module("zarr")
    if not str(getattr(zarr, "__version__", "")).startswith("2."):
        return
    store_module = importlib.import_module("zarr._storage.store")
    store_module.BaseStore.register(cls)


class StoreCapabilities:
    """The capability checks zarr-python 2 asks every store (``BaseStore`` protocol): all true."""

    def is_readable(self) -> bool:
        return True

    def is_writeable(self) -> bool:
        return True

    def is_listable(self) -> bool:
        return True

    def is_erasable(self) -> bool:
        return True
