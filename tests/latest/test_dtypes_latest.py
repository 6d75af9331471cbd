"""Every zarr 2 array through ShardedStore, then at the root with the newest zarr 3 and tensorstore.

A hypothesis search over dtypes x filters x compressors x order x fill values:
each example is written through the proxy and through a zarr 2 ``MemoryStore``,
reopened through a fresh proxy and compared (values, dtype, fill value, order,
filters, compressor). Then the stored hierarchy is read at its root, without
shardkv, by the newest zarr 3 and tensorstore: each array reads equal to zarr 2's
values or fails with an error; never different values. Arrays whose
``zarr.json`` names a type zarr 3 registers must read in zarr 3.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from latest_helpers import Reader

from shardkv import ShardedStore
from shardkv.metadata.hierarchy import is_opaque

# dtype name -> (numpy dtype or special, the filters that fit it)
_NUMERIC = ["|b1", "|i1", "<i2", ">i4", "<i8", "|u1", ">u2", "<u4", "<u8", "<f2", "<f4", ">f8", "<f8", "<c8", ">c16"]
_OTHER = ["<M8[s]", "<M8[ns]", "<m8[ms]", "|S5", "<U3", ">U2", "|V4", "str", "bytes", "msgpack", "vlen-array"]
_STRUCTURED = {
    "struct": [("a", "<i4"), ("b", "<f8")],
    "nested": [("a", "<i2"), ("b", [("c", "<f4"), ("d", "|S3")])],
    "subarray": [("a", "<i4", (2,)), ("b", "|u1")],
    "bigendian-struct": [("a", ">i4")],
}
_COMPRESSORS = [
    None,
    numcodecs.Zlib(1),
    numcodecs.GZip(3),
    numcodecs.BZ2(1),
    numcodecs.LZMA(),
    numcodecs.LZ4(),
    numcodecs.Zstd(1),
    numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE),
    numcodecs.Blosc("zstd", 1, numcodecs.Blosc.BITSHUFFLE),
    numcodecs.Blosc("lz4", 5, numcodecs.Blosc.AUTOSHUFFLE),
]


def _dtype_of(name: str) -> Any:
    if name in _STRUCTURED:
        return np.dtype(_STRUCTURED[name])
    if name in ("str", "bytes", "msgpack", "vlen-array"):
        return np.dtype(object)
    return np.dtype(name)


def _object_codec(name: str) -> Any:
    return {
        "str": numcodecs.VLenUTF8(),
        "bytes": numcodecs.VLenBytes(),
        "msgpack": numcodecs.MsgPack(),
        "vlen-array": numcodecs.VLenArray("<i2"),
    }.get(name)


def _filters_for(name: str, dtype: np.dtype) -> list[list[Any]]:
    """Filter chains that fit the dtype (each a list; [] for none)."""
    out: list[list[Any]] = [[]]
    if dtype.kind in "iu" and dtype.itemsize > 1:
        out += [[numcodecs.Delta(dtype=dtype.str)], [numcodecs.Delta(dtype=dtype.str), numcodecs.CRC32()]]
        out += [[numcodecs.Shuffle(elementsize=dtype.itemsize)]]
    if dtype.kind == "f" and dtype.itemsize >= 4:
        out += [
            [numcodecs.Quantize(digits=3, dtype=dtype.str)],
            [numcodecs.FixedScaleOffset(0, 10, dtype=dtype.str, astype="<i4")],
        ]
        out += [[numcodecs.AsType(encode_dtype=dtype.newbyteorder("<").str.replace("8", "4"), decode_dtype=dtype.str)]]
    if dtype.kind == "b":
        out += [[numcodecs.PackBits()]]
    if name == "str":
        out += [[numcodecs.Categorize(["a", "bb", "ccc", ""], dtype=object)]]
    if dtype.kind not in "O":
        out += [[numcodecs.Adler32()], [numcodecs.Fletcher32()]]
    return out


def _fills_for(name: str, dtype: np.dtype) -> list[Any]:
    if dtype.kind == "f":
        return [None, 0.0, math.nan, math.inf, -math.inf, 1.5]
    if dtype.kind == "c":
        return [None, 0j, complex(1, -2)]
    if dtype.kind in "iu":
        return [None, 0, 7]
    if dtype.kind == "b":
        return [None, False, True]
    if dtype.kind in "Mm":
        return [None, 0, 5]
    if dtype.kind == "U":
        return [None, "", "z"]
    if dtype.kind == "S":
        return [None, b"", b"yy"]
    if dtype.kind == "V" and dtype.fields is None:
        return [None, b"\x01\x02\x03\x04"]
    if dtype.fields is not None:
        return [None, np.ones((), dtype=dtype)[()]]
    if name == "str":
        return [None, "", "a"]
    return [None]


def _values(name: str, dtype: np.dtype, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if name == "str":
        items: list[Any] = [["a", "bb", "ccc", ""][i] for i in rng.integers(0, 4, n)]
    elif name == "bytes":
        items = [bytes(rng.integers(0, 256, int(k), dtype=np.uint8)) for k in rng.integers(0, 5, n)]
    elif name == "msgpack":
        items = [[int(i), "x"] for i in rng.integers(0, 9, n)]
    elif name == "vlen-array":
        items = [np.arange(int(k), dtype="<i2") for k in rng.integers(0, 4, n)]
    else:
        raw = rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8)
        values = raw.view(dtype) if dtype.kind not in "bf c" else None
        if dtype.kind == "b":
            values = raw[:n] % 2 == 1
        elif dtype.kind in "fc":
            values = (rng.standard_normal(n) * 100).astype(dtype)
        elif dtype.kind in "Mm":
            values = rng.integers(-(10**9), 10**9, n).astype("<i8").view(dtype.newbyteorder("<")).astype(dtype)
        elif dtype.kind == "U":
            values = np.array(
                ["".join(chr(97 + int(c)) for c in rng.integers(0, 26, int(k))) for k in rng.integers(0, 3, n)],
                dtype=dtype,
            )
        return np.asarray(values).reshape(shape)
    out = np.empty(n, dtype=object)
    out[:] = items
    return out.reshape(shape)


@dataclass
class Case:
    name: str
    kwargs: dict[str, Any]
    shape: tuple[int, ...]
    region: tuple[slice, ...]
    seed: int


@st.composite
def cases(draw: st.DrawFn) -> Case:
    name = draw(st.sampled_from(_NUMERIC + _OTHER + list(_STRUCTURED)))
    dtype = _dtype_of(name)
    ndim = draw(st.integers(1, 3))
    chunks = tuple(draw(st.lists(st.integers(1, 3), min_size=ndim, max_size=ndim)))
    shape = tuple(c * draw(st.integers(1, 3)) - draw(st.integers(0, c - 1)) for c in chunks)
    stop = tuple(draw(st.integers(1, s)) for s in shape)  # the rest stays unwritten: fill value
    kwargs: dict[str, Any] = {
        "dtype": dtype,
        "chunks": chunks,
        "order": draw(st.sampled_from("CF")),
        "compressor": draw(st.sampled_from(_COMPRESSORS)),
        "fill_value": draw(st.sampled_from(_fills_for(name, dtype))),
        "filters": draw(st.sampled_from(_filters_for(name, dtype))) or None,
    }
    if _object_codec(name) is not None:
        kwargs["object_codec"] = _object_codec(name)
        if kwargs["filters"] and name == "str":  # Categorize replaces the object codec
            kwargs.pop("object_codec")
    return Case(name, kwargs, shape, tuple(slice(0, s) for s in stop), draw(st.integers(0, 2**16)))


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if a.dtype.kind == "O" or b.dtype.kind == "O":
        return [repr(x) for x in a.ravel().tolist()] == [repr(x) for x in b.ravel().tolist()]
    if a.dtype.fields is not None or b.dtype.fields is not None or a.dtype.kind == "V":
        return (
            a.dtype.itemsize == b.dtype.itemsize
            and a.astype(a.dtype.newbyteorder("=")).tobytes() == b.astype(b.dtype.newbyteorder("=")).tobytes()
        )
    if a.dtype.kind in "fc" or b.dtype.kind in "fc":
        return bool(np.array_equal(a, b, equal_nan=True))
    return bool(np.array_equal(a, b))


def _same_strings(read: np.ndarray, expected: np.ndarray) -> bool:
    """A reader's fixed-size U/S copy of a variable-length string or bytes array (see read_without_shardkv)."""
    return read.shape == expected.shape and read.ravel().tolist() == [x for x in expected.ravel().tolist()]


