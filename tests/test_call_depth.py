"""One chunk write goes straight down: the shardkv functions and files an update of a stored shard runs.

zarr-python 2.18 over :class:`shardkv.ShardedStore` on a local directory with the
default options: one ``z[block] = ...`` of one inner chunk of a shard already
stored, after a first such update (set-up done once per process or store is
not counted). The zarr 3 store's count is in tests/v3/test_zarr3_call_depth.py.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import zarr
from call_depth import describe, functions_called

from shardkv import ShardedStore

MAX_FUNCTIONS = 100
MAX_FILES = 15  # facade, keys, engine, format, storage: one write goes straight down
MAX_FACADE_FILES = 2  # store (routing, write advice) and nodes (the key's owner)


def test_one_chunk_update_calls_few_functions_in_few_files(tmp_path: Path) -> None:
    store = ShardedStore(str(tmp_path), chunks_per_shard=(4, 4))
    z = zarr.open_array(store, mode="w", shape=(64, 64), chunks=(8, 8), dtype="u2")
    z[...] = np.arange(64 * 64, dtype="u2").reshape(64, 64)
    z[8:16, 0:8] = 5  # the first update of a stored shard: one-time probes of its directory

    def update() -> None:
        z[0:8, 0:8] = 7

    seen = functions_called(update)
    files = {f for f, _, _ in seen}
    assert len(seen) <= MAX_FUNCTIONS, describe(seen)
    assert len(files) <= MAX_FILES, sorted(os.path.relpath(f) for f in files)
    facade = sorted(os.path.relpath(f) for f in files if f"{os.sep}proxy{os.sep}" in f)
    assert len(facade) <= MAX_FACADE_FILES, facade
    expected = np.arange(64 * 64, dtype="u2").reshape(64, 64)
    expected[8:16, 0:8], expected[0:8, 0:8] = 5, 7
    assert (zarr.open_array(ShardedStore(str(tmp_path)), mode="r")[...] == expected).all()


def test_one_chunk_write_checks_its_key_once(tmp_path: Path) -> None:
    """The key of a one-chunk ``setitems`` is validated, split and located once each (no re-check per layer)."""
    store = ShardedStore(str(tmp_path), chunks_per_shard=(4, 4))
    z = zarr.open_array(store, mode="w", shape=(64, 64), chunks=(8, 8), dtype="u2", compressor=None)
    z[...] = 1
    calls: Counter[str] = Counter()
    keys = f"{os.sep}shardkv{os.sep}keys{os.sep}"

    def profile(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "call" and keys in frame.f_code.co_filename:
            calls[frame.f_code.co_name] += 1

    sys.setprofile(profile)
    try:
        store.setitems({"0.0": np.full((8, 8), 7, "u2").tobytes()})
    finally:
        sys.setprofile(None)
    checks = {name: calls[name] for name in ("validate_key", "split_key", "is_chunk_segment", "locate")}
    assert checks == dict.fromkeys(checks, 1), calls
    assert (z[0:8, 0:8] == 7).all() and (z[8:, :] == 1).all()
