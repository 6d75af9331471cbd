"""``chunks_per_shard`` as users give it, and what it means for one array. Pure.

An int (along every dimension of every new array), a sequence of ints (for
arrays with that many dimensions), a mapping ``{array path: int or
sequence}``, or ``None`` (shard nothing new); 0-d arrays are never sharded.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

from shardkv.errors import ConfigurationError

if TYPE_CHECKING:
    import numpy as np

ChunksPerShardOption = int | Sequence[int] | Mapping[str, int | Sequence[int]] | None


def _is_int(value: object) -> TypeGuard[int | np.integer]:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)  # numpy's integers are Integral


def normalize_chunks_per_shard(value: int | Sequence[int], ndim: int, path: str | None = None) -> tuple[int, ...]:
    """Inner chunks per shard (an int, or one int >= 1 per dimension) along each of ``ndim`` dimensions.

    Raises
    ------
    ConfigurationError
        If the length differs from ``ndim`` or a value is < 1 or not an int.
    """
    if _is_int(value):
        cps = (int(value),) * ndim
    else:
        try:
            if not isinstance(value, Iterable):
                raise TypeError
            cps = tuple(value)
        except TypeError:
            raise ConfigurationError(
                f"chunks_per_shard must be an int or a tuple of ints, got {value!r}", path
            ) from None
        if len(cps) != ndim:
            raise ConfigurationError(
                f"chunks_per_shard {cps} has {len(cps)} value(s), the array has {ndim} dimension(s)", path
            )
    for c in cps:
        if not _is_int(c) or c < 1:
            raise ConfigurationError(f"chunks_per_shard values must be ints >= 1, got {cps}", path)
    return tuple(int(c) for c in cps)


def check_chunks_per_shard(value: Any, path: str | None = None) -> int | tuple[int, ...]:
    """Validate one ``chunks_per_shard`` value: an int >= 1, or a non-empty sequence of ints >= 1.

    Raises
    ------
    ConfigurationError
        Naming the value received.
    """
    if _is_int(value):
        if value < 1:
            raise ConfigurationError(f"chunks_per_shard must be >= 1, got {value}", path)
        return int(value)
    values = _as_tuple(value, path)
    if not values or any(not _is_int(v) or v < 1 for v in values):
        raise ConfigurationError(f"chunks_per_shard values must be ints >= 1, got {value!r}", path)
    return tuple(int(v) for v in values)


def _as_tuple(value: Any, path: str | None = None) -> tuple[Any, ...]:
    if isinstance(value, (str, bytes, bool)):
        raise ConfigurationError(f"chunks_per_shard must be an int or a tuple of ints, got {value!r}", path)
    try:
        return tuple(value)
    except TypeError:
        raise ConfigurationError(f"chunks_per_shard must be an int or a tuple of ints, got {value!r}", path) from None


@dataclass(frozen=True)
class ChunksPerShardRule:
    """A validated ``chunks_per_shard`` option (sequences as tuples, mapping keys as paths without ``/`` around)."""

    value: Any

    @classmethod
    def parse(cls, option: ChunksPerShardOption) -> ChunksPerShardRule:
        """Take an option as users give it; values are checked per array, by :meth:`for_array` (naming it).

        Raises
        ------
        ConfigurationError
            If ``option`` is neither ``None``, an int, a sequence nor a mapping.
        """
        if option is None or _is_int(option):
            return cls(option)
        if isinstance(option, Mapping):
            return cls({str(k).strip("/"): v if _is_int(v) else _as_tuple(v) for k, v in option.items()})
        return cls(_as_tuple(option))

    def for_array(self, path: str, ndim: int) -> tuple[int, ...] | None:
        """``chunks_per_shard`` of a new array with ``ndim`` dimensions at ``path``, or ``None`` (unsharded).

        Raises
        ------
        ConfigurationError
            If the mapping names ``path`` with a tuple of another length.
        """
        return None if self.why_unsharded(path, ndim) else normalize_chunks_per_shard(self._value_for(path), ndim, path)

    def why_unsharded(self, path: str, ndim: int) -> str | None:
        """Why a new array at ``path`` stays unsharded, or ``None`` when the rule shards it."""
        value = self.value
        if isinstance(value, dict) and path not in value:
            return "not named in chunks_per_shard"
        if value is None:
            return "no chunks_per_shard"
        if ndim == 0:
            return "0-d"
        value = self._value_for(path)
        if isinstance(value, tuple) and len(value) != ndim and not isinstance(self.value, dict):
            spec = ",".join(str(c) for c in value)
            return f"{ndim}-d; chunks_per_shard {spec} is for {len(value)}-d arrays"
        return None

    def _value_for(self, path: str) -> Any:
        return self.value[path] if isinstance(self.value, dict) else self.value
