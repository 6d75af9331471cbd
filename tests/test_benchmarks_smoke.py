"""The benchmark command keeps working: ``benchmarks/run.py --size smoke``, every workload end to end.

Size smoke (a few chunks, two shards) checks that each workload runs and reports every field the runner
reads; never timings. This interpreter serves as the zarr2 environment of the run; the runner runs its
workloads inside its own process (``run.OWN_PROCESS`` in subprocesses), and uses ``.venv-zarr3`` and
``.venv-bench`` when they exist. Only the columns of a missing environment, and the cases a workload itself
declares impossible (a dict is not on S3), may show n/a: a workload that fails or reports ``unavailable``
fails the test.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = sorted(
    p.stem
    for p in (ROOT / "benchmarks" / "workloads").glob("*.py")
    if not p.stem.startswith("_") and p.stem != "s3_server"
)  # the S3 server is not a workload
ENV_EXISTS = {
    "zarr3": (ROOT / ".venv-zarr3" / "bin" / "python").exists(),
    "bench": (ROOT / ".venv-bench" / "bin" / "python").exists(),
}
ROW_IDS = (
    "P1",
    "P2",
    "P2-direct",
    "P3",
    "P3-cold",
    "P4",
    "P5",
    "P6",
    "P8",
    "P21-convert",
    "P21-convert-rss",
    "P9-v3-convert",
    "P9-v3-convert-wall",
    "P9-v3-convert-paired",
    "P9-v3-convert-zarr3",
    "P9-v3-convert-rss",
    "P21-list",
    "P21-len",
    "P21-keys",
    "P21-nchunks",
    *(f"P21-s3-warm-{n}-{impl}" for n in ("1024", "32768") for impl in ("shardkv", "shardkv-obstore")),
    "P21-s3-cold-shardkv",
    "P21-s3-cold-shardkv-obstore",
    "P7-dask",
    "P7-dask-buffer",
    "P7-dask-rechunk",
    "P7-xarray",
    "P7-xarray-buffer",
    *(f"G1{d}-{op}-none" for d in ("", "-dict") for op in ("write", "read")),
    *(f"G3-{what}-{impl}" for impl in ("shardkv", "shardkv-obstore") for what in ("requests", "warm", "warm-time")),
    "W29-1",
    "W29-1-time",
    "W29-2",
    "W29-3",
)
W29_PEERS = ("zarr3", "zarr3-zarrs", "tensorstore")  # the W29 workloads' peers, run in .venv-bench
# n/a that a workload itself reports for a case it cannot run (raw-sample keys: workload/impl, peers/case/impl)
IMPOSSIBLE = {
    "peers/local/256/none/shardkv-obstore": "n/a (S3 only)",
    "peers/s3/256/none/zarr2-dict": "n/a (a dict is not on S3)",
}


def run_benchmarks(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / "latest.md"
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "run.py"),
        "--size",
        "smoke",
        "--zarr2-python",
        sys.executable,
        "--out",
        str(out),
        *extra,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    return proc, out


def table_rows(text: str) -> dict[str, list[str]]:
    """Rows of the main Markdown table, by row id: what, shardkv, peer, ratio, goal, met?."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\| ([PGW]\d[\w-]*) \|(.*)\|$", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in m.group(2).split("|")]
    return rows


def raw_samples(text: str) -> dict[str, str]:
    """The "Raw samples" lines, by result key (``workload/impl``, ``peers/backend/layout/codec/impl``)."""
    lines = text.split("Raw samples (every repetition):", 1)[1].splitlines()
    return dict(m.groups() for m in (re.match(r"- (\S+): (.*)$", ln) for ln in lines) if m)


def env_of(key: str) -> str:
    """The environment a result key runs in (the runner's ENVS, peers_matrix.ENV_OF and w29.IMPLS)."""
    impl = key.rsplit("/", 1)[1]
    if key.startswith("w29_"):
        return "bench" if impl in W29_PEERS else "zarr3"
    if key.startswith("convert_v3/"):
        return "zarr3"
    if key.startswith("peers/"):
        return "bench" if impl in ("zarr3", "zarr3-zarrs", "tensorstore") else "zarr2"
    return "zarr3" if impl in ("zarr3", "tensorstore") else "zarr2"


def peer_env(rid: str) -> str | None:
    """The environment of a row's peer, when not this one: zarr 3 (and its tensorstore) or .venv-bench."""
    if rid in ("P1", "P3", "P3-cold", "P4") or rid.startswith(("P21-convert", "P21-s3-", "P9-v3-convert")):
        return "zarr3"
    if rid.startswith("G3-warm") or rid == "W29-3":
        return "bench"
    if rid in ("W29-1-time", "W29-2"):
        return "zarr3"
    return None


