"""Values written through the proxies: any bytes-like object, as contiguous bytes. Pure."""

from __future__ import annotations

from typing import Any

import numpy as np


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
