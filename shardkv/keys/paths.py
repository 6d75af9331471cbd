"""Hierarchy paths: splitting and joining keys, and which array owns a key. Pure.

Arrays have no children (Zarr v2 and v3 alike), so the array that owns a
key is the *first* array met walking the key's prefixes from the root.
:func:`owner_candidates` yields those prefixes in that order; callers that
learn what a path is lazily (with a store read per path) walk it themselves,
and :func:`owning_array` answers from a known set of array paths.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterator

from shardkv.errors import InvalidKeyError

__all__ = ["split_key", "join_path", "path_prefix", "owner_candidates", "owning_array", "validate_path"]

_FORBIDDEN_CHARS = {"\\": "a backslash", "\x00": "a NUL character"}


def validate_path(path: object, *, what: str = "path") -> str:
    """Check a hierarchy path given to a path-taking method and return it normalised.

    The one gate for every method that takes a path rather than a key
    (``rmdir``, ``rename``, ``getsize``, ``listdir``, ``keys_under``, ...):
    whatever it returns names something inside the store. ``None``, ``""``
    and ``"/"`` name the root (returned as ``""``); one trailing ``/`` is
    dropped (``"g/a/"`` -> ``"g/a"``, as zarr's prefixes end). Everything else
    must be a valid key (see :func:`shardkv.keys.encodings.validate_key`).

    Parameters
    ----------
    path : str or None
        The path as received.
    what : str
        How the error names the argument (``"path"``, ``"src_path"``, ...).

    Returns
    -------
    str
        The path relative to the store root, without leading or trailing ``/``.

    Raises
    ------
    TypeError
        If ``path`` is neither a ``str`` nor ``None``.
    InvalidKeyError
        If ``path`` is absolute (leading ``/``), holds an empty segment
        (``a//b``), a segment of periods only (``.``, ``..``), a backslash
        or a NUL character. The error names the path as received.
    """
    if path is None or path in ("", "/"):
        return ""
    if not isinstance(path, str):
        raise TypeError(f"a {what} is a str, got {type(path).__name__}: {path!r}")
    for char, name in _FORBIDDEN_CHARS.items():
        if char in path:
            raise InvalidKeyError(path, f"{what} holds {name}")
    if path.startswith("/"):
        raise InvalidKeyError(path, f"absolute {what} (leading '/'); paths are relative to the store root")
    body = path[:-1] if path.endswith("/") else path
    for segment in body.split("/"):
        if segment == "":
            raise InvalidKeyError(path, f"{what} has an empty segment (doubled or trailing '/')")
        if set(segment) == {"."}:
            raise InvalidKeyError(path, f"{what} segment {segment!r} (only periods) is not allowed")
    return body


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
