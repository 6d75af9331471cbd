"""Interoperability both ways with zarr-python 2.18's own draft sharding transformer.

zarr 2.18 reads ``ZARR_V3_EXPERIMENTAL_API`` and ``ZARR_V3_SHARDING`` when its
modules are imported, so each configuration runs in its own subprocess:

1. zarr 2.18 with its own transformer (``ZARR_V3_SHARDING=1``) writes every case;
2. zarr 2.18 *without* ``ZARR_V3_SHARDING`` reads those stores through
   shardkv's proxy, and writes the same cases through the proxy (plus a
   shrinking resize and an append, which zarr's own transformer cannot do);
3. zarr 2.18's own transformer reads the stores shardkv wrote, straight from disk.

Every read is compared with a numpy model of the operations, and the inner
chunks stored by both writers are parsed with an independent ``struct``
reader of the draft's ``indexed`` format and compared byte for byte.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from math import ceil, prod
from pathlib import Path

import numpy as np
import pytest

EMPTY = 2**64 - 1

CASES = {
    "1d-slash-raw-i2": dict(shape=[23], chunks=[3], cps=[4], dtype="<i2", sep="/", compressor=None, fill=0),
    "1d-dot-gzip-be-i4": dict(shape=[23], chunks=[3], cps=[3], dtype=">i4", sep=".", compressor="gzip", fill=0),
    "2d-slash-blosc-be-f8": dict(
        shape=[10, 11], chunks=[2, 3], cps=[2, 3], dtype=">f8", sep="/", compressor="blosc", fill=0
    ),
    "2d-dot-zstd-u1": dict(shape=[10, 11], chunks=[2, 2], cps=[3, 1], dtype="u1", sep=".", compressor="zstd", fill=7),
    "3d-slash-gzip-i8": dict(
        shape=[7, 9, 5], chunks=[2, 3, 2], cps=[3, 1, 2], dtype="<i8", sep="/", compressor="gzip", fill=0
    ),
    "3d-dot-raw-be-u2": dict(
        shape=[7, 9, 5], chunks=[2, 3, 2], cps=[2, 2, 3], dtype=">u2", sep=".", compressor=None, fill=3
    ),
}


def base_ops(case: dict) -> list:
    """Partly written shards, an overwrite, deleted chunks and a region set to the fill value."""
    shape, chunks = case["shape"], case["chunks"]
    nd = len(shape)
    first = [[0, max(1, int(s * 0.6))] for s in shape]
    middle = [[s // 4, max(s // 4 + 1, (3 * s) // 4)] for s in shape]
    fill_box = [[chunks[0], 2 * chunks[0]]] + [[0, chunks[d]] for d in range(1, nd)]  # chunk (1, 0, ...)
    return [
        ["write", first, 1],
        ["write", middle, 5],
        ["delete", [[0] * nd, [0] * (nd - 1) + [1]]],
        ["fill", fill_box],
    ]


def extra_ops(case: dict) -> list:
    """A shrinking resize along dim 0 then an append (zarr 2.18's own transformer loses the entry)."""
    shape = case["shape"]
    return [["resize", [max(1, shape[0] - 4)] + shape[1:]], ["append", 3, 9]]


def _values(shape, seed, dtype):
    return ((np.arange(prod(shape), dtype="i8").reshape(shape) * 7 + seed) % 200).astype(dtype)


def model(case: dict, ops: list) -> np.ndarray:
    """The array the operations must leave, in numpy."""
    arr = np.full(case["shape"], case["fill"], dtype=case["dtype"])
    chunks = case["chunks"]
    for op in ops:
        if op[0] == "write":
            box = tuple(slice(a, b) for a, b in op[1])
            arr[box] = _values([b - a for a, b in op[1]], op[2], case["dtype"])
        elif op[0] == "fill":
            arr[tuple(slice(a, b) for a, b in op[1])] = case["fill"]
        elif op[0] == "delete":
            for coords in op[1]:
                arr[tuple(slice(c * n, (c + 1) * n) for c, n in zip(coords, chunks, strict=True))] = case["fill"]
        elif op[0] == "resize":
            arr = arr[tuple(slice(0, s) for s in op[1])]
        elif op[0] == "append":
            arr = np.concatenate([arr, _values([op[1], *arr.shape[1:]], op[2], case["dtype"])], axis=0)
    return arr


COMMON = textwrap.dedent(
    """
    import json, sys, warnings
    import numpy as np, numcodecs
    from math import prod
    warnings.simplefilter("ignore")
    cfg = json.loads(sys.stdin.read())

    def compressor(name):
        return {None: None, "gzip": numcodecs.GZip(level=1), "zstd": numcodecs.Zstd(level=3),
                "blosc": numcodecs.Blosc(cname="zstd", clevel=3, shuffle=numcodecs.Blosc.SHUFFLE)}[name]

    def values(shape, seed, dtype):
        return ((np.arange(prod(shape), dtype="i8").reshape(shape) * 7 + seed) % 200).astype(dtype)

    def apply(arr, case, ops, delete_key):
        for op in ops:
            if op[0] == "write":
                arr[tuple(slice(a, b) for a, b in op[1])] = values([b - a for a, b in op[1]], op[2], case["dtype"])
            elif op[0] == "fill":
                arr[tuple(slice(a, b) for a, b in op[1])] = case["fill"]
            elif op[0] == "delete":
                for coords in op[1]:
                    delete_key(arr._chunk_key(tuple(coords)))
            elif op[0] == "resize":
                arr.resize(*op[1])
            elif op[0] == "append":
                arr.append(values([op[1], *arr.shape[1:]], op[2], case["dtype"]), axis=0)

    def create(store, case, **kw):
        import zarr
        return zarr.create(shape=case["shape"], chunks=case["chunks"], dtype=case["dtype"],
                           compressor=compressor(case["compressor"]), fill_value=case["fill"], store=store,
                           path="g/arr", zarr_version=3, dimension_separator=case["sep"],
                           write_empty_chunks=False, **kw)
    """
)

PHASE1_ZARR_WRITES = COMMON + textwrap.dedent(
    """
    import zarr
    from zarr._storage.v3 import DirectoryStoreV3
    from zarr._storage.v3_storage_transformers import ShardingStorageTransformer
    for name, case in cfg["cases"].items():
        store = DirectoryStoreV3(f"{cfg['dir']}/zarr/{name}")
        arr = create(store, case, storage_transformers=[ShardingStorageTransformer("indexed", case["cps"])])
        apply(arr, case, case["base_ops"], lambda key: arr.chunk_store.__delitem__(key))
        np.save(f"{cfg['dir']}/out/{name}.zarr-own.npy", arr[...])
    """
)

PHASE2_SHARDKV = COMMON + textwrap.dedent(
    """
    import os, zarr
    from shardkv import open_store
    from shardkv.proxy.draft import DraftShardedStore
    assert "ZARR_V3_SHARDING" not in os.environ
    report = {}
    for name, case in cfg["cases"].items():
        proxy = open_store(f"{cfg['dir']}/zarr/{name}")  # detected: a draft hierarchy
        assert isinstance(proxy, DraftShardedStore), type(proxy)
        arr = zarr.open_array(proxy, path="g/arr", mode="r")
        np.save(f"{cfg['dir']}/out/{name}.shardkv-reads-zarr.npy", arr[...])
        for variant, ops in (("base", case["base_ops"]), ("extra", case["base_ops"] + case["extra_ops"])):
            proxy = open_store(f"{cfg['dir']}/shardkv-{variant}/{name}", chunks_per_shard=case["cps"],
                               layout="draft2022")
            arr = create(proxy, case)
            apply(arr, case, ops, proxy.__delitem__)
            np.save(f"{cfg['dir']}/out/{name}.shardkv-{variant}.npy", arr[...])
            visible = json.loads(proxy["meta/root/g/arr.array.json"])
            report[f"{name}/{variant}"] = {"visible_has_transformers": "storage_transformers" in visible,
                                           "stored": proxy.storage_transformers("g/arr"),
                                           "nchunks_initialized": arr.nchunks_initialized}
    print(json.dumps(report))
    """
)

PHASE3_ZARR_READS = COMMON + textwrap.dedent(
    """
    import zarr
    from zarr._storage.v3 import DirectoryStoreV3
    for name in cfg["cases"]:
        for variant in ("base", "extra"):
            arr = zarr.open_array(DirectoryStoreV3(f"{cfg['dir']}/shardkv-{variant}/{name}"), path="g/arr", mode="r")
            assert type(arr.chunk_store).__name__ == "ShardingStorageTransformer", type(arr.chunk_store)
            np.save(f"{cfg['dir']}/out/{name}.zarr-reads-shardkv-{variant}.npy", arr[...])
    """
)


def run_phase(code: str, cfg: dict, sharding: bool) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("ZARR_V3_SHARDING", "ZARR_V3_EXPERIMENTAL_API")}
    env["ZARR_V3_EXPERIMENTAL_API"] = "1"
    if sharding:
        env["ZARR_V3_SHARDING"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(cfg), env=env, capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0:
        pytest.fail(f"subprocess failed (sharding={sharding}):\n{proc.stderr[-4000:]}")
    return proc.stdout


@pytest.fixture(scope="module")
def interop(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    pytest.importorskip("zarr", minversion="2.18")
    root = tmp_path_factory.mktemp("interop")
    (root / "out").mkdir()
    cases = {n: {**c, "base_ops": base_ops(c), "extra_ops": extra_ops(c)} for n, c in CASES.items()}
    cfg = {"dir": str(root), "cases": cases}
    run_phase(PHASE1_ZARR_WRITES, cfg, sharding=True)
    report = json.loads(run_phase(PHASE2_SHARDKV, cfg, sharding=False).strip().splitlines()[-1])
    run_phase(PHASE3_ZARR_READS, cfg, sharding=True)
    return root, report


def _load(root: Path, name: str, what: str) -> np.ndarray:
    return np.load(root / "out" / f"{name}.{what}.npy")


@pytest.mark.parametrize("name", list(CASES))
def test_zarr_own_transformer_matches_the_model(interop, name):
    root, _ = interop
    np.testing.assert_array_equal(_load(root, name, "zarr-own"), model(CASES[name], base_ops(CASES[name])))


@pytest.mark.parametrize("name", list(CASES))
def test_shardkv_reads_what_zarr_own_transformer_wrote(interop, name):
    root, _ = interop
    expected = model(CASES[name], base_ops(CASES[name]))
    got = _load(root, name, "shardkv-reads-zarr")
    assert got.dtype == np.dtype(CASES[name]["dtype"])
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("variant", ["base", "extra"])
@pytest.mark.parametrize("name", list(CASES))
def test_zarr_own_transformer_reads_what_shardkv_wrote(interop, name, variant):
    root, report = interop
    case = CASES[name]
    ops = base_ops(case) + (extra_ops(case) if variant == "extra" else [])
    expected = model(case, ops)
    np.testing.assert_array_equal(_load(root, name, f"shardkv-{variant}"), expected)
    np.testing.assert_array_equal(_load(root, name, f"zarr-reads-shardkv-{variant}"), expected)
    info = report[f"{name}/{variant}"]
    assert info["visible_has_transformers"] is False  # code above never sees the transformer
    entry = {
        "extension": "https://purl.org/zarr/spec/storage_transformers/sharding/1.0",
        "type": "indexed",
        "configuration": {"chunks_per_shard": case["cps"]},
    }
    assert info["stored"] == [entry]  # kept through resize and append
    stored = json.loads((root / f"shardkv-{variant}" / name / "meta/root/g/arr.array.json").read_text())
    assert stored["storage_transformers"] == [entry] and stored["shape"] == list(expected.shape)


# -- the stored bytes, read with an independent parser ----------------------------------------------


def parse_indexed_shard(blob: bytes, n_chunks: int) -> list[tuple[int, int]]:
    """(offset, nbytes) pairs of a draft 'indexed' shard: n little-endian uint64 pairs at the very end."""
    if len(blob) < 16 * n_chunks:
        raise AssertionError(f"shard of {len(blob)} bytes is shorter than its {16 * n_chunks}-byte index")
    return [struct.unpack_from("<QQ", blob, len(blob) - 16 * n_chunks + 16 * i) for i in range(n_chunks)]


def stored_chunks(array_dir: Path, case: dict) -> dict[tuple[int, ...], bytes]:
    """Chunk coords -> stored (encoded) chunk bytes of every shard under ``array_dir``."""
    cps, sep = case["cps"], case["sep"]
    n = prod(cps)
    local_order = [tuple(int(x) for x in np.unravel_index(i, cps)) for i in range(n)]  # row-major (C)
    out = {}
    for path in array_dir.rglob("*"):
        if not path.is_file():
            continue
        rel = path.relative_to(array_dir).as_posix()
        assert rel.startswith("c"), rel
        shard = tuple(int(x) for x in rel[1:].split(sep))
        blob = path.read_bytes()
        data_end = len(blob) - 16 * n
        for local, (offset, nbytes) in zip(local_order, parse_indexed_shard(blob, n), strict=True):
            if (offset, nbytes) == (EMPTY, EMPTY):
                continue
            assert offset != EMPTY and nbytes != EMPTY, "half-empty index entry"
            assert 0 <= offset and offset + nbytes <= data_end, (rel, local, offset, nbytes, data_end)
            out[tuple(s * c + i for s, c, i in zip(shard, cps, local, strict=True))] = blob[offset : offset + nbytes]
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_shards_are_the_draft_indexed_layout_byte_for_byte(interop, name):
    root, _ = interop
    case = CASES[name]
    ours = stored_chunks(root / "shardkv-base" / name / "data/root/g/arr", case)
    theirs = stored_chunks(root / "zarr" / name / "data/root/g/arr", case)
    # the same operations with the same codecs: the same inner chunks, whoever packed them
    assert ours.keys() == theirs.keys()
    if case["compressor"] == "gzip":  # a gzip member carries its write time in bytes 4..7
        ours, theirs = ({k: v[:4] + v[8:] for k, v in d.items()} for d in (ours, theirs))
    assert ours == theirs
    grid = [ceil(s / c) for s, c in zip(case["shape"], case["chunks"], strict=True)]
    assert all(all(c < g for c, g in zip(coords, grid, strict=True)) for coords in ours)
    deleted = {tuple([0] * len(grid)), tuple([0] * (len(grid) - 1) + [1]), tuple([1] + [0] * (len(grid) - 1))}
    assert not deleted & ours.keys()


@pytest.mark.parametrize("name", list(CASES))
def test_rewritten_shards_are_compact_and_row_major(interop, name):
    """Shards shardkv built by rewriting: chunks back to back from byte 0 in row-major order, then the index."""
    root, _ = interop
    case = CASES[name]
    n = prod(case["cps"])
    checked = 0
    for path in (root / "shardkv-base" / name / "data/root/g/arr").rglob("*"):
        if not path.is_file():
            continue
        blob = path.read_bytes()
        entries = [e for e in parse_indexed_shard(blob, n) if e != (EMPTY, EMPTY)]
        expected_offset = 0
        compact = True
        for offset, nbytes in entries:
            compact &= offset == expected_offset
            expected_offset = offset + nbytes
        if compact and expected_offset + 16 * n == len(blob):
            checked += 1
        else:
            # a shard whose chunk was erased keeps its bytes and gets an index rewritten in place
            assert any(e == (EMPTY, EMPTY) for e in parse_indexed_shard(blob, n))
    assert checked > 0


# -- the command line on draft hierarchies: info, convert, verify and compact take each -------------


def _cli(capsys, *args) -> tuple[int, str]:
    from shardkv.cli.main import main

    capsys.readouterr()
    status = main([str(a) for a in args])
    out = capsys.readouterr()
    return status, out.out + out.err


def _unused_bytes(capsys, store: Path) -> int:
    status, out = _cli(capsys, "info", store, "--json")
    assert status == 0, out
    return sum(a["bytes_unused"] for a in json.loads(out)["arrays"])


def _chunks(store: Path) -> dict[str, bytes]:
    """Every chunk of the hierarchy as shardkv's draft proxy serves it (the stored, encoded bytes)."""
    from shardkv import open_store
    from shardkv.proxy.draft import DraftShardedStore

    proxy = open_store(str(store))
    assert isinstance(proxy, DraftShardedStore)
    return {k: bytes(proxy[k]) for k in proxy if k.startswith("data/")}


@pytest.mark.parametrize("name", list(CASES))
def test_verify_and_compact_take_draft_hierarchies_and_what_convert_makes_of_them(interop, name, tmp_path, capsys):
    import shutil

    root, _ = interop
    stores = []
    for variant in ("zarr", "shardkv-base", "shardkv-extra"):  # zarr 2.18's own transformer wrote the first
        stores.append(tmp_path / variant)
        shutil.copytree(root / variant / name, stores[-1])
    status, out = _cli(capsys, "convert", stores[0], tmp_path / "converted", "--chunks-per-shard", "2")
    assert status == 0, out
    stores.append(tmp_path / "converted")
    for store in stores:
        chunks, unused = _chunks(store), _unused_bytes(capsys, store)
        status, out = _cli(capsys, "verify", store, "--decode")
        assert status == 0 and out.rstrip().endswith("ok"), (store, out)
        assert "0 damaged" in out and " 0 shards" not in out, out
        status, out = _cli(capsys, "compact", store)
        assert status == 0, (store, out)
        assert out.strip().endswith(f": {unused} bytes reclaimed"), (store, unused, out)
        assert _unused_bytes(capsys, store) == 0
        assert _chunks(store) == chunks  # the same chunks, byte for byte
        status, out = _cli(capsys, "verify", store, "--decode")
        assert status == 0 and out.rstrip().endswith("ok"), (store, out)


def test_verify_finds_a_damaged_draft_shard(interop, tmp_path, capsys):
    import shutil

    root, _ = interop
    shutil.copytree(root / "zarr" / "2d-dot-zstd-u1", tmp_path / "z")
    shard = next(p for p in sorted((tmp_path / "z" / "data/root/g/arr").rglob("*")) if p.is_file())
    blob = bytearray(shard.read_bytes())
    blob[0] ^= 0xFF  # the first inner chunk's zstd frame, its magic number
    shard.write_bytes(bytes(blob))
    status, out = _cli(capsys, "verify", tmp_path / "z", "--decode")
    assert status == 1 and f"DAMAGED data/root/g/arr/{shard.name}" in out and "does not decode" in out, out
