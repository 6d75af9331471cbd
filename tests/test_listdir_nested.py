"""listdir inside a '/'-separated sharded array names what a plain dict names.

A shard of such an array holds chunks under several sub-paths (shard ``a/0/0``
of 2 x 2 chunks holds ``a/0/0``, ``a/0/1``, ``a/1/0`` and ``a/1/1``), so the names
under ``a/1`` come from a shard stored under ``a/0``, and a shard stored under
``a/0`` holds chunks that are not under ``a/0``.
"""

from __future__ import annotations

import pytest
import zarr

from shardkv import ShardedStore


def _listdir(plain: dict, path: str) -> list[str]:
    prefix = f"{path}/"
    return sorted({k[len(prefix) :].split("/")[0] for k in plain if k.startswith(prefix)})


@pytest.mark.parametrize("cps", [2, (2, 3), 1])
def test_listdir_of_the_rows_of_a_slash_separated_array(cps: object) -> None:
    store, plain = ShardedStore({}, chunks_per_shard=cps), {}
    for target in (store, plain):
        z = zarr.create(store=target, path="a", shape=(6, 6), chunks=(2, 2), dtype="i4", dimension_separator="/")
        z[:4, 2:] = 1  # chunk rows 0 and 1, columns 1 and 2
        del target["a/1/2"]
    for path in ("a", "a/0", "a/1", "a/2"):
        assert store.listdir(path) == _listdir(plain, path), path
