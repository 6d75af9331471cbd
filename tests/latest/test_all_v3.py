"""``convert --all-v3``: the whole converted hierarchy opens in the newest zarr 3 at its root.

Oracles: zarr-python 2.18 over a plain DirectoryStore (no shardkv) reads every
unsharded array equal to the source; the newest zarr-python 3 in .venv-latest
(no shardkv) opens every array from the root with the source's values, or
refuses the ones without a v3 data type, never misreading one.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr
from latest_helpers import Reader

from shardkv.metadata.v3_view import sharding_spec_from_v3


def _arrays(root: Path) -> list[str]:
    return sorted(p.parent.relative_to(root).as_posix() for p in root.rglob(".zarray"))


@pytest.mark.shared_data
@pytest.mark.parametrize("cps", [(2,), (2, 2)], ids=["1d-sharded", "2d-sharded"])
def test_all_v3_fixture_opens_at_the_root(
    shared_data: Path, tmp_path: Path, reader: Reader, cps: tuple[int, ...]
) -> None:
    from shardkv.cli.convert import convert

    src = shared_data / "zarr-python-fixture"
    dst = tmp_path / "dst"
    # arrays with len(cps) dimensions are sharded, the others stay unsharded and get a v3 zarr.json of their own
    convert(str(src), str(dst), cps, skip_mismatched=True, all_v3=True)
    source = zarr.DirectoryStore(str(src))
    plain = zarr.DirectoryStore(str(dst))
    paths = _arrays(src)
    docs = {p: json.loads((dst / p / "zarr.json").read_text()) for p in paths if (dst / p / "zarr.json").is_file()}
    # the source read by zarr 2 with the separator the destination names (convert detects "/" keys
    # of a .zarray without dimension_separator when it shards the array; unsharded ones are copied as they are)
    nested = zarr.NestedDirectoryStore(str(src))
    separators = {
        p: (d.get("chunk_key_encoding", {}).get("configuration") or {}).get("separator", ".") for p, d in docs.items()
    }
    expected = {
        p: zarr.open_array(nested if separators.get(p) == "/" else source, path=p, mode="r")[...] for p in paths
    }
    sharded = {p for p, d in docs.items() if sharding_spec_from_v3(d, p) is not None}
    unsharded = sorted(set(paths) - sharded)
    assert sharded and unsharded
    # kept: the v2 documents of unsharded arrays; zarr 2 without shardkv reads them right
    for path in unsharded:
        assert (dst / path / ".zarray").is_file(), path
        np.testing.assert_array_equal(zarr.open_array(plain, path=path, mode="r")[...], expected[path], err_msg=path)
    # every group has a v3 group document
    for zgroup in dst.rglob(".zgroup"):
        assert json.loads((zgroup.parent / "zarr.json").read_text())["node_type"] == "group", zgroup
    described = sorted(p for p in unsharded if p in docs)
    assert described, "unsharded arrays with a v3 data type get a zarr.json"
    for path in described:
        assert docs[path]["chunk_key_encoding"]["name"] == "v2"
        assert (
            docs[path]["chunk_grid"]["configuration"]["chunk_shape"]
            == json.loads((dst / path / ".zarray").read_text())["chunks"]
        )
    read = reader.run("zarr3", dst, *paths)
    refused = sorted(p for p in paths if not read[p]["ok"])
    for path in paths:
        if read[path]["ok"]:
            np.testing.assert_array_equal(read[path]["data"], expected[path], err_msg=path)
            assert read[path]["data"].shape == expected[path].shape, path
        else:  # only arrays with no v3 document (no v3 data type) may be refused
            data_type = docs[path]["data_type"] if path in docs else None
            opaque = isinstance(data_type, dict) and data_type["name"].startswith("shardkv.")
            assert path not in docs or opaque, (path, read[path].get("error"))
    assert len(refused) < len(paths) // 2, refused
