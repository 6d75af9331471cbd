"""On-disk fixtures for the scale workloads, written with plain file writes (no zarr, no shardkv).

Two layouts of the same uint8 array, whose chunk ``(i, j, ...)`` holds the
bytes :func:`chunk_bytes` gives it:

* :func:`write_plain`: a Zarr v2 array (``.zarray``), one file per chunk,
  keys ``i.j`` in one flat directory, uncompressed: what zarr 2's
  ``DirectoryStore`` writes.
* :func:`write_sharded`: the same array as shardkv stores it: a v3
  ``zarr.json`` with one ``sharding_indexed`` codec (inner codec ``bytes``,
  index at the end, index codecs ``bytes`` little endian + ``crc32c``,
  chunk key encoding ``v2``) and one file per shard named ``i.j``. A shard
  holds its chunks back to back in C order, then the index: one
  ``(offset, nbytes)`` pair of little-endian uint64 per chunk of the shard
  (C order; ``2**64 - 1`` twice for a chunk outside the array), then the
  CRC32C of those index bytes (little-endian uint32).

Writing a million small files takes a while; the workloads make each fixture
once per process and reuse it across repetitions. Uses numpy and the standard
library only (``crc32c`` when installed, else a table-driven fallback).
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

MISSING = np.uint64(2**64 - 1)


def _crc32c_fallback() -> Callable[[bytes], int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)

    def crc(data: bytes) -> int:
        c = 0xFFFFFFFF
        for b in data:
            c = table[(c ^ b) & 0xFF] ^ (c >> 8)
        return c ^ 0xFFFFFFFF

    return crc


def _crc32c_function() -> Callable[[bytes], int]:
    try:
        from google_crc32c import value as crc32c
    except ImportError:  # the package is optional: indexes repeat, so the slow path runs a few times only
        return _crc32c_fallback()
    return lambda data: int(crc32c(data))


_crc32c = _crc32c_function()


def chunk_bytes(coords: tuple[int, ...], nbytes: int, seed: int) -> bytes:
    """The content of the chunk at grid ``coords``: ``nbytes`` seeded pseudo-random bytes."""
    key = seed * 1_000_003 + sum(c * 7919**k for k, c in enumerate(coords))
    return np.random.default_rng(key).integers(0, 256, size=nbytes, dtype=np.uint8).tobytes()


def _write_file(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _grid_coords(grid: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    return itertools.product(*(range(n) for n in grid))


def write_plain(
    root: str,
    grid: tuple[int, ...],
    chunk: tuple[int, ...],
    seed: int,
    content: Callable[[tuple[int, ...]], bytes] | None = None,
) -> None:
    """A Zarr v2 uint8 array at ``root`` of ``grid`` chunks of shape ``chunk``, one file per chunk.

    ``content(coords)`` gives a chunk's bytes (default :func:`chunk_bytes`);
    a cheap one matters at a million chunks.
    """
    os.makedirs(root)
    nbytes = int(np.prod(chunk))
    zarray = {
        "zarr_format": 2,
        "shape": [g * c for g, c in zip(grid, chunk, strict=True)],
        "chunks": list(chunk),
        "dtype": "|u1",
        "compressor": None,
        "fill_value": 0,
        "filters": None,
        "order": "C",
        "dimension_separator": ".",
    }
    _write_file(os.path.join(root, ".zarray"), json.dumps(zarray).encode())
    content = content or (lambda coords: chunk_bytes(coords, nbytes, seed))
    for coords in _grid_coords(grid):
        _write_file(os.path.join(root, ".".join(map(str, coords))), content(coords))


def sharded_metadata(grid: tuple[int, ...], chunk: tuple[int, ...], per_shard: tuple[int, ...]) -> dict[str, Any]:
    """The v3 ``zarr.json`` document of the sharded fixture."""
    return {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [g * c for g, c in zip(grid, chunk, strict=True)],
        "data_type": "uint8",
        "fill_value": 0,
        "attributes": {},
        "chunk_grid": {
            "name": "regular",
            "configuration": {"chunk_shape": [c * n for c, n in zip(chunk, per_shard, strict=True)]},
        },
        "chunk_key_encoding": {"name": "v2"},
        "codecs": [
            {
                "name": "sharding_indexed",
                "configuration": {
                    "chunk_shape": list(chunk),
                    "codecs": [{"name": "bytes"}],
                    "index_location": "end",
                    "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
                },
            }
        ],
    }


def write_sharded(
    root: str,
    grid: tuple[int, ...],
    chunk: tuple[int, ...],
    per_shard: tuple[int, ...],
    seed: int,
    content: Callable[[tuple[int, ...]], bytes] | None = None,
) -> int:
    """The same array as :func:`write_plain`, sharded ``per_shard`` chunks a shard; the number of shards."""
    os.makedirs(root)
    nbytes = int(np.prod(chunk))
    _write_file(os.path.join(root, "zarr.json"), json.dumps(sharded_metadata(grid, chunk, per_shard)).encode())
    content = content or (lambda coords: chunk_bytes(coords, nbytes, seed))
    shard_grid = tuple(-(-g // n) for g, n in zip(grid, per_shard, strict=True))
    trailers: dict[bytes, bytes] = {}  # index bytes -> index + crc (edge shards repeat, full shards too)
    count = 0
    for shard in _grid_coords(shard_grid):
        index = np.full((int(np.prod(per_shard)), 2), MISSING, dtype="<u8")
        parts: list[bytes] = []
        for k, local in enumerate(_grid_coords(per_shard)):
            coords = tuple(s * n + c for s, n, c in zip(shard, per_shard, local, strict=True))
            if all(c < g for c, g in zip(coords, grid, strict=True)):
                index[k] = (len(parts) * nbytes, nbytes)
                parts.append(content(coords))
        raw = index.tobytes()
        if raw not in trailers:
            trailers[raw] = raw + int(_crc32c(raw)).to_bytes(4, "little")
        _write_file(os.path.join(root, ".".join(map(str, shard))), b"".join(parts) + trailers[raw])
        count += 1
    return count
