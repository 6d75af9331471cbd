"""One chunk write goes straight down: the shardkv functions and files an update of a stored shard runs (zarr 3).

As tests/test_call_depth.py, through :class:`shardkv.zarr3.ShardedStore` (its
worker threads profiled too).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("zarr.abc.store")

import zarr  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from call_depth import describe, functions_called  # noqa: E402

from shardkv.zarr3 import ShardedStore  # noqa: E402

MAX_FUNCTIONS = 100
MAX_FILES = 15  # facade, keys, engine, format, storage: one write goes straight down
MAX_FACADE_FILES = 3  # store, batching, nodes: the facade hands a batch of chunks straight to write-back


def test_one_chunk_update_calls_few_functions_in_few_files(tmp_path: Path) -> None:
    store = ShardedStore(str(tmp_path), chunks_per_shard=(4, 4))
    z = zarr.create_array(store, shape=(64, 64), chunks=(8, 8), dtype="u2", fill_value=0)
    z[...] = np.arange(64 * 64, dtype="u2").reshape(64, 64)
    z[8:16, 0:8] = 5  # the first update of a stored shard: one-time probes of its directory

    def update() -> None:
        z[0:8, 0:8] = 7

    seen = functions_called(update)
    files = {f for f, _, _ in seen}
    assert len(seen) <= MAX_FUNCTIONS, describe(seen)
    assert len(files) <= MAX_FILES, sorted(os.path.relpath(f) for f in files)
    facade = sorted(os.path.relpath(f) for f in files if f"{os.sep}zarr3{os.sep}" in f)
    assert len(facade) <= MAX_FACADE_FILES, facade
    expected = np.arange(64 * 64, dtype="u2").reshape(64, 64)
    expected[8:16, 0:8], expected[0:8, 0:8] = 5, 7
    assert (zarr.open_array(ShardedStore(str(tmp_path), read_only=True), mode="r")[...] == expected).all()