def shardkv_env(rid: str) -> str:
    """The environment of a row's shardkv side: the W29 and P9 rows measure shardkv in .venv-zarr3."""
    return "zarr3" if rid.startswith(("W29", "P9-v3-convert")) else "zarr2"


@pytest.mark.zarr2
def test_smoke_run_measures_every_workload(tmp_path: Path) -> None:
    proc, out = run_benchmarks(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]  # 1 when any workload failed
    samples = raw_samples(proc.stdout)
    for workload in WORKLOADS:  # every workload of benchmarks/workloads/ is part of the run
        assert any(key.split("/", 1)[0] == workload for key in samples), (workload, sorted(samples))
    for key, text in samples.items():  # every result measured, unless its environment is missing here
        if text.startswith("n/a"):
            allowed = IMPOSSIBLE.get(key) or ("n/a (env missing)" if not ENV_EXISTS.get(env_of(key), True) else None)
            assert text == allowed, f"{key}: {text}\n{proc.stderr[-3000:]}"
        else:
            assert re.search(r"\w+=\[[-\d.e+]+", text), f"{key}: no samples: {text}"
    rows = table_rows(proc.stdout)
    assert set(ROW_IDS) <= set(rows), f"rows printed: {sorted(rows)}\n{proc.stdout}"
    for rid, (_, shardkv, peer, ratio, _, _) in rows.items():
        if not ENV_EXISTS.get(shardkv_env(rid), True):  # W29 rows without .venv-zarr3
            assert shardkv == "n/a (env missing)", (rid, shardkv)
            continue
        assert shardkv and not shardkv.startswith("n/a"), (rid, shardkv)  # shardkv's side of every row measured
        if peer.startswith("n/a") or ratio == "n/a":  # only a peer from a missing environment may be absent
            env = peer_env(rid)
            assert env is not None and not ENV_EXISTS[env], (rid, peer, ratio)
            assert peer in ("n/a (env missing)", "n/a (no interpreter with tensorstore)", "n/a"), (rid, peer)
    assert all(len(cells) == 6 for cells in rows.values())  # what, shardkv, peer, ratio, goal, met?
    assert table_rows(out.read_text()) == rows  # the file holds the same table


@pytest.mark.zarr2
def test_missing_zarr3_env_shows_na(tmp_path: Path) -> None:
    proc, _ = run_benchmarks(
        tmp_path,
        "--zarr3-python",
        str(tmp_path / "no-such-env" / "python"),
        "--skip-dask",
        "--only",
        "write_read,random_reads",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = table_rows(proc.stdout)
    assert {"P1", "P3", "P4", "P7-dask"} <= set(rows)
    for rid in ("P1", "P4"):  # zarr 3 is the peer of these rows
        assert rows[rid][2] == "n/a (env missing)", rows[rid]
        assert rows[rid][3] == "n/a", rows[rid]
    assert rows["P3"][2] == "n/a (env missing)", rows["P3"]
    assert rows["P7-dask"][1] == "n/a (skipped: --skip-dask)" and rows["P7-dask"][3] == "n/a", rows["P7-dask"]


@pytest.mark.zarr2
def test_unknown_shardkv_option_shows_na(tmp_path: Path) -> None:
    """A shardkv option the installed shardkv lacks: its figures say so, the peers still run, the run succeeds."""
    proc, _ = run_benchmarks(
        tmp_path,
        "--only",
        "w29_write",
        "--skip-dask",
        "--shardkv-option",
        "no_such_option=0.5",
        "--shardkv-option",
        "concurrency=files",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--shardkv-option no_such_option=0.5 --shardkv-option concurrency=files" in proc.stdout
    samples = raw_samples(proc.stdout)
    shardkv_na = "n/a (option unknown)" if ENV_EXISTS["zarr3"] else "n/a (env missing)"
    for impl in ("shardkv", "shardkv-buffer"):
        assert samples[f"w29_write/{impl}"] == shardkv_na, samples
    for impl in W29_PEERS:  # options are shardkv's: the peers are measured all the same
        text = samples[f"w29_write/{impl}"]
        if ENV_EXISTS["bench"]:
            assert re.search(r"write_s=\[[\d.e+-]+", text), (impl, text)
        else:
            assert text == "n/a (env missing)", (impl, text)
    rows = table_rows(proc.stdout)
    assert rows["W29-1"][1] == shardkv_na and rows["W29-1"][3] == "n/a", rows["W29-1"]
