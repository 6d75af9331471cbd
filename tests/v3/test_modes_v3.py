"""zarr-python 3 reads the ``zarr.json`` view of sharded v2 arrays written in every write mode.

Modes: write-back
buffer (off / a small buffer that forces shards out early) x index location
(start / end) x inner chunk encoding (raw bytes / numcodecs GZip). There is no
zarr-python 2 in this environment, so the v2 array is made the way a v2
writer would make it, through ``ShardedStore`` directly (as the command line opens it: the
public constructor refuses to run beside zarr 3, whose store it is not): a ``.zarray``
document and whole encoded chunks (edge chunks full-size, as v2 stores them).
The expected array is a numpy model of the same writes and deletes. zarr 3
reads the directory after the last write and again after
:meth:`ShardedStore.compact`.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import zarr

from shardkv import ShardedStore
from shardkv.engine.options import Options

SHAPE, CHUNKS, CPS = (30, 22), (4, 4), (2, 3)
GRID = tuple(-(-s // c) for s, c in zip(SHAPE, CHUNKS, strict=True))  # (8, 6): edge chunks in both dimensions
FILL = -7
DTYPE = np.dtype("<i4")

pytestmark = pytest.mark.filterwarnings("ignore:Both zarr.json")


def zarray(compressor: str | None) -> bytes:
    doc = {
        "zarr_format": 2,
        "shape": list(SHAPE),
        "chunks": list(CHUNKS),
        "dtype": DTYPE.str,
        "compressor": None if compressor is None else {"id": "gzip", "level": 1},
        "fill_value": FILL,
        "filters": None,
        "order": "C",
    }
    return json.dumps(doc).encode()


def encode(chunk: np.ndarray, compressor: str | None) -> bytes:
    raw = np.ascontiguousarray(chunk, dtype=DTYPE).tobytes()
    return raw if compressor is None else numcodecs.GZip(level=1).encode(raw)


def region(coords: tuple[int, int]) -> tuple[slice, slice]:
    rows, cols = (slice(c * n, min((c + 1) * n, s)) for c, n, s in zip(coords, CHUNKS, SHAPE, strict=True))
    return rows, cols


def random_chunk(rng: np.random.Generator) -> np.ndarray:
    """A chunk whose encoded size varies with its kind (constant, narrow range, noise)."""
    kind = int(rng.integers(3))
    if kind == 0:
        return np.full(CHUNKS, int(rng.integers(-100, 100)), dtype=DTYPE)
    high = 4 if kind == 1 else 2**30
    return rng.integers(0, high, CHUNKS).astype(DTYPE)


def write_rounds(store: ShardedStore, compressor: str | None, seed: int) -> np.ndarray:
    """Rounds of chunk writes and deletes through the proxy; returns the expected array."""
    expected = np.full(SHAPE, FILL, dtype=DTYPE)
    present: set[tuple[int, int]] = set()
    everything = list(itertools.product(range(GRID[0]), range(GRID[1])))
    rng = np.random.default_rng(seed)
    for round_ in range(8):
        picked = [everything[i] for i in rng.choice(len(everything), size=12, replace=False)]
        values = {}
        for coords in picked:
            chunk = random_chunk(rng)
            values[f"a/{coords[0]}.{coords[1]}"] = encode(chunk, compressor)
            r = region(coords)
            expected[r] = chunk[: r[0].stop - r[0].start, : r[1].stop - r[1].start]
            present.add(coords)
        store.setitems(values)
        if round_ % 3 == 2:
            gone = sorted(present)[::4]
            store.delitems([f"a/{c[0]}.{c[1]}" for c in gone])
            for coords in gone:
                expected[region(coords)] = FILL
                present.discard(coords)
    return expected


MODES = list(itertools.product([None, 700], ["end", "start"], [None, "gzip"]))


@pytest.mark.parametrize(
    "buffer_bytes, index_location, compressor",
    MODES,
    ids=[f"{'buffer' if b else 'direct'}-{loc}-{c or 'raw'}" for b, loc, c in MODES],
)
def test_zarr3_reads_every_write_mode(
    tmp_path: Path, buffer_bytes: int | None, index_location: str, compressor: str | None
) -> None:
    root = tmp_path / "store"
    store = ShardedStore._reopen(
        str(root),
        # shards rewritten whole on any file system (reflink ones: tests/v3/test_tail_updates_v3.py)
        Options.from_keywords(CPS, index_location=index_location, buffer_bytes=buffer_bytes, shard_updates="rewrite"),
    )
    store["a/.zarray"] = zarray(compressor)
    expected = write_rounds(store, compressor, seed=len("rewrite") + (buffer_bytes or 0))
    store.close()

    z = zarr.open_array(str(root / "a"), mode="r")
    assert z.shape == SHAPE and z.dtype == DTYPE
    np.testing.assert_array_equal(z[:], expected)  # before compaction
    np.testing.assert_array_equal(z[5:19, 3:13], expected[5:19, 3:13])

    assert ShardedStore._reopen(str(root), Options.from_keywords()).compact() == 0  # shards are always written whole
    np.testing.assert_array_equal(zarr.open_array(str(root / "a"), mode="r")[:], expected)
