"""Hierarchy paths: splitting and joining keys, and which array owns a key. Pure.

Arrays have no children (Zarr v2 and v3 alike), so the array that owns a
key is the *first* array met walking the key's prefixes from the root.
:func:`owner_candidates` yields those prefixes in that order; callers that
learn what a path is lazily (with a store read per path) walk it themselves,
and :func:`owning_array` answers from a known set of array paths.
"""

from __future__ import annotations

from typing import Callable, Container, Iterator

__all__ = ["split_key", "join_path", "path_prefix", "owner_candidates", "owning_array"]


def split_key(key: str) -> tuple[str, str]:
    """``(path, name)`` of a key: ``"g/a/.zarray"`` -> ``("g/a", ".zarray")``, ``"0.0"`` -> ``("", "0.0")``."""
    path, _, name = key.rpartition("/")
    return path, name


def join_path(path: str, name: str) -> str:
    """The key of ``name`` under ``path`` (``""`` is the root)."""
    return f"{path}/{name}" if path else name


def path_prefix(path: str) -> str:
    """The key prefix of everything under ``path``: ``"g/a"`` -> ``"g/a/"``, ``""`` -> ``""``."""
    return f"{path}/" if path else ""


def _any_segment(segment: str) -> bool:
    return True


def owner_candidates(key: str, next_segment: Callable[[str], bool] = _any_segment) -> Iterator[str]:
    """Paths of the arrays that could own ``key``, from the root down.

    Parameters
    ----------
    key : str
        A ``/``-separated key, relative to the hierarchy root.
    next_segment : callable, optional
        Keeps only the prefixes whose following segment passes (for example
        "starts with ``c``" for the 2022 draft's chunk keys).

    Yields
    ------
    str
        ``""`` (the root) first, then every proper prefix of ``key``.
    """
    segments = key.split("/")
    for i in range(len(segments)):
        if next_segment(segments[i]):
            yield "/".join(segments[:i])


def owning_array(
    key: str, array_paths: Container[str], next_segment: Callable[[str], bool] = _any_segment
) -> str | None:
    """The path of the array that holds ``key`` (the first array above it), or ``None``.

    Parameters
    ----------
    key : str
        A ``/``-separated key, relative to the hierarchy root.
    array_paths : container of str
        The paths of the hierarchy's arrays (``""`` for a root array).
    next_segment : callable, optional
        As for :func:`owner_candidates`.
    """
    return next((p for p in owner_candidates(key, next_segment) if p in array_paths), None)
