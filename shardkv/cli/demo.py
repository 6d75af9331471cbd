"""``shardkv demo``: the main job end to end, on a small local hierarchy, in about a second.

1. Make a small Zarr v2 hierarchy in ``DIR`` (by default in a temporary
   directory, removed at the end; ``--out OUT`` keeps it in ``OUT/input``):
   with zarr-python 2 when it is installed, otherwise by writing ``.zarray``
   documents and chunks with numpy and numcodecs (zarr-python is optional).
   Three arrays: a 2-d ``float32`` array with zlib chunks, a 3-d ``int16``
   array with ``/``-separated chunk keys, a 1-d uncompressed ``uint32`` array;
   edge chunks overhang the array as in any zarr store.
2. Convert it into ``DIR/../sharded`` with 4 chunks per shard along every dimension.
3. Print the conversion summary and the ``shardkv info`` table.
4. Read the arrays back and compare with the input: with zarr-python 2
   through :class:`shardkv.ShardedStore` (decoded values) when zarr 2 is
   installed; with zarr-python 3 at the root of the sharded copy, without
   shardkv (its arrays are standard v3 ``sharding_indexed`` arrays), when
   zarr 3 is installed (the input is then written with numpy); else chunk by
   chunk (the stored bytes of every chunk, through the proxy).

The demo only deletes directories it made itself (their root ``.zattrs``
carries a marker); anything else in the way is an error.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from shardkv.cli.errors import DemoError

__all__ = [
    "DemoError",
    "make_demo_input",
    "run_demo",
    "run_demo_in",
    "zarr2_available",
    "zarr3_available",
    "DEMO_MARKER",
]

DEMO_MARKER = "shardkv_demo"
"""Key of the root ``.zattrs`` entry that marks a directory made by the demo."""

CHUNKS_PER_SHARD = 4


def zarr2_available() -> bool:
    """True when zarr-python 2 can be imported."""
    if importlib.util.find_spec("zarr") is None:
        return False
    return str(getattr(importlib.import_module("zarr"), "__version__", "")).startswith("2.")


def zarr3_available() -> bool:
    """True when zarr-python 3 (or later) can be imported."""
    if importlib.util.find_spec("zarr") is None:
        return False
    major = str(getattr(importlib.import_module("zarr"), "__version__", "")).split(".", 1)[0]
    return major.isdigit() and int(major) >= 3


def _demo_arrays() -> dict[str, dict[str, Any]]:
    rng = np.random.default_rng(42)
    y, x = np.mgrid[0:90, 0:130]
    return {
        "temperature": {
            "data": (15 + 10 * np.sin(x / 20.0) * np.cos(y / 15.0)).astype("<f4"),
            "chunks": (15, 20),
            "compressor": {"id": "zlib", "level": 1},
            "separator": ".",
            "fill_value": float("nan"),
        },
        "labels": {
            "data": rng.integers(0, 7, size=(6, 40, 60)).astype("<i2"),
            "chunks": (2, 16, 16),
            "compressor": None,
            "separator": "/",
            "fill_value": 0,
        },
        "counts": {
            "data": np.arange(1000, dtype="<u4") ** 2 % 977,
            "chunks": (100,),
            "compressor": None,
            "separator": ".",
            "fill_value": 0,
        },
    }


def _is_demo_dir(path: Path) -> bool:
    for doc, attrs in ((".zattrs", lambda d: d), ("zarr.json", lambda d: d.get("attributes") or {})):
        try:
            if attrs(json.loads((path / doc).read_text())).get(DEMO_MARKER):
                return True
        except (FileNotFoundError, ValueError, AttributeError):
            continue
    return False


def _clear(path: Path) -> None:
    """Remove ``path`` if the demo made it; refuse anything else that is in the way."""
    if not path.exists():
        return
    if path.is_dir() and not any(path.iterdir()):
        return
    if not _is_demo_dir(path):
        raise DemoError(f"{path} exists and was not made by 'shardkv demo'; choose another directory")
    shutil.rmtree(path)


def _write_with_zarr(directory: Path, arrays: dict[str, dict[str, Any]]) -> None:
    zarr = importlib.import_module("zarr")
    numcodecs = importlib.import_module("numcodecs")
    group = zarr.open_group(zarr.DirectoryStore(str(directory)), mode="w")
    group.attrs[DEMO_MARKER] = True
    for name, spec in arrays.items():
        compressor = numcodecs.get_codec(dict(spec["compressor"])) if spec["compressor"] else None
        z = group.create_dataset(
            name,
            shape=spec["data"].shape,
            chunks=spec["chunks"],
            dtype=spec["data"].dtype,
            compressor=compressor,
            fill_value=spec["fill_value"],
            dimension_separator=spec["separator"],
        )
        z[...] = spec["data"]
        z.attrs["description"] = f"shardkv demo array {name!r}"


def _write_with_numpy(directory: Path, arrays: dict[str, dict[str, Any]]) -> None:
    """Write a Zarr v2 hierarchy by hand: ``.zgroup``, ``.zattrs``, ``.zarray`` and encoded chunks."""
    import itertools

    import numcodecs

    directory.mkdir(parents=True, exist_ok=True)
    (directory / ".zgroup").write_text(json.dumps({"zarr_format": 2}, indent=4))
    (directory / ".zattrs").write_text(json.dumps({DEMO_MARKER: True}, indent=4))
    for name, spec in arrays.items():
        data, chunks = spec["data"], spec["chunks"]
        fill = spec["fill_value"]
        zarray = {
            "zarr_format": 2,
            "shape": list(data.shape),
            "chunks": list(chunks),
            "dtype": data.dtype.str,
            "compressor": spec["compressor"],
            "fill_value": "NaN" if isinstance(fill, float) and np.isnan(fill) else fill,
            "order": "C",
            "filters": None,
            "dimension_separator": spec["separator"],
        }
        adir = directory / name
        adir.mkdir(parents=True, exist_ok=True)
        (adir / ".zarray").write_text(json.dumps(zarray, indent=4, sort_keys=True))
        (adir / ".zattrs").write_text(json.dumps({"description": f"shardkv demo array {name!r}"}, indent=4))
        codec = numcodecs.get_codec(dict(spec["compressor"])) if spec["compressor"] else None
        grid = [-(-s // c) for s, c in zip(data.shape, chunks, strict=True)]
        for coords in itertools.product(*(range(g) for g in grid)):
            region = tuple(
                slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(coords, chunks, data.shape, strict=True)
            )
            block = np.full(chunks, fill, dtype=data.dtype)  # edge chunks are padded to the full chunk shape
            block[tuple(slice(0, r.stop - r.start) for r in region)] = data[region]
            raw = block.tobytes()
            path = adir / spec["separator"].join(str(i) for i in coords)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(codec.encode(raw) if codec else raw)


def make_demo_input(directory: str | Path, use_zarr: bool | None = None) -> dict[str, np.ndarray]:
    """Create the demo's Zarr v2 hierarchy in ``directory``; returns the arrays it holds.

    Parameters
    ----------
    directory : str or Path
        Where to write; must not exist, be empty, or be an earlier demo input.
    use_zarr : bool, optional
        Write with zarr-python 2 (default: when it is installed) or with numpy.

    Raises
    ------
    DemoError
        If ``directory`` holds something the demo did not make.
    """
    directory = Path(directory)
    _clear(directory)
    arrays = _demo_arrays()
    if use_zarr is None:
        use_zarr = zarr2_available()
    if use_zarr:
        _write_with_zarr(directory, arrays)
    else:
        _write_with_numpy(directory, arrays)
    return {name: spec["data"] for name, spec in arrays.items()}


def _read_back(input_dir: Path, output_dir: Path, expected: dict[str, np.ndarray], use_zarr: bool) -> list[str]:
    """Compare the sharded copy with the input; returns one line per array."""
    from shardkv.engine.options import Options
    from shardkv.proxy.store import ShardedStore

    store = ShardedStore._reopen(str(output_dir), Options.from_keywords())  # read as a mapping: any zarr installed
    lines = []
    if use_zarr:
        zarr = importlib.import_module("zarr")
        for name, data in expected.items():
            values = zarr.open_array(store, path=name, mode="r")[...]
            same = values.dtype == data.dtype and np.array_equal(values, data, equal_nan=data.dtype.kind == "f")
            lines.append(
                f"  {name}: {values.shape} {values.dtype} read with zarr-python 2 through ShardedStore: "
                f"{'equal to the input' if same else 'DIFFERENT from the input'}"
            )
        return lines
    for name in expected:
        adir = input_dir / name
        files = sorted(p for p in adir.rglob("*") if p.is_file() and not p.name.startswith("."))
        keys = {f"{name}/{p.relative_to(adir).as_posix()}": p for p in files}
        found = store.getitems(list(keys))
        same = all(k in found and found[k] == p.read_bytes() for k, p in keys.items())
        lines.append(
            f"  {name}: {len(keys)} chunks read through ShardedStore (zarr-python not installed, "
            f"comparing stored chunk bytes): {'equal to the input' if same else 'DIFFERENT from the input'}"
        )
    return lines


def _read_back_zarr3(output_dir: Path, expected: dict[str, np.ndarray]) -> list[str]:
    """Read the sharded copy with zarr-python 3 at its root, without shardkv; one line per array."""
    import warnings

    zarr = importlib.import_module("zarr")
    lines = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr 3 notes that numcodecs codecs are outside the v3 spec
        group = zarr.open_group(str(output_dir), mode="r")
        for name, data in expected.items():
            array = group[name]
            values = array[...]
            same = values.dtype == data.dtype and np.array_equal(values, data, equal_nan=data.dtype.kind == "f")
            lines.append(
                f"  {name}: {values.shape} {values.dtype}, shards of {array.shards} read with zarr-python "
                f"{zarr.__version__} at the root, without shardkv: "
                f"{'equal to the input' if same else 'DIFFERENT from the input'}"
            )
    return lines


def run_demo(directory: str | Path = "shardkv-demo/input", use_zarr: bool | None = None) -> int:
    """Run the demo, printing as it goes; returns 0 when the read-back equals the input, else 1.

    Raises
    ------
    DemoError
        If the input or output directory holds something the demo did not make.
    """
    from shardkv.cli.convert import convert
    from shardkv.cli.info import format_info, inspect_store

    input_dir = Path(directory).absolute()
    output_dir = input_dir.parent / "sharded"
    if use_zarr is None:
        use_zarr = zarr2_available()
    _clear(output_dir)
    zarr3 = not use_zarr and zarr3_available()
    how = (
        "zarr-python 2"
        if use_zarr
        else "numpy + numcodecs (zarr-python 3 installed: it reads the sharded copy)"
        if zarr3
        else "numpy + numcodecs (zarr-python not installed)"
    )
    expected = make_demo_input(input_dir, use_zarr)
    print(f"made a Zarr v2 hierarchy with {how}: {input_dir}")
    report = convert(str(input_dir), str(output_dir), CHUNKS_PER_SHARD)
    print(f"\n$ shardkv convert {input_dir} {output_dir} --chunks-per-shard {CHUNKS_PER_SHARD}")
    print(report.summary())
    print(f"\n$ shardkv info {output_dir}")
    print(format_info(inspect_store(str(output_dir))))
    print("\nread back:")
    lines = _read_back_zarr3(output_dir, expected) if zarr3 else _read_back(input_dir, output_dir, expected, use_zarr)
    print("\n".join(lines))
    return 1 if any("DIFFERENT" in line for line in lines) else 0


def run_demo_in(directory: str | Path | None = None, out: str | Path | None = None) -> int:
    """Run the demo where the command line says: ``DIR``, ``--out OUT``, or a temporary directory.

    Parameters
    ----------
    directory : str or Path, optional
        Input hierarchy here, sharded copy in ``directory/../sharded`` (files kept).
    out : str or Path, optional
        Input in ``out/input``, sharded copy in ``out/sharded`` (files kept).

    With neither, the demo runs in a new temporary directory that is removed at
    the end, so it leaves nothing behind in the current directory.

    Raises
    ------
    DemoError
        If both are given, or a directory in the way was not made by the demo.
    """
    if directory is not None and out is not None:
        raise DemoError(f"give DIR ({directory}) or --out ({out}), not both")
    if directory is not None:
        return run_demo(directory)
    if out is not None:
        return run_demo(Path(out) / "input")
    with tempfile.TemporaryDirectory(prefix="shardkv-demo-") as tmp:
        status = run_demo(Path(tmp) / "input")
        print(f"\n(the demo ran in {tmp}, now removed; pass --out DIR to keep its files)")
        return status
