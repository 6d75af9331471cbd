"""Readers without shardkv: run by .venv-latest's python (the newest zarr 3, tensorstore, xarray).

    python read_without_shardkv.py zarr3 ROOT OUT PATH...        zarr.open_group(ROOT)[PATH][...]
    python read_without_shardkv.py zarr3-consolidated ROOT      open_group(use_consolidated=True): members
    python read_without_shardkv.py tensorstore ROOT OUT PATH... the zarr3 driver on ROOT/PATH
    python read_without_shardkv.py xarray ROOT OUT              xr.open_zarr(ROOT): each variable
    python read_without_shardkv.py zarr3-members ROOT OUT GROUP... zarr.open_group(ROOT/GROUP) as zarr 3
                                                                  defaults: members(max_depth=None) with
                                                                  their attributes, arrays()
    python read_without_shardkv.py zarr3-path ROOT OUT PATH...  zarr.open_array(ROOT, path=PATH)[...]

Arrays go to OUT/<n>.npy; stdout is one JSON object: for each PATH (or variable)
``{"ok": true, "file": ..., "dtype": ...}`` or ``{"ok": false, "error": ...}``.
Exit status 3 when shardkv is importable here (the point is a reader without it).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def _save(out: Path, i: int, data: np.ndarray) -> dict:
    name = f"{i}.npy"
    data = np.asarray(data)
    dtype = data.dtype.str
    if data.dtype.kind in "OT":  # strings / bytes of variable length: saved as fixed-size U / S (no pickles)
        items = data.ravel().tolist()
        kind = "S" if items and all(isinstance(x, bytes) for x in items) else "U"
        data = np.array(items, dtype=kind).reshape(data.shape) if items else data.astype(kind)
    np.save(out / name, data, allow_pickle=False)
    return {"ok": True, "file": name, "dtype": dtype}


def _each(out: Path, paths: list[str], read: Callable[[str], Any]) -> dict:
    """``read(path)`` of each path, saved; a reader's refusal is the result for that path."""
    result = {}
    for i, path in enumerate(paths):
        try:
            result[path] = _save(out, i, read(path))
        except Exception as exc:  # noqa: BLE001 - the reader's refusal is the result
            result[path] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
    return result


def _zarr3(root: str, out: Path, paths: list[str]) -> dict:
    import zarr

    group = zarr.open_group(root, mode="r")
    return _each(out, paths, lambda path: group[path][...])


def _zarr3_consolidated(root: str) -> dict:
    import zarr

    group = zarr.open_group(root, mode="r", use_consolidated=True)
    consolidated = group.metadata.consolidated_metadata
    members = {}
    for path, node in group.members(max_depth=None):
        members[path] = {
            "node_type": "array" if isinstance(node, zarr.Array) else "group",
            "attributes": dict(node.attrs),
            "shape": list(node.shape) if isinstance(node, zarr.Array) else None,
        }
    return {
        "consolidated": consolidated is not None,
        "consolidated_paths": sorted(consolidated.flattened_metadata) if consolidated is not None else [],
        "members": members,
        "attributes": dict(group.attrs),
    }


def _zarr3_members(root: str, groups: list[str]) -> dict:
    import zarr

    result = {}
    for path in groups:
        try:
            group = zarr.open_group(str(Path(root) / path), mode="r")  # use_consolidated=None: zarr 3's default
            members = {
                name: {
                    "node_type": "array" if isinstance(node, zarr.Array) else "group",
                    "shape": list(node.shape) if isinstance(node, zarr.Array) else None,
                    "attributes": dict(node.attrs),
                }
                for name, node in group.members(max_depth=None)
            }
            result[path] = {
                "ok": True,
                "members": members,
                "arrays": sorted(name for name, _ in group.arrays()),
                "consolidated": group.metadata.consolidated_metadata is not None,
                "attributes": dict(group.attrs),
            }
        except Exception as exc:  # noqa: BLE001 - the reader's refusal is the result
            result[path] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
    return result


def _zarr3_path(root: str, out: Path, paths: list[str]) -> dict:
    import zarr

    return _each(out, paths, lambda path: zarr.open_array(root, path=path, mode="r")[...])


def _tensorstore(root: str, out: Path, paths: list[str]) -> dict:
    import tensorstore as ts

    def read(path: str) -> Any:
        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(Path(root) / path) + "/"}}
        return ts.open(spec, read=True).result().read().result()

    return _each(out, paths, read)


def _xarray(root: str, out: Path) -> dict:
    import xarray as xr

    ds = xr.open_zarr(root)
    result = {}
    for i, (name, var) in enumerate(ds.variables.items()):
        entry = _save(out, i, var.values)
        entry.update(
            dims=list(var.dims), attrs={k: v for k, v in var.attrs.items() if isinstance(v, (str, int, float, list))}
        )
        result[str(name)] = entry
    result["__attrs__"] = {k: v for k, v in ds.attrs.items() if isinstance(v, (str, int, float, list))}
    return result


def main(argv: list[str]) -> int:
    if importlib.util.find_spec("shardkv") is not None:
        print("shardkv is importable in the reader environment", file=sys.stderr)
        return 3
    warnings.simplefilter("ignore")
    command, root = argv[0], argv[1]
    if command == "zarr3-consolidated":
        result = _zarr3_consolidated(root)
    else:
        out = Path(argv[2])
        out.mkdir(parents=True, exist_ok=True)
        if command == "zarr3":
            result = _zarr3(root, out, argv[3:])
        elif command == "tensorstore":
            result = _tensorstore(root, out, argv[3:])
        elif command == "xarray":
            result = _xarray(root, out)
        elif command == "zarr3-members":
            result = _zarr3_members(root, argv[3:])
        elif command == "zarr3-path":
            result = _zarr3_path(root, out, argv[3:])
        else:
            print(f"unknown command {command!r}", file=sys.stderr)
            return 2
    json.dump(result, sys.stdout, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