def _roundtrip(case: Case, root: Path, path: str) -> np.ndarray:
    """Write ``case`` through the proxy at ``path`` and into a MemoryStore; compare on reopen; zarr 2's values."""
    kwargs = dict(case.kwargs)
    proxied = zarr.create(case.shape, store=ShardedStore(str(root), chunks_per_shard=2), path=path, **kwargs)
    plain = zarr.create(case.shape, store=zarr.MemoryStore(), **kwargs)
    values = _values(case.name, kwargs["dtype"], case.shape, case.seed)[case.region]
    proxied[case.region] = values
    plain[case.region] = values
    reopened = zarr.open_array(ShardedStore(str(root), chunks_per_shard=2), path=path, mode="r")
    # fill_value None leaves unwritten chunks uninitialised in zarr 2 (np.empty): compare what was written
    compared = case.region if kwargs["fill_value"] is None else ...
    expected = plain[compared]
    assert reopened.dtype == plain.dtype and reopened.order == plain.order and reopened.shape == plain.shape
    assert reopened.filters == plain.filters and reopened.compressor == plain.compressor
    assert repr(reopened.fill_value) == repr(plain.fill_value)
    assert _same(reopened[compared], expected), (case, reopened[compared], expected)
    return expected


_EXAMPLES = int(os.environ.get("SHARDKV_DTYPES_EXAMPLES", "60"))  # more for a longer, random search


