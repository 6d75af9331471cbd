"""Convert the real reference data and check it against zarr-python 2.18 and the source files.

* every array (173 in zarr-python's fixture, 4 in zarr_implementations'
  zarr.zr) read through ShardedStore with zarr-python 2.18 equals the
  original read with zarr-python 2.18 directly;
* every inner chunk in the shards is byte for byte the source chunk file
  (the shards are parsed here with numpy, independently of shardkv);
* the number of stored objects is what the chunk grids predict.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import zarr

from shardkv import ShardedStore
from shardkv.cli.convert import convert
from shardkv.metadata.hierarchy import group_paths
from shardkv.metadata.v3_view import v3_view_of_v2

CASES = {
    # id: (dataset, chunks_per_shard, index_location, index_checksum)
    "fixture-2": ("zarr-python-fixture", 2, "end", True),
    "fixture-2,3-start-nocrc": ("zarr-python-fixture", (2, 3), "start", False),
    "astronaut-4": ("zarr_implementations/examples/zarr.zr", 4, "end", True),
    "astronaut-2,2,1-start": ("zarr_implementations/examples/zarr.zr", (2, 2, 1), "start", True),
}


def _source_arrays(root: Path) -> dict[str, dict]:
    """Per array under ``root``: .zarray, separator, in-grid chunk files, stale and other files."""
    arrays = {}
    for zarray_path in sorted(root.rglob(".zarray")):
        adir = zarray_path.parent
        zarray = json.loads(zarray_path.read_text())
        shape, chunks = zarray["shape"], zarray["chunks"]
        files = sorted(p.relative_to(adir).as_posix() for p in adir.rglob("*") if p.is_file())
        data_files = [f for f in files if not f.rpartition("/")[2].startswith(".")]
        sep = zarray.get("dimension_separator") or ("/" if any("/" in f for f in data_files) else ".")
        grid = [math.ceil(s / c) for s, c in zip(shape, chunks, strict=True)]
        in_grid, stale = {}, []
        for f in data_files:
            parts = f.split(sep) if shape else [f]
            assert all(p.isdigit() for p in parts) and len(parts) == max(len(shape), 1), f"unexpected file {adir / f}"
            coords = tuple(int(p) for p in parts) if shape else ()
            if all(c < g for c, g in zip(coords, grid, strict=True)):
                in_grid[coords] = adir / f
            else:
                stale.append(f)
        arrays[adir.relative_to(root).as_posix()] = {
            "zarray": zarray,
            "sep": sep,
            "grid": grid,
            "chunks": in_grid,
            "stale": stale,
            "n_files": len(files),
        }
    return arrays


def _cps_for(chunks_per_shard, ndim: int):
    if ndim == 0:
        return None
    if isinstance(chunks_per_shard, int):
        return (chunks_per_shard,) * ndim
    return tuple(chunks_per_shard) if len(chunks_per_shard) == ndim else None


def _parse_shard(blob: bytes, n: int, index_location: str, checksum: bool) -> np.ndarray:
    """(offset, nbytes) pairs of a shard, read with numpy (little-endian uint64)."""
    index_nbytes = 16 * n + (4 if checksum else 0)
    raw = blob[:index_nbytes] if index_location == "start" else blob[len(blob) - index_nbytes :]
    return np.frombuffer(raw[: 16 * n], dtype="<u8").reshape(n, 2)


@pytest.fixture(scope="module", params=list(CASES), ids=list(CASES))
def converted(request, shared_data, tmp_path_factory):
    dataset, cps, location, checksum = CASES[request.param]
    src = shared_data / dataset
    dst = tmp_path_factory.mktemp("converted") / "out.zarr"
    report = convert(str(src), str(dst), cps, index_location=location, index_checksum=checksum)
    return src, dst, report, cps, location, checksum


def _open_original(src: Path, path: str, sep_in_zarray: bool):
    store = zarr.DirectoryStore(str(src)) if sep_in_zarray else zarr.NestedDirectoryStore(str(src))
    return zarr.open_array(store, path=path, mode="r")


@pytest.mark.filterwarnings("ignore:The NestedDirectoryStore is deprecated:FutureWarning")
def test_every_array_reads_back_equal_with_zarr(converted):
    src, dst, report, cps, _, _ = converted
    arrays = _source_arrays(src)
    assert len(arrays) == len(report.arrays) > 0
    sharded = ShardedStore(str(dst))
    failures = []
    for path, info in arrays.items():
        nested_legacy = info["sep"] == "/" and "dimension_separator" not in info["zarray"]
        original = _open_original(src, path, not nested_legacy)
        copy = zarr.open_array(sharded, path=path, mode="r")
        expected, actual = original[...], copy[...]
        try:
            assert actual.dtype == expected.dtype and actual.shape == expected.shape
            np.testing.assert_array_equal(actual, expected)  # NaNs in the same places compare equal
            assert (sharded.sharded_array(path) is not None) == (
                _cps_for(cps, len(info["zarray"]["shape"])) is not None
            )
        except AssertionError as exc:
            failures.append(f"{path}: {str(exc).strip().splitlines()[0]}")
    assert not failures, f"{len(failures)} arrays differ: {failures[:5]}"


def test_inner_chunks_are_the_source_files_byte_for_byte(converted):
    src, dst, report, cps, location, checksum = converted
    compared = 0
    for path, info in _source_arrays(src).items():
        ndim = len(info["zarray"]["shape"])
        array_cps = _cps_for(cps, ndim)
        if array_cps is None:
            continue
        n = math.prod(array_cps)
        adir = dst / path
        seen = set()
        for shard_file in sorted(
            p for p in adir.rglob("*") if p.is_file() and not p.name.startswith(".") and p.name != "zarr.json"
        ):
            shard_coords = tuple(int(p) for p in shard_file.relative_to(adir).as_posix().split(info["sep"]))
            blob = shard_file.read_bytes()
            index = _parse_shard(blob, n, location, checksum)
            for flat, (offset, nbytes) in enumerate(index):
                if offset == nbytes == 2**64 - 1:
                    continue
                local = np.unravel_index(flat, array_cps)
                chunk = tuple(int(s * c + i) for s, c, i in zip(shard_coords, array_cps, local, strict=True))
                assert chunk in info["chunks"], f"{path}: shard {shard_file.name} holds chunk {chunk} not in the source"
                assert blob[int(offset) : int(offset + nbytes)] == info["chunks"][chunk].read_bytes(), (path, chunk)
                seen.add(chunk)
        assert seen == set(info["chunks"]), f"{path}: chunks missing from the shards"
        compared += len(seen)
    assert compared == sum(a.chunks for a in report.sharded) > 0


def test_object_count_drops_as_the_grids_predict(converted):
    src, dst, report, cps, _, _ = converted
    expected = sum(1 for p in src.rglob("*") if p.is_file())
    assert report.objects_before == expected
    groups = {"" if p.parent == src else p.parent.relative_to(src).as_posix() for p in src.rglob(".zgroup")}
    for path, info in _source_arrays(src).items():
        array_cps = _cps_for(cps, len(info["zarray"]["shape"]))
        if array_cps is None:  # unsharded: a zarr.json mirror beside .zarray, unless no v3 reader decodes it
            described = bool(v3_view_of_v2(info["zarray"], None).metadata)
            expected += described
            groups.update(group_paths(path) if described else [])
            continue
        shards = {tuple(c // n for c, n in zip(coords, array_cps, strict=True)) for coords in info["chunks"]}
        # zarr.json replaces .zarray, attributes move inside it
        expected += len(shards) - len(info["chunks"]) - len(info["stale"]) - (src / path / ".zattrs").is_file()
        groups.update(group_paths(path))
    # v3 all the way down: every group's zarr.json replaces its .zgroup and .zattrs
    expected += sum(1 - (src / g / ".zgroup").is_file() - (src / g / ".zattrs").is_file() for g in groups)
    stored = sum(1 for p in dst.rglob("*") if p.is_file())
    assert stored == expected == report.objects_after
    assert report.objects_after < report.objects_before
    assert report.bytes_after == sum(p.stat().st_size for p in dst.rglob("*") if p.is_file())
    assert report.bytes_before == sum(p.stat().st_size for p in src.rglob("*") if p.is_file())


def _codecs_normalised(zarray: dict) -> dict:
    import numcodecs

    def norm(conf):
        return None if conf is None else numcodecs.get_codec(dict(conf)).get_config()

    filters = [norm(f) for f in zarray.get("filters") or []] or None
    order = "C" if len(zarray["shape"]) <= 1 else zarray["order"]  # the same bytes for 0-d and 1-d
    dtype = np.dtype(zarray["dtype"] if isinstance(zarray["dtype"], str) else [tuple(f) for f in zarray["dtype"]])
    fill = zarr.meta.Metadata2.decode_fill_value(zarray["fill_value"], dtype)  # the value zarr 2 reads
    fill = repr(np.asarray(fill, dtype=dtype).tobytes()) if fill is not None else None
    return {
        **zarray,
        "compressor": norm(zarray.get("compressor")),
        "filters": filters,
        "order": order,
        "fill_value": fill,
    }


def test_metadata_is_copied(converted):
    """Documents stored as they were, or (sharded arrays and their groups) presented equal."""
    src, dst, _, _, _, _ = converted
    proxy = ShardedStore(str(dst))
    for p in src.rglob("*"):
        key = p.relative_to(src).as_posix()
        copy = dst / key
        if p.name not in (".zgroup", ".zattrs", ".zarray"):
            continue
        if copy.exists() and p.name != ".zarray":
            assert copy.read_bytes() == p.read_bytes(), p
            continue
        if not copy.exists() and key not in proxy:  # an empty .zattrs is not presented
            assert p.name == ".zattrs" and json.loads(p.read_text()) == {}, p
            continue
        before, after = json.loads(p.read_text()), json.loads(copy.read_text() if copy.exists() else proxy[key])
        if p.name == ".zarray" and not copy.exists():  # presented: codecs as numcodecs configures them
            before, after = _codecs_normalised(before), _codecs_normalised(after)
        if p.name == ".zarray" and after != before:
            # only a detected '/' separator may be added (nested_legacy)
            assert "dimension_separator" not in before and after.pop("dimension_separator") == "/", p
        assert after == before, p
    assert os.path.exists(dst / ".zgroup") or json.loads((dst / "zarr.json").read_text())["node_type"] == "group"
