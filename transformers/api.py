"""The abstract store interface that storage transformers implement and stack on.

:class:`AbstractStore` is the 2022 draft's ``StoreWithPartialAccess``. Its
conventions are those of :mod:`shardkv.format.ranges`: a byte range is a
half-open :class:`~shardkv.format.ranges.ByteRange` (a negative ``start``
without ``stop`` is a suffix); ``set_partial_values`` takes ``(key, start,
value)`` triples, a negative ``start`` counting from the end of the value
(:func:`apply_partial_writes`); ``""`` and ``"/"`` both mean "every key";
``list_dir(prefix)`` returns the keys directly below ``prefix`` and the
distinct ``prefix + name + "/"`` of deeper ones. :meth:`AbstractStore.set_values`
(a batch of the draft's ``set``) lets a transformer write a request's shards in one call.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence

from shardkv._types import BytesLike
from shardkv.format.ranges import ByteRange

KeyRange = tuple[str, ByteRange]
"""``(key, byte range)``: one request of ``get_partial_values``."""
KeyStartValue = tuple[str, int, BytesLike]
"""``(key, start, value)``: one write of ``set_partial_values`` (``start`` in bytes)."""


def normalize_prefix(prefix: str) -> str:
    """``""`` for the root prefixes ``""`` and ``"/"``; other prefixes unchanged.

    Raises
    ------
    TypeError
        If ``prefix`` is not a ``str``.
    """
    if not isinstance(prefix, str):
        raise TypeError(f"a key prefix is a str, got {type(prefix).__name__}: {prefix!r}")
    return "" if prefix == "/" else prefix


class AbstractStore(ABC):
    """The abstract store interface with partial access (2022 draft ``StoreWithPartialAccess``).

    Keys are ``/``-separated ``str``; values are bytes. Missing keys read as
    ``None`` in batch reads and raise ``KeyError(key)`` in single reads.
    Errors of the storage below other than "not found" propagate unchanged.
    """

    # -- the draft's operations ---------------------------------------------

    @abstractmethod
    def get_partial_values(self, key_ranges: Sequence[KeyRange]) -> list[bytes | None]:
        """Byte ranges of values, in request order; ``None`` where the key is not stored.

        A key may occur several times with different ranges. A range reaching
        past the end of a value returns the bytes up to the end.
        """

    @abstractmethod
    def set_partial_values(self, key_start_values: Sequence[KeyStartValue]) -> None:
        """Write values at byte offsets of stored values (see :func:`apply_partial_writes`)."""

    @abstractmethod
    def set_values(self, values: Mapping[str, BytesLike]) -> None:
        """Set several whole values (a batch of the draft's ``set``)."""

    @abstractmethod
    def erase_values(self, keys: Iterable[str]) -> None:
        """Erase the stored keys among ``keys``; keys not stored are ignored."""

    @abstractmethod
    def erase_prefix(self, prefix: str) -> None:
        """Erase every key that starts with ``prefix``."""

    @abstractmethod
    def list_prefix(self, prefix: str) -> list[str]:
        """Every stored key that starts with ``prefix``."""

    @abstractmethod
    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]:
        """``(keys, prefixes)`` directly below ``prefix`` (see the module docstring)."""

    # -- derived operations ---------------------------------------------------

    def get(self, key: str) -> bytes:
        """The whole value of ``key``.

        Raises
        ------
        KeyError
            If ``key`` is not stored.
        """
        value = self.get_partial_values([(key, ByteRange(0))])[0]
        if value is None:
            raise KeyError(key)
        return value

    def set(self, key: str, value: BytesLike) -> None:
        """Set the whole value of ``key``."""
        self.set_values({key: value})

    def erase(self, key: str) -> None:
        """Erase ``key``.

        Raises
        ------
        KeyError
            If ``key`` is not stored.
        """
        if not self.contains(key):
            raise KeyError(key)
        self.erase_values([key])

    def contains(self, key: str) -> bool:
        """True if ``key`` is stored (reads no value bytes)."""
        return self.get_partial_values([(key, ByteRange(0, 0))])[0] is not None

    def list(self) -> list[str]:
        """Every stored key (the draft: ``list_prefix("/")``)."""
        return self.list_prefix("/")