@pytest.mark.filterwarnings("ignore")
def test_every_zarr2_array_round_trips_and_reads_at_the_root(
    tmp_path: Path, reader: Reader, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "h.zarr"
    zarr.group(store=ShardedStore(str(root), chunks_per_shard=2))
    written: dict[str, tuple[Case, np.ndarray]] = {}
    tried = iter(range(10**6))  # a fresh path per try (hypothesis replays failing examples)

    @settings(
        max_examples=_EXAMPLES, deadline=None, derandomize=_EXAMPLES == 60, suppress_health_check=list(HealthCheck)
    )
    @given(case=cases())
    def one(case: Case) -> None:
        path = f"a{next(tried)}"
        written[path] = (case, _roundtrip(case, root, path))

    monkeypatch.setattr(numcodecs.pickles, "ALLOW_UNSAFE_PICKLE_DECODE", True, raising=False)
    one()
    documents = {p: json.loads((root / p / "zarr.json").read_text()) for p in written}
    results = {"zarr3": reader.run("zarr3", root, *written), "tensorstore": reader.run("tensorstore", root, *written)}
    read_by = {"zarr3": 0, "tensorstore": 0}
    for path, (case, expected) in written.items():
        for name, result in results.items():
            entry = result[path]
            if not entry["ok"]:
                assert entry["error"], (name, path)
                if name == "zarr3":  # zarr 3 refuses only what no v3 reader knows
                    assert is_opaque(documents[path]), (path, case, entry["error"])
                continue
            read_by[name] += 1
            data = entry["data"][case.region if case.kwargs["fill_value"] is None else ...]
            if name == "tensorstore" and data.dtype.itemsize == 0:
                # tensorstore-python hands raw_bytes out as items of size 0 (also for arrays zarr 3 wrote): no values
                assert data.dtype.itemsize == 0, (path, data.dtype)
                continue
            if expected.dtype.kind == "O":
                assert _same_strings(data, expected), (name, path, case, data, expected)
            else:
                assert _same(data, expected), (name, path, case.kwargs, data, expected)
    assert read_by["zarr3"] >= _EXAMPLES // 3  # the search reached readable arrays, not only opaque ones


_REGISTRY_PROBE = """
import json, sys, warnings
warnings.simplefilter("ignore")
import zarr.registry
from zarr.abc.codec import ArrayArrayCodec, ArrayBytesCodec, BytesBytesCodec
from zarr.core.dtype import get_data_type_from_json
out = {"codecs": {}, "data_types": {}}
for name in json.loads(sys.argv[1]):
    try:
        cls = zarr.registry.get_codec_class(name)
        kinds = (ArrayArrayCodec, ArrayBytesCodec, BytesBytesCodec)
        out["codecs"][name] = next(k.__name__ for k in kinds if issubclass(cls, k))
    except Exception as exc:
        out["codecs"][name] = "error: " + type(exc).__name__
for data_type in json.loads(sys.argv[2]):
    try:
        get_data_type_from_json(data_type, zarr_format=3)
        out["data_types"][json.dumps(data_type)] = "ok"
    except Exception as exc:
        out["data_types"][json.dumps(data_type)] = "error: " + type(exc).__name__
print(json.dumps(out))
"""


def test_names_are_in_the_newest_zarr3_registry(latest_python: str) -> None:
    import subprocess

    from shardkv.codecs.numcodecs_v3 import ARRAY_TO_ARRAY_IDS, BYTES_TO_BYTES_IDS, V2_CHUNK_CODEC, VLEN_IDS
    from shardkv.metadata.v2_codecs import OPAQUE_DATA_TYPE

    codecs = (
        [f"numcodecs.{i}" for i in sorted(ARRAY_TO_ARRAY_IDS | BYTES_TO_BYTES_IDS)]
        + sorted(VLEN_IDS)
        + [V2_CHUNK_CODEC]
    )
    data_types = [
        *VLEN_IDS.values(),
        {"name": "structured", "configuration": {"fields": [["a", "int32"]]}},
        {"name": OPAQUE_DATA_TYPE, "configuration": {"dtype": "|O"}},
    ]
    proc = subprocess.run(
        [latest_python, "-c", _REGISTRY_PROBE, json.dumps(codecs), json.dumps(data_types)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(proc.stdout)
    expected = {f"numcodecs.{i}": "ArrayArrayCodec" for i in ARRAY_TO_ARRAY_IDS}
    expected.update({f"numcodecs.{i}": "BytesBytesCodec" for i in BYTES_TO_BYTES_IDS})
    expected.update({i: "ArrayBytesCodec" for i in VLEN_IDS})
    assert {k: v for k, v in found["codecs"].items() if k != V2_CHUNK_CODEC} == expected
    assert found["codecs"][V2_CHUNK_CODEC].startswith("error")
    assert [v for v in found["data_types"].values()][:-1] == ["ok"] * (len(data_types) - 1)
    assert list(found["data_types"].values())[-1].startswith("error")
