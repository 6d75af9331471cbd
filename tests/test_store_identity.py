"""storage/identity.py: the store id a write-back journal is tied to, on real stores."""

from __future__ import annotations

import shutil
from pathlib import Path

import zarr

from shardkv import ShardedStore
from shardkv.storage.identity import STORE_ID_KEY, store_identity
from shardkv.storage.open import open_kv


def test_a_local_store_keeps_its_id_and_a_copy_differs_only_in_location(tmp_path: Path) -> None:
    root = tmp_path / "x"
    root.mkdir()
    first = store_identity(open_kv(str(root)), "v2")
    again = store_identity(open_kv(str(root)), "v2")
    assert first == again and len(first["store_id"]) == 32
    assert first["location"] == f"file:{root.resolve()}"
    assert (root / STORE_ID_KEY).read_bytes().decode() == first["store_id"]
    shutil.copytree(root, tmp_path / "copy")
    copy = store_identity(open_kv(str(tmp_path / "copy")), "v2")
    assert copy["store_id"] == first["store_id"] and copy["location"] != first["location"]


def test_two_mappings_get_two_ids_and_the_id_is_never_listed() -> None:
    a: dict[str, bytes] = {}
    b: dict[str, bytes] = {}
    assert store_identity(open_kv(a), "v2")["store_id"] != store_identity(open_kv(b), "v2")["store_id"]
    assert STORE_ID_KEY in a
    st = ShardedStore(a, chunks_per_shard=2)
    zarr.open_array(st, mode="w", shape=(4,), chunks=(2,), dtype="i4")
    assert not [k for k in st if "store-id" in k]
