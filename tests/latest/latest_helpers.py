"""Helpers of tests/latest. The readers without shardkv: .venv-latest's python, driven in subprocesses.

Its python is $SHARDKV_LATEST_PYTHON or the repository's .venv-latest (built by
tests/run.sh; required under CI).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
READER = Path(__file__).resolve().parent / "read_without_shardkv.py"
_METADATA_NAMES = (".zarray", ".zattrs", ".zgroup", "zarr.json", ".zmetadata")


def find_latest_python() -> str:
    candidates = [os.environ.get("SHARDKV_LATEST_PYTHON"), str(ROOT / ".venv-latest" / "bin" / "python")]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    if os.environ.get("CI"):
        pytest.fail(f"no .venv-latest python found (tried {candidates}); required under CI")
    pytest.skip("no .venv-latest python (set SHARDKV_LATEST_PYTHON or build it with tests/run.sh)")


class Reader:
    """One reader command of read_without_shardkv.py, run by the newest releases."""

    def __init__(self, python: str, out: Path) -> None:
        self.python = python
        self.out = out
        self.runs = 0

    def run(self, command: str, root: Path, *paths: str) -> dict[str, Any]:
        """The reader's JSON result; arrays it read are loaded as ``result[path]["data"]``."""
        self.runs += 1
        out = self.out / f"run{self.runs}"
        args = [self.python, str(READER), command, str(root)]
        if command != "zarr3-consolidated":
            args += [str(out), *paths]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            pytest.fail(f"{command} reader failed ({self.python}):\n{proc.stderr[-4000:]}")
        result = json.loads(proc.stdout)
        for entry in result.values():
            if isinstance(entry, dict) and entry.get("ok") and "file" in entry:
                entry["data"] = np.load(out / entry["file"], allow_pickle=False)
        return result


def stored_documents(root: Path) -> dict[str, Any]:
    """Every metadata document under ``root`` by store key, parsed."""
    return {
        p.relative_to(root).as_posix(): json.loads(p.read_text())
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name in _METADATA_NAMES
    }
