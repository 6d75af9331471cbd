"""What zarr-python 3 and tensorstore (without shardkv) read after zarr 2 metadata keys are deleted one by one.

The zarr 2 proxy (``shardkv.ShardedStore``, driven here with raw v2 keys) deletes
``.zarray``/``.zgroup``/``.zattrs`` each alone; a node still presenting something
keeps its ``zarr.json``, recording the deleted document in
``shardkv.v2_deleted`` (``must_understand: false``). v3 readers must then read
the array's values as zarr 2 wrote them, never a shard as one chunk, and
refuse nothing they read before.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorstore as ts
import zarr
from zarr.storage import LocalStore

from shardkv import ShardedStore
from shardkv.engine.options import Options
from shardkv.errors import ConfigurationError

pytestmark = pytest.mark.zarr3

DATA = np.arange(8, dtype="<i4") * 7
ZARRAY = {
    "zarr_format": 2,
    "shape": [8],
    "chunks": [2],
    "dtype": "<i4",
    "compressor": None,
    "fill_value": 0,
    "order": "C",
    "filters": None,
}


def _hierarchy(root: Path) -> ShardedStore:
    # as the command line opens it: the public constructor refuses to run beside zarr-python 3
    store = ShardedStore._reopen(str(root), Options.from_keywords(2))
    store[".zgroup"] = json.dumps({"zarr_format": 2}).encode()
    store["g/.zgroup"] = json.dumps({"zarr_format": 2}).encode()
    store["g/.zattrs"] = json.dumps({"title": "g"}).encode()
    store["g/a/.zarray"] = json.dumps(ZARRAY).encode()
    store["g/a/.zattrs"] = json.dumps({"units": "K"}).encode()
    for i in range(4):
        store[f"g/a/{i}"] = DATA[2 * i : 2 * i + 2].tobytes()
    return store


def _v3_reads(root: Path) -> tuple[np.ndarray, np.ndarray, dict]:
    z = zarr.open_array(LocalStore(str(root)), path="g/a", mode="r")
    t = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(root / "g/a")}}).result()
    return np.asarray(z[:]), t.read().result(), dict(z.attrs)


@pytest.mark.parametrize(
    "order", [["g/a/.zarray"], ["g/a/.zarray", "g/a/.zattrs"], ["g/a/.zattrs", "g/a/.zarray"]], ids="+".join
)
def test_v3_readers_read_the_chunks_as_zarr2_wrote_them(tmp_path: Path, order: list[str]) -> None:
    store = _hierarchy(tmp_path)
    for key in order:
        del store[key]
    assert sorted(k for k in store if k.startswith("g/a/")) == sorted(
        [f"g/a/{i}" for i in range(4)] + ([] if "g/a/.zattrs" in order else ["g/a/.zattrs"])
    )
    assert [bytes(store[f"g/a/{i}"]) for i in range(4)] == [DATA[2 * i : 2 * i + 2].tobytes() for i in range(4)]
    by_zarr, by_tensorstore, attrs = _v3_reads(tmp_path)
    np.testing.assert_array_equal(by_zarr, DATA)
    np.testing.assert_array_equal(by_tensorstore, DATA)
    assert attrs == ({} if "g/a/.zattrs" in order else {"units": "K"})
    recorded = json.loads((tmp_path / "g/a/zarr.json").read_text())["shardkv.v2_deleted"]
    assert recorded == {"must_understand": False, "documents": [".zarray"]}


def test_v3_readers_after_a_group_loses_its_zgroup(tmp_path: Path) -> None:
    store = _hierarchy(tmp_path)
    del store["g/.zgroup"]
    assert "g/.zgroup" not in store and json.loads(store["g/.zattrs"]) == {"title": "g"}
    assert zarr.open_group(LocalStore(str(tmp_path)), path="g", mode="r").attrs.asdict() == {"title": "g"}
    del store["g/.zattrs"]  # nothing of the group is left: its zarr.json goes
    assert not (tmp_path / "g/zarr.json").exists()
    np.testing.assert_array_equal(_v3_reads(tmp_path)[0], DATA)


def test_an_array_written_again_is_read_by_v3_readers(tmp_path: Path) -> None:
    store = _hierarchy(tmp_path)
    del store["g/a/.zarray"]
    with pytest.raises(ConfigurationError, match="still stored"):
        store["g/a/.zarray"] = json.dumps({**ZARRAY, "chunks": [4]}).encode()
    store["g/a/.zarray"] = json.dumps({**ZARRAY, "shape": [6]}).encode()  # the same chunks: a resize
    assert "shardkv.v2_deleted" not in json.loads((tmp_path / "g/a/zarr.json").read_text())
    by_zarr, by_tensorstore, attrs = _v3_reads(tmp_path)
    np.testing.assert_array_equal(by_zarr, DATA[:6])
    np.testing.assert_array_equal(by_tensorstore, DATA[:6])
    assert attrs == {"units": "K"}
