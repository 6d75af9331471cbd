"""The benchmark command keeps working: ``benchmarks/run.py --size tiny`` end to end.

Runs in the zarr-python 2.18 environment; this interpreter serves as the
zarr2 environment of the run, ``.venv-zarr3`` is used when it exists. Asserts
only that the command succeeds and reports every row; never timings.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROW_IDS = ("P1", "P2", "P2-direct", "P3", "P3-cold", "P4", "P5", "P6", "P8")
DASK_ROW_IDS = ("P7-dask", "P7-dask-buffer", "P7-dask-rechunk", "P7-xarray", "P7-xarray-buffer")


def run_benchmarks(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / "latest.md"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--size", "tiny", "--repeat", "1"]
    cmd += ["--zarr2-python", sys.executable, "--out", str(out), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    return proc, out


def table_rows(text: str) -> dict[str, list[str]]:
    """Table rows of the Markdown output, by row id."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\| (P\d[\w-]*) \|(.*)\|$", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in m.group(2).split("|")]
    return rows


@pytest.mark.zarr2
def test_tiny_run_reports_every_row(tmp_path: Path) -> None:
    proc, out = run_benchmarks(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = table_rows(proc.stdout)
    assert set(ROW_IDS + DASK_ROW_IDS) <= set(rows), f"rows printed: {sorted(rows)}\n{proc.stdout}"
    for rid in DASK_ROW_IDS:  # every dask/xarray write succeeded and has its zarr 2 peer
        assert rows[rid][3] != "n/a", rows[rid]
    assert all(len(cells) == 6 for cells in rows.values())  # what, shardkv, peer, ratio, goal, met?
    assert table_rows(out.read_text()) == rows  # the file holds the same table


@pytest.mark.zarr2
def test_missing_zarr3_env_shows_na(tmp_path: Path) -> None:
    proc, _ = run_benchmarks(tmp_path, "--zarr3-python", str(tmp_path / "no-such-env" / "python"), "--skip-dask")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = table_rows(proc.stdout)
    assert set(ROW_IDS) <= set(rows)
    for rid in ("P1", "P4"):  # zarr 3 is the peer of these rows
        assert rows[rid][2] == "n/a (env missing)", rows[rid]
        assert rows[rid][3] == "n/a", rows[rid]
    assert rows["P3"][2] == "n/a (env missing)", rows["P3"]
    assert rows["P7-dask"][1] == "n/a (skipped: --skip-dask)" and rows["P7-dask"][3] == "n/a", rows["P7-dask"]
