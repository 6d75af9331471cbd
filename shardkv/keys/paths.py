"""Keys and hierarchy paths: their rules, splitting and joining, and which array owns a key. Pure.

The owner rule is docs/architecture.md's "Which array owns a key"; what is
chunk-like is decided here only (:func:`is_chunk_segment`).
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

    A key is a ``str`` of ``/``-separated segments, none empty or of periods
    only (``.``, ``..``) (v3 core "Node names").

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
    """Check a path given to a path-taking method (``rmdir``, ``listdir``, ...) and return it normalised.

    ``None``, ``""`` and ``"/"`` name the root (``""``); one trailing ``/`` is
    dropped; the rest must be a valid key (:func:`validate_key`).

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
        If ``path`` is absolute, holds an empty segment, a segment of periods
        only, a backslash or a NUL character (named as received).
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
    """``""`` then every proper prefix of ``key``, keeping those whose following segment passes ``next_segment``."""
    segments = key.split("/")
    for i in range(len(segments)):
        if next_segment(segments[i]):
            yield "/".join(segments[:i])


def owning_array(
    key: str, array_paths: Container[str], next_segment: Callable[[str], bool] = _any_segment
) -> str | None:
    """The first of ``array_paths`` among :func:`owner_candidates` of ``key`` (the array holding it), or ``None``."""
    return next((p for p in owner_candidates(key, next_segment) if p in array_paths), None)


def is_chunk_segment(segment: str, *, well_formed: bool = False) -> bool:
    """True for a key segment that can be part of a chunk or shard key.

    With ``well_formed``, only the segments keys are written with (``c``,
    digits joined by ``.``, an optional leading ``c``); by default malformed
    ones (``-1.0``) count too, so that facades refuse them as chunk keys.
    """
    return (_WELL_FORMED_CHUNK_SEGMENT if well_formed else _CHUNK_SEGMENT).fullmatch(segment) is not None


def is_draft_chunk_segment(segment: str) -> bool:
    """True for the first segment of a 2022 draft chunk key below an array's data area (``c0/1/2``: ``c`` + coords)."""
    return segment.startswith("c")


def chunk_owner_paths(key: str) -> list[str]:
    """The paths of the arrays that could own ``key`` as a chunk or shard key, from the highest down.

    The prefixes followed by chunk-like segments only: ``"g/arr/1/2/3"`` ->
    ``["g/arr", "g/arr/1", "g/arr/1/2"]``; empty when the last segment is not chunk-like.
    """
    segments = key.split("/")
    if not _CHUNK_SEGMENT.fullmatch(segments[-1]):
        return []
    top = len(segments) - 1
    while top > 0 and _CHUNK_SEGMENT.fullmatch(segments[top - 1]):
        top -= 1
    return ["/".join(segments[:i]) for i in range(top, len(segments))]


def chunkish_under(path: str, key: str) -> bool:
    """True if ``key`` lies under ``path`` and every segment after it is chunk-like (a chunk or shard key of it)."""
    prefix = path_prefix(path)
    if not key.startswith(prefix) or len(key) == len(prefix):
        return False
    return all(_CHUNK_SEGMENT.fullmatch(s) for s in key[len(prefix) :].split("/"))
