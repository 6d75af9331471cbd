"""Hierarchy paths: splitting and joining keys, and which array owns a key. Pure.

The one owner rule of shardkv (docs/architecture.md, "Which array owns a
key"): arrays have no children, so the array that owns a chunk or shard key
is the *first* array met walking down from the root among the paths followed,
up to the key's last segment, by chunk-like segments only
(:func:`chunk_owner_paths`). What is chunk-like is decided here only
(:func:`is_chunk_segment`); :func:`owning_array` answers from a known set of
array paths, facades that learn paths lazily walk :func:`chunk_owner_paths`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Container, Iterator

from shardkv.errors import InvalidKeyError

# a segment that may be part of a chunk or shard key: "c" (v3 default keys c/1/2), "c1.2", "1.2", "3";
# signs and empty dot-parts included, so that "-1.0" is refused as a malformed chunk key, not stored as a value
_CHUNK_SEGMENT = re.compile(r"c|c?[0-9.+-]+")
# the segments a chunk or shard key actually has (digits between dots): what verify reports as left over
_WELL_FORMED_CHUNK_SEGMENT = re.compile(r"c|c?[0-9]+([.][0-9]+)*")

_FORBIDDEN_CHARS = {"\\": "a backslash", "\x00": "a NUL character"}


def validate_key(key: object) -> str:
    """Check the rules every key obeys and return it.

    A key is a ``str`` of ``/``-separated segments, none empty, none made of
    periods only (``.``, ``..``), with no leading or trailing ``/`` (v3 core
    "Node names").

    Raises
    ------
    TypeError
        If ``key`` is not a ``str``.
    InvalidKeyError
        If a rule is broken (the error names the key and the rule).
    """
    if not isinstance(key, str):
        raise TypeError(f"store keys are str, got {type(key).__name__}: {key!r}")
    if key == "":
        raise InvalidKeyError(key, "the empty key names no entry")
    for segment in key.split("/"):
        if segment == "":
            raise InvalidKeyError(key, "empty path segment (leading, trailing or doubled '/')")
        if set(segment) == {"."}:
            raise InvalidKeyError(key, f"path segment {segment!r} (only periods) is not allowed")
    return key


def validate_path(path: object, *, what: str = "path") -> str:
    """Check a hierarchy path given to a path-taking method and return it normalised.

    The one gate for every method that takes a path rather than a key
    (``rmdir``, ``rename``, ``getsize``, ``listdir``, ``keys_under``, ...):
    whatever it returns names something inside the store. ``None``, ``""``
    and ``"/"`` name the root (returned as ``""``); one trailing ``/`` is
    dropped (``"g/a/"`` -> ``"g/a"``, as zarr's prefixes end). Everything else
    must be a valid key (see :func:`validate_key`).

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


def is_chunk_segment(segment: str, *, well_formed: bool = False) -> bool:
    """True for a key segment that can be part of a chunk or shard key.

    Parameters
    ----------
    segment : str
        One ``/``-separated segment of a key.
    well_formed : bool
        Only the segments chunk and shard keys are written with (``c``, digits
        joined by ``.``, with an optional leading ``c``). By default malformed
        ones (signs, empty dot-parts: ``-1.0``) count too, so that a facade
        refuses them as malformed chunk keys instead of storing them as values.
    """
    return (_WELL_FORMED_CHUNK_SEGMENT if well_formed else _CHUNK_SEGMENT).fullmatch(segment) is not None


def is_draft_chunk_segment(segment: str) -> bool:
    """True for the first segment of a 2022 draft chunk key below an array's data area (``c0/1/2``: ``c`` + coords)."""
    return segment.startswith("c")


def chunk_owner_paths(key: str) -> list[str]:
    """The paths of the arrays that could own ``key`` as a chunk or shard key, from the highest down.

    Empty when the last segment is not chunk-like (it always is for a chunk
    or shard key). Otherwise the key's parent and each of its prefixes that is
    followed by chunk-like segments only: ``"g/arr/0.0"`` -> ``["g/arr"]``,
    ``"g/arr/1/2/3"`` -> ``["g/arr", "g/arr/1", "g/arr/1/2"]``, ``"3/0"`` ->
    ``["", "3"]``. The owner is the first of them that is an array.
    """
    segments = key.split("/")
    if not _CHUNK_SEGMENT.fullmatch(segments[-1]):
        return []
    top = len(segments) - 1
    while top > 0 and _CHUNK_SEGMENT.fullmatch(segments[top - 1]):
        top -= 1
    return ["/".join(segments[:i]) for i in range(top, len(segments))]


def prefix_owner_paths(prefix: str) -> list[str]:
    """The paths of the arrays that could own keys starting with ``prefix``, from the highest down.

    ``prefix`` is a listing prefix: it may end with ``/`` or inside a segment
    (``"g/a/c/1"`` for the keys ``g/a/c/1/...`` and ``g/a/c/12/...``). Every
    beginning of a chunk-like segment followed by a digit is chunk-like, so
    these are the owner paths of ``prefix + "0"``: ``"g/a/"`` -> ``["g/a"]``,
    ``""`` -> ``[""]``, ``"g/x"`` -> ``[]``.
    """
    return chunk_owner_paths(prefix + "0")


def chunkish_under(path: str, key: str) -> bool:
    """True if ``key`` lies under ``path`` and every segment after it is chunk-like (a chunk or shard key of it)."""
    prefix = path_prefix(path)
    if not key.startswith(prefix) or len(key) == len(prefix):
        return False
    return all(_CHUNK_SEGMENT.fullmatch(s) for s in key[len(prefix) :].split("/"))
