"""Run every shardkv benchmark and print one table of side-by-side ratios.

    python benchmarks/run.py [--size tiny|small|full] [--repeat N] [--make-envs]

Each workload (``benchmarks/workloads/<name>.py``) runs as a subprocess in the
environment it needs: ``.venv-zarr2`` (zarr-python 2.18 + shardkv) or
``.venv-zarr3`` (zarr-python 3), the two environments ``bash tests/run.sh``
builds, or ``.venv-bench`` (Python 3.12: newest zarr 3, zarrs, tensorstore,
obstore, s3fs, moto) for the peer matrix (:mod:`peers_matrix`) and the peers
of the write-cost rows W29 (:mod:`w29`, which take ``--shardkv-option`` and ``--dir``);
``--make-envs`` builds missing ones the same way. A workload prints
one JSON line with every repetition; this runner takes the medians, prints a
Markdown table with the machine's facts and writes the same text to
``benchmarks/results/latest.md``. A missing environment or a proxy feature
that is not there yet shows as ``n/a``; a workload that fails makes the exit
status 1. Uses the standard library only. ``--size smoke`` is the test suite's
check that every workload runs (``OWN_PROCESS``); it measures nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import platform
import runpy
import shutil
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import peers_matrix
import w29

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ROOT / "benchmarks" / "workloads"
ENVS = {
    "zarr2": (".venv-zarr2", "test-zarr2"),
    "zarr3": (".venv-zarr3", "test-zarr3"),
    "bench": (".venv-bench", "bench-peers"),
}
# the interpreter .venv-bench is made with (pyenv's 3.12), else python3.12 on PATH
BENCH_PYTHON = (str(Path.home() / ".pyenv" / "versions" / "3.12.1" / "bin" / "python"), "python3.12")
# 3 at full size (not 5): the whole run, peer matrix included, fits in about 10 minutes
DEFAULT_REPEAT = {"smoke": 1, "tiny": 1, "small": 2, "full": 3}
# Size smoke is the test suite's check that every workload runs and reports the fields this runner reads
# (tests/test_benchmarks_smoke.py; its figures mean nothing). A workload of the runner's own environment then
# runs inside this process (zarr, dask and moto imported once for all of them), except these, which need a
# process of their own: peak RSS is per process, and zarr 2.18 reads ZARR_V3_EXPERIMENTAL_API and
# ZARR_V3_SHARDING only when it is first imported.
OWN_PROCESS = {("peak_memory", "shardkv"), ("chunkwise_write", "zarr2-transformer")}
MiB = 1 << 20


class Missing:
    """A measurement that could not be made, with the reason shown in the table."""

    def __init__(self, reason: str, failed: bool = False) -> None:
        self.reason = reason
        self.failed = failed

    def __str__(self) -> str:
        return f"n/a ({self.reason})"


# -- environments -----------------------------------------------------------------


def make_env(name: str, python: str = "python3") -> None:
    """Create ``.venv-<name>`` the way ``tests/run.sh`` does (venv, pip upgrade, editable install).

    ``.venv-bench`` and ``.venv-zarr3`` (newest zarr 3 needs it) are made with Python 3.12
    (``BENCH_PYTHON``), whatever ``python`` says.
    """
    directory, extra = ENVS[name]
    env_python = ROOT / directory / "bin" / "python"
    if name in ("bench", "zarr3"):
        python = next((p for p in BENCH_PYTHON if Path(p).exists() or shutil.which(p)), python)
    if not env_python.exists():
        subprocess.run([python, "-m", "venv", str(ROOT / directory)], check=True)
    pip = [str(env_python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([*pip, "-e", f".[{extra}]"], check=True, cwd=ROOT)


def find_python(name: str, override: str | None) -> str | None:
    """The interpreter of an environment: ``override``, else ``<repo>/.venv-<name>/bin/python``.

    ``None`` when that file does not exist (the environment's columns then show n/a).
    """
    if override:
        return override if Path(override).exists() else None
    candidate = ROOT / ENVS[name][0] / "bin" / "python"
    return str(candidate) if candidate.exists() else None


# -- workloads ----------------------------------------------------------------------


def run_workload(
    python: str | None, workload: str, impl: str, args: argparse.Namespace, repeat: int, extra: list[str] | None = None
) -> Any:
    """Run one workload subprocess (``extra``: more arguments); its JSON result, or ``Missing``.

    At size smoke a workload of this interpreter's environment runs in this process instead (see ``OWN_PROCESS``).
    """
    if python is None:
        return Missing("env missing")
    only = getattr(args, "only", None)
    if only is not None and workload not in only:
        return Missing("skipped: --only")
    argv = ["--json", "--size", args.size, "--repeat", str(repeat), "--impl", impl, "--seed", str(args.seed)]
    argv += extra or []
    here = (
        args.size == "smoke"
        and (workload, impl) not in OWN_PROCESS
        and os.path.abspath(python) == os.path.abspath(sys.executable)
    )
    t0 = time.perf_counter()
    shown = [a for a in (extra or []) if not a.startswith(("http:", "/"))]  # not the server's address and log
    log(f"  {workload} --impl {impl} {' '.join(shown)}{' (in this process)' if here else ''} ...")
    if here:
        returncode, stdout, stderr = run_here(workload, argv)
    else:
        try:
            proc = subprocess.run(
                [python, str(WORKLOADS / f"{workload}.py"), *argv],
                capture_output=True,
                text=True,
                cwd=ROOT,
                timeout=args.timeout,
            )
        except subprocess.TimeoutExpired:
            log(f"    timed out after {args.timeout} s")
            return Missing(f"timed out after {args.timeout} s", failed=True)
        returncode, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    if returncode != 0 or not lines:
        tail = (stderr.strip().splitlines() or ["no output"])[-1]
        log(f"    FAILED (exit {returncode}): {tail}")
        for line in stderr.strip().splitlines()[-15:]:
            log(f"    | {line}")
        return Missing(f"failed: {tail[:80]}", failed=True)
    result = json.loads(lines[-1])
    log(f"    done in {time.perf_counter() - t0:.1f} s")
    if "unavailable" in result:
        return Missing(result["unavailable"])
    return result


def run_here(workload: str, argv: list[str]) -> tuple[int, str, str]:
    """Run a workload script as ``__main__`` in this process (size smoke): its exit status, stdout and stderr."""
    script = str(WORKLOADS / f"{workload}.py")
    out, err = io.StringIO(), io.StringIO()
    saved = sys.argv, sys.path[:]
    sys.argv = [script, *argv]
    sys.path.insert(0, str(WORKLOADS))  # what a subprocess has: the script's directory first
    status = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if isinstance(exc.code, str):
            err.write(exc.code + "\n")
        status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except Exception:
        err.write(traceback.format_exc())
        status = 1
    finally:
        sys.argv, sys.path[:] = saved
    return status, out.getvalue(), err.getvalue()


def collect(args: argparse.Namespace, pythons: dict[str, str | None]) -> dict[str, Any]:
    """Every workload result, keyed ``workload/impl``."""
    rep = args.repeat
    py2, py3 = pythons["zarr2"], pythons["zarr3"]
    res: dict[str, Any] = {}
    if getattr(args, "peers_only", False):
        names = [
            "write_read/shardkv",
            "write_read/zarr3",
            "chunkwise_write/shardkv-writeback",
            "chunkwise_write/shardkv",
            "chunkwise_write/zarr2-transformer",
            "random_reads/shardkv",
            "random_reads/zarr3",
            "proxy_overhead/shardkv",
            "warm_reads_local/shardkv",
            "peak_memory/shardkv",
            "convert_scale/shardkv",
            "convert_scale/tensorstore",
            *(f"convert_v3/{impl}" for impl in CONVERT_V3_IMPLS),
            "list_scale/shardkv",
            "s3_reads/all",
            *w29.keys(),
            *(f"dask_writes/{i}" for i in DASK_IMPLS),
        ]
        return {name: Missing("skipped: --peers-only") for name in names}
    res["write_read/shardkv"] = run_workload(py2, "write_read", "shardkv", args, rep)
    res["write_read/zarr3"] = run_workload(py3, "write_read", "zarr3", args, rep)
    for impl in ("shardkv-writeback", "shardkv", "zarr2-transformer"):
        res[f"chunkwise_write/{impl}"] = run_workload(py2, "chunkwise_write", impl, args, rep)
    # the write-cost rows W29: each implementation in its own process and environment (shardkv: zarr3, peers: bench)
    res.update(
        w29.collect(
            pythons,
            lambda py, workload, impl, extra: run_workload(py, workload, impl, args, rep, extra),
            args.shardkv_option,
            args.dir,
        )
    )
    res["random_reads/shardkv"] = run_workload(py2, "random_reads", "shardkv", args, rep)
    res["random_reads/zarr3"] = run_workload(py3, "random_reads", "zarr3", args, rep)
    res["proxy_overhead/shardkv"] = run_workload(py2, "proxy_overhead", "shardkv", args, rep)
    res["warm_reads_local/shardkv"] = run_workload(py2, "warm_reads_local", "shardkv", args, rep)
    # peak RSS is per process: one process per repetition, samples merged
    runs = [run_workload(py2, "peak_memory", "shardkv", args, 1) for _ in range(rep)]
    merged = next((r for r in runs if isinstance(r, Missing)), None)
    if merged is None:
        merged = dict(runs[0])
        merged["samples"] = {k: [s for r in runs for s in r["samples"][k]] for k in runs[0]["samples"]}
    res["peak_memory/shardkv"] = merged
    # a convert of many 1 KiB chunks against tensorstore doing the same copy (the zarr 3 env has it)
    res["convert_scale/shardkv"] = run_workload(py2, "convert_scale", "shardkv", args, rep)
    res["convert_scale/tensorstore"] = run_workload(py3, "convert_scale", "tensorstore", args, rep)
    # sharding a zarr-python 3 array: shardkv moves its chunks, tensorstore and zarr 3 re-encode them (zarr 3 env)
    for impl in CONVERT_V3_IMPLS:
        res[f"convert_v3/{impl}"] = run_workload(py3, "convert_v3", impl, args, rep)
    # listing a many-chunk array from its shard indexes; S3 bytes and requests counted at the server
    res["list_scale/shardkv"] = run_workload(py2, "list_scale", "shardkv", args, rep)
    res["s3_reads/all"] = run_workload(py2, "s3_reads", "all", args, 1, ["--tensorstore-python", py3 or ""])
    for impl in DASK_IMPLS:
        res[f"dask_writes/{impl}"] = (
            Missing("skipped: --skip-dask")
            if getattr(args, "skip_dask", False)
            else run_workload(py2, "dask_writes", impl, args, rep)
        )
    return res


# -- the table ------------------------------------------------------------------------


def median(result: Any, key: str) -> float | Missing:
    if isinstance(result, Missing):
        return result
    return statistics.median(result["samples"][key])


def median_sum(result: Any, keys: tuple[str, ...]) -> float | Missing:
    """Median over repetitions of the sum of several samples of the same repetition."""
    if isinstance(result, Missing):
        return result
    return statistics.median(sum(vals) for vals in zip(*(result["samples"][k] for k in keys), strict=False))


def fmt_s(x: Any) -> str:
    return str(x) if isinstance(x, Missing) else f"{x:.3g} s"


def fmt_bytes(n: float) -> str:
    return f"{n / MiB:.1f} MiB" if n >= MiB else f"{n / 1024:.1f} KiB"


def ratio_row(rid: str, what: str, sk: Any, peer: Any, peer_label: str, fmt: Any, goal: float | None) -> list[str]:
    """A row whose ratio is shardkv / peer and whose goal is ``ratio <= goal``."""
    peer_cell = str(peer) if isinstance(peer, Missing) else f"{fmt(peer)} ({peer_label})"
    if isinstance(sk, Missing) or isinstance(peer, Missing):
        return [
            rid,
            what,
            fmt(sk) if not isinstance(sk, Missing) else str(sk),
            peer_cell,
            "n/a",
            goal_text(goal),
            "n/a",
        ]
    ratio = sk / peer
    return [rid, what, fmt(sk), peer_cell, f"{ratio:.2f}", goal_text(goal), met(ratio, goal)]


def value_row(
    rid: str, what: str, sk_cell: str, peer_cell: str, value: Any, goal: float | None, goal_note: str = ""
) -> list[str]:
    """A row whose ratio column is shardkv's own figure (goal: ``value <= goal``)."""
    if isinstance(value, Missing):
        return [rid, what, str(value), peer_cell, "n/a", goal_text(goal, goal_note), "n/a"]
    return [rid, what, sk_cell, peer_cell, f"{value:.2f}", goal_text(goal, goal_note), met(value, goal)]


def goal_text(goal: float | None, note: str = "") -> str:
    if goal is None:
        return "— (for information)"
    return f"<= {goal:g}" + (f" ({note})" if note else "")


def met(value: float, goal: float | None) -> str:
    if goal is None:
        return "—"
    return "yes" if value <= goal + 1e-12 else "no"


def build_rows(res: dict[str, Any], shardkv_options: list[str]) -> list[list[str]]:
    """The main table's rows (``shardkv_options``: the ``--shardkv-option`` texts, named in the W29 rows)."""
    rows: list[list[str]] = []
    wr_sk, wr_z3 = res["write_read/shardkv"], res["write_read/zarr3"]
    p1 = _shape_text(wr_sk, wr_z3)
    rows.append(
        ratio_row(
            "P1",
            f"full write {p1}: zarr 2.18 + ShardedStore(dir) vs zarr 3 ShardingCodec; time",
            median(wr_sk, "write_s"),
            median(wr_z3, "write_s"),
            "zarr 3",
            fmt_s,
            0.8,
        )
    )

    transformer = res["chunkwise_write/zarr2-transformer"]
    if isinstance(transformer, Missing):
        tr_cell = str(transformer)
    else:
        tr = median(transformer, "bytes_written")
        tr_cell = f"{fmt_bytes(tr)} = {tr / transformer['array_bytes']:.2f} (zarr 2.18 draft transformer)"
    for rid, impl, label, goal in (
        ("P2", "shardkv-writeback", "write-back (buffer_bytes = half the array)", 1.05),
        ("P2-direct", "shardkv", "no write-back (default)", None),
    ):
        r = res[f"chunkwise_write/{impl}"]
        what = f"chunk-by-chunk write {_shape_text(r, transformer)}, {label}: bytes written / array bytes"
        if isinstance(r, Missing):
            rows.append(value_row(rid, what, "", tr_cell, r, goal))
            continue
        bw = median(r, "bytes_written")
        rows.append(value_row(rid, what, f"{fmt_bytes(bw)} written", tr_cell, bw / r["array_bytes"], goal))

    rows.extend(w29.goal_rows(res, shardkv_options, ratio_row, value_row))

    rr_sk, rr_z3 = res["random_reads/shardkv"], res["random_reads/zarr3"]
    n = next((r["reads_per_pass"] for r in (rr_sk, rr_z3) if not isinstance(r, Missing)), "?")
    for rid, name, goal in (("P3", "warm", 1.0), ("P3-cold", "cold", None)):
        sk = median(rr_sk, f"{name}_requests_per_chunk")
        z3 = median(rr_z3, f"{name}_requests_per_chunk")
        z3_cell = str(z3) if isinstance(z3, Missing) else f"{z3:.2f} req/chunk (zarr 3, counted)"
        same = "same" if name == "warm" else "new"
        what = f"{n} random single-chunk reads, {name} ({same} store object): base-store requests per chunk"
        sk_cell = "" if isinstance(sk, Missing) else f"{sk:.2f} req/chunk"
        rows.append(value_row(rid, what, sk_cell, z3_cell, sk, goal))

    rows.append(
        ratio_row(
            "P4",
            f"whole-array read {p1}: zarr 2.18 + ShardedStore(dir) vs zarr 3 ShardingCodec; time",
            median(wr_sk, "read_s"),
            median(wr_z3, "read_s"),
            "zarr 3",
            fmt_s,
            0.8,
        )
    )

    po = res["proxy_overhead/shardkv"]
    rows.append(
        ratio_row(
            "P5",
            f"proxy overhead {_shape_text(po)}: zarr 2.18 on ShardedStore(dict) vs plain dict; write + read time",
            median_sum(po, ("sharded_write_s", "sharded_read_s")),
            median_sum(po, ("plain_write_s", "plain_read_s")),
            "plain dict",
            fmt_s,
            1.15,
        )
    )

    wl = res["warm_reads_local/shardkv"]
    rows.append(
        ratio_row(
            "P8",
            f"warm random single-chunk reads {_shape_text(wl)}: zarr 2.18 on ShardedStore(dir) vs "
            "DirectoryStore(dir), same chunks unsharded; time per read",
            median(wl, "sharded_s"),
            median(wl, "plain_s"),
            "DirectoryStore",
            fmt_s,
            1.0,
        )
    )

    pm = res["peak_memory/shardkv"]
    if isinstance(pm, Missing):
        rows.append(value_row("P6", "peak RSS of a write-back write, chunk row by chunk row", "", "—", pm, 1.0))
    else:
        peak = median(pm, "peak_above_baseline_bytes")
        what = (
            f"peak RSS above baseline writing {_shape_text(pm)} chunk row by chunk row, write-back "
            f"(buffer_bytes = {fmt_bytes(pm['buffer_bytes'])}); ratio = peak / (buffer + 2 shards)"
        )
        note = f"{fmt_bytes(pm['limit_bytes'])}"
        rows.append(value_row("P6", what, fmt_bytes(peak), "—", peak / pm["limit_bytes"], 1.0, note))
    rows.extend(convert_rows(res))
    rows.extend(convert_v3_rows(res))
    rows.extend(listing_rows(res))
    rows.extend(s3_rows(res))
    rows.extend(dask_rows(res))
    return rows


def convert_rows(res: dict[str, Any]) -> list[list[str]]:
    """P21: ``shardkv convert`` of many 1 KiB chunks vs tensorstore's copy: time, and peak RSS (goal 300 MiB)."""
    sk, peer = res["convert_scale/shardkv"], res["convert_scale/tensorstore"]
    n = next((r["chunks"] for r in (sk, peer) if not isinstance(r, Missing)), "?")
    what = f"convert {n:,} chunks of 1 KiB to 1,024 chunks per shard" if isinstance(n, int) else "convert"
    rows = [
        ratio_row(
            "P21-convert",
            f"{what}: shardkv convert vs tensorstore copy; time",
            median(sk, "copy_s"),
            median(peer, "copy_s"),
            "tensorstore",
            fmt_s,
            1.0,
        )
    ]
    peak, peer_peak = median(sk, "peak_rss_bytes"), median(peer, "peak_rss_bytes")
    peer_cell = str(peer_peak) if isinstance(peer_peak, Missing) else f"{fmt_bytes(peer_peak)} (tensorstore)"
    if isinstance(peak, Missing):
        rows.append(value_row("P21-convert-rss", f"{what}: peak RSS / 300 MiB", "", peer_cell, peak, 1.0))
    else:
        rows.append(
            value_row(
                "P21-convert-rss", f"{what}: peak RSS / 300 MiB", fmt_bytes(peak), peer_cell, peak / (300 * MiB), 1.0
            )
        )
    return rows


CONVERT_V3_IMPLS = ("shardkv", "tensorstore", "zarr3", "paired")


def convert_v3_rows(res: dict[str, Any]) -> list[list[str]]:
    """P9: sharding a zarr-python 3 array (zstd, 32^3 chunks) vs tensorstore's and zarr 3's re-encoding copies."""
    sk, ts, z3, pair = (res[f"convert_v3/{impl}"] for impl in CONVERT_V3_IMPLS)
    shape = next((r["shape"] for r in (sk, ts, z3) if not isinstance(r, Missing)), None)
    n = next((r["chunks"] for r in (sk, ts, z3) if not isinstance(r, Missing)), "?")
    what = f"shard a zarr 3 array {'x'.join(map(str, shape or ['?']))} ({n} chunks) 4^3 per shard"
    return [
        ratio_row(
            "P9-v3-convert",
            f"{what}: the copy (after imports) vs tensorstore's",
            median(sk, "work_s"),
            median(ts, "work_s"),
            "tensorstore",
            fmt_s,
            0.75,
        ),
        ratio_row(
            "P9-v3-convert-wall",
            f"{what}: the process (interpreter, imports, copy) vs tensorstore's",
            median(sk, "copy_s"),
            median(ts, "copy_s"),
            "tensorstore",
            fmt_s,
            0.75,
        ),
        value_row(
            "P9-v3-convert-paired",
            f"{what}: the process vs tensorstore's, in alternating pairs (median of the pairs' ratios)",
            fmt_s(median(pair, "copy_s")),
            str(pair) if isinstance(pair, Missing) else f"{fmt_s(median(pair, 'peer_copy_s'))} (tensorstore)",
            median(pair, "process_ratio"),
            0.75,
        ),
        ratio_row(
            "P9-v3-convert-zarr3",
            f"{what}: the copy vs zarr 3 from_array",
            median(sk, "work_s"),
            median(z3, "work_s"),
            "zarr3",
            fmt_s,
            None,
        ),
        ratio_row(
            "P9-v3-convert-rss",
            f"{what}: peak RSS vs tensorstore's",
            median(sk, "peak_rss_bytes"),
            median(ts, "peak_rss_bytes"),
            "tensorstore",
            fmt_bytes,
            None,
        ),
    ]


LIST_OPS = (
    ("list", "list(store)"),
    ("len", "len(store)"),
    ("keys", "list(store.keys())"),
    ("nchunks", "zarr 2 nchunks_initialized"),
)


def listing_rows(res: dict[str, Any]) -> list[list[str]]:
    """P21 listing rows: each listing of the many-chunk array through ShardedStore vs DirectoryStore (goal 0.5)."""
    r = res["list_scale/shardkv"]
    what = (
        "listing"
        if isinstance(r, Missing)
        else (
            f"{r['chunks']:,} chunks of {r['chunk_shape'][0]}x{r['chunk_shape'][1]} u1, "
            f"{r['chunks_per_shard']:,} per shard ({r['shards']:,} shards)"
        )
    )
    return [
        ratio_row(
            f"P21-{op}",
            f"{label}, {what}: ShardedStore(dir) vs DirectoryStore(dir) of one file per chunk; "
            "time, new store object each",
            median(r, f"sharded_{op}_s"),
            median(r, f"plain_{op}_s"),
            "DirectoryStore",
            fmt_s,
            0.5,
        )
        for op, label in LIST_OPS
    ]


S3_LAYOUTS = (("1024", "1,024 chunks/shard (16 KiB index)"), ("32768", "32x32x32 chunks/shard (512 KiB index)"))
S3_IMPLS = (("shardkv", "zarr 2 + shardkv (s3fs)"), ("shardkv-obstore", "zarr 2 + shardkv (obstore)"))


def s3_rows(res: dict[str, Any]) -> list[list[str]]:
    """P21 S3 rows, counted at the S3 server: body bytes per warm chunk read / chunk bytes (goal 1.1);
    requests of a cold single-chunk read vs tensorstore (goal: no more)."""
    r = res["s3_reads/all"]
    rows: list[list[str]] = []
    got = {} if isinstance(r, Missing) else r["results"]
    ts_missing = Missing(got.get("tensorstore/1024", {}).get("unavailable", "no tensorstore result"))

    def cell(x: dict[str, Any], reads: int) -> str:
        return f"{x['bytes'] / reads:,.0f} B in {x['requests'] / reads:.2f} req/read"

    for layout, label in S3_LAYOUTS:
        ts = got.get(f"tensorstore/{layout}", {})
        ts_cell = (
            f"{ts['warm']['bytes'] / (ts['reads'] * 256):.2f}: {cell(ts['warm'], ts['reads'])} (tensorstore)"
            if "warm" in ts
            else str(ts_missing)
        )
        for impl, impl_label in S3_IMPLS:
            what = (
                f"S3 warm single-chunk reads, 256 B chunks, {label}, {impl_label}: body bytes transferred / chunk bytes"
            )
            x = got.get(f"{impl}/{layout}")
            if x is None or "warm" not in x:
                rows.append(
                    value_row(
                        f"P21-s3-warm-{layout}-{impl}",
                        what,
                        "",
                        ts_cell,
                        r if isinstance(r, Missing) else Missing("no result"),
                        1.1,
                    )
                )
                continue
            rid = f"P21-s3-warm-{layout}-{impl}"
            rows.append(
                value_row(
                    rid,
                    f"{what} ({x['reads']} reads)",
                    cell(x["warm"], x["reads"]),
                    ts_cell,
                    x["warm"]["bytes"] / (x["reads"] * 256),
                    1.1,
                )
            )
    ts = got.get("tensorstore/1024", {})
    for impl, impl_label in S3_IMPLS:
        what = f"S3 cold read of one chunk (new store, open + read), 1,024 chunks/shard, {impl_label}: "
        what += "requests, all methods"
        x = got.get(f"{impl}/1024", {})
        sk_req = x["cold"]["requests"] if "cold" in x else (r if isinstance(r, Missing) else Missing("no result"))
        ts_req = ts["cold"]["requests"] if "cold" in ts else ts_missing

        def fmt_req(n: Any, who: dict[str, Any] = x) -> str:
            methods = ", ".join(f"{v} {k}" for k, v in who["cold"]["by_method"].items())
            return f"{n} ({methods})"

        row = ratio_row(f"P21-s3-cold-{impl}", what, sk_req, ts_req, "tensorstore", fmt_req, 1.0)
        if "cold" in ts:  # the peer cell with tensorstore's own methods
            row[3] = f"{fmt_req(ts_req, ts)} (tensorstore)"
        rows.append(row)
    return rows


DASK_IMPLS = (
    "zarr2-threads",
    "shardkv",
    "shardkv-buffer",
    "zarr2-cluster",
    "shardkv-rechunk",
    "xarray-zarr2",
    "xarray-shardkv",
    "xarray-shardkv-buffer",
)


def dask_rows(res: dict[str, Any]) -> list[list[str]]:
    """P7 rows: dask and xarray writes of 64 x 64 blocks through ShardedStore vs plain zarr 2."""
    rows: list[list[str]] = []
    shape = _shape_text(*(res[f"dask_writes/{i}"] for i in DASK_IMPLS))
    for rid, impl, peer, label in (
        ("P7-dask", "shardkv", "zarr2-threads", "da.store, 64x64 blocks, threads, default (write-through)"),
        ("P7-dask-buffer", "shardkv-buffer", "zarr2-threads", "da.store, 64x64 blocks, threads, buffer_bytes"),
        (
            "P7-dask-rechunk",
            "shardkv-rechunk",
            "zarr2-cluster",
            "rechunk_to_shards + da.store, LocalCluster 2 processes (zarr 2: 64x64 blocks, same cluster)",
        ),
        ("P7-xarray", "xarray-shardkv", "xarray-zarr2", "Dataset.to_zarr, 64x64 blocks, threads, default"),
        ("P7-xarray-buffer", "xarray-shardkv-buffer", "xarray-zarr2", "Dataset.to_zarr, threads, buffer_bytes"),
    ):
        what = f"dask write {shape}, 8x8 chunks per shard, {label}: time vs plain zarr 2 DirectoryStore"
        rows.append(
            ratio_row(
                rid,
                what,
                median(res[f"dask_writes/{impl}"], "write_s"),
                median(res[f"dask_writes/{peer}"], "write_s"),
                "zarr 2",
                fmt_s,
                None,
            )
        )
    return rows


def _shape_text(*results: Any) -> str:
    for r in results:
        if not isinstance(r, Missing):
            shape = r["shape"]
            nbytes = r.get("array_bytes", shape[0] * shape[1] * 4)
            return f"{shape[0]}x{shape[1]} f32 ({fmt_bytes(nbytes)})"
    return "(size unknown)"


def markdown_table(rows: list[list[str]]) -> str:
    header = ["id", "what", "shardkv", "peer", "ratio", "goal", "met?"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


# -- machine facts ------------------------------------------------------------------------


def machine_facts(res: dict[str, Any], py2: str | None, py3: str | None) -> list[str]:
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    ram = "unknown"
    try:
        with open("/proc/meminfo") as f:
            kib = next(int(ln.split()[1]) for ln in f if ln.startswith("MemTotal"))
        ram = f"{kib / 1024 / 1024:.1f} GiB"
    except (OSError, StopIteration):
        pass
    facts = [
        f"- CPU: {cpu}; {os.cpu_count()} logical cores; RAM {ram}; {platform.system()} {platform.release()}",
        f"- load average (1, 5, 15 min) at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())} "
        "(other processes on the machine skew timings; counts and bytes are exact)",
        f"- git: {git_describe()}",
    ]
    for env, py in (("zarr2", py2), ("zarr3", py3)):
        versions = next(
            (r["versions"] for k, r in res.items() if not isinstance(r, Missing) and _env_of(k) == env), None
        )
        if versions is None:
            facts.append(f"- {ENVS[env][0]}: {'missing' if py is None else 'no successful workload'}")
        else:
            v = ", ".join(
                f"{k} {versions[k]}" for k in ("python", "zarr", "numcodecs", "numpy", "shardkv") if k in versions
            )
            facts.append(f"- {ENVS[env][0]} ({py}): {v}")
    params = next(
        (r.get("shardkv_params") for r in res.values() if not isinstance(r, Missing) and r.get("shardkv_params")), None
    )
    if params:
        facts.append(f"- ShardedStore parameters found: {', '.join(params)}")
    return facts


def _env_of(key: str) -> str:
    return w29.env_of(key) or ("zarr3" if key.endswith("/zarr3") else "zarr2")


def git_describe() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT, check=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "shardkv"], capture_output=True, text=True, cwd=ROOT
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + (" (shardkv/ has uncommitted changes)" if dirty.stdout.strip() else "")


def notes(res: dict[str, Any], size: str) -> list[str]:
    out = [
        "- Times are medians over the repetitions; a ratio is median(shardkv) / median(peer). "
        "P2, P3 and P6 show shardkv's own figure in the ratio column.",
        "- Data: seeded standard normal float32; blosc lz4, clevel 5, byte shuffle; inner chunks 64x64, "
        "shards 512x512 (8x8 chunks), index at the end with crc32c. Local directories in a temp dir "
        "(page cache warm for both sides). zarr 3 uses its default async/thread settings; zarr 2.18 is single-threaded "
        "above blosc.",
    ]
    if size == "smoke":
        out.append(
            "- Size smoke: the test suite's check that every workload runs and reports its fields; the "
            "workloads of the runner's environment ran in its process, dask's LocalCluster with one worker "
            "thread; no figure here means anything."
        )
    elif size != "full":
        out.append(
            f"- Size {size}: timed operations last milliseconds, so time ratios swing with machine load; "
            "quote `--size full` timings. Counts, bytes and memory do not depend on load."
        )
    for key in ("chunkwise_write/shardkv-writeback", "chunkwise_write/shardkv", "chunkwise_write/zarr2-transformer"):
        r = res[key]
        if not isinstance(r, Missing):
            written, stored = median(r, "bytes_written"), median(r, "stored_bytes")
            out.append(
                f"- {key}: {fmt_bytes(written)} written in {median(r, 'writes'):.0f} writes; "
                f"{fmt_bytes(stored)} stored at the end; written / stored = {written / stored:.2f}"
            )
    loads = [a for i in DASK_IMPLS if not isinstance(r := res[f"dask_writes/{i}"], Missing) for a in r["load_avg_1m"]]
    if loads:
        out.append(f"- P7 (dask_writes): 1-minute load average {min(loads):.2f} to {max(loads):.2f} during the runs.")
    for key in ("random_reads/shardkv", "random_reads/zarr3"):
        r = res[key]
        if not isinstance(r, Missing):
            if r.get("uncounted_methods"):
                out.append(
                    f"- WARNING {key}: store methods not counted as requests: {', '.join(r['uncounted_methods'])}"
                )
            if r.get("stat_calls"):
                out.append(
                    f"- {key}: also {r['stat_calls']} request-free size/validator look-ups "
                    "(local stat; stores without them answer None) over all passes"
                )
            out.append(
                f"- {key}: {median(r, 'cold_s_per_chunk') * 1e6:.0f} µs per chunk cold, "
                f"{median(r, 'warm_s_per_chunk') * 1e6:.0f} µs warm"
            )
    po = res["proxy_overhead/shardkv"]
    if not isinstance(po, Missing):
        out.append("- P5 split: " + ", ".join(f"{k} {fmt_s(median(po, k))}" for k in po["samples"]))
    ls = res["list_scale/shardkv"]
    if not isinstance(ls, Missing):
        out.append(
            f"- P21 listing fixture: {ls['chunks']:,} chunk files + {ls['shards']:,} shard files written in "
            f"{ls['fixture_s']:.1f} s (plain file writes); 1-minute load average {ls['load_avg_1m']:.2f} after"
        )
    s3 = res["s3_reads/all"]
    if not isinstance(s3, Missing):
        for key, x in s3["results"].items():
            if "cold" in x:
                out.append(
                    f"- P21 S3 {key}: cold {x['cold']['requests']} requests {x['cold']['by_method']}, "
                    f"{x['cold']['bytes']:,} B; warm {x['reads']} reads: {x['warm']['requests']} requests "
                    f"({x['warm']['conditional']} with If-Match, {x['warm']['ranged']} ranged, "
                    f"{x['warm']['status_412']} answered 412), {x['warm']['bytes']:,} B"
                )
    return out


def raw_samples(res: dict[str, Any]) -> list[str]:
    out = []
    for key, r in res.items():
        if isinstance(r, Missing):
            out.append(f"- {key}: {r}")
            continue
        parts = [f"{k}=[{', '.join(f'{v:.4g}' for v in vals)}]" for k, vals in r["samples"].items()]
        out.append(f"- {key}: {'; '.join(parts)}")
    return out


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--size",
        choices=["smoke", "tiny", "small", "full"],
        default="small",
        help="tiny: seconds; small: ~a minute; full: the README numbers; smoke: the test suite's "
        "check that every workload runs (workloads in this process; figures mean nothing)",
    )
    parser.add_argument(
        "--repeat", type=int, default=None, help="repetitions (default: 3 full, 2 small, 1 tiny and smoke)"
    )
    parser.add_argument(
        "--peer-samples",
        type=int,
        default=None,
        help="fresh processes per peer-matrix case (default: 3 full, 1 otherwise)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--make-envs", action="store_true", help="create missing .venv-zarr2/.venv-zarr3 like tests/run.sh"
    )
    parser.add_argument("--zarr2-python", help="interpreter of the zarr-python 2.18 environment (default: .venv-zarr2)")
    parser.add_argument("--zarr3-python", help="interpreter of the zarr-python 3 environment (default: .venv-zarr3)")
    parser.add_argument("--skip-dask", action="store_true", help="leave out the dask/xarray write rows (P7 show n/a)")
    parser.add_argument("--peers-only", action="store_true", help="run only the peer matrix (P rows show n/a)")
    parser.add_argument("--bench-python", help="interpreter of the peer environment (default: .venv-bench)")
    parser.add_argument(
        "--only",
        type=lambda text: set(text.split(",")),
        default=None,
        metavar="W1,W2",
        help="run only these workloads (file names in workloads/, 'peers' for the peer matrix); "
        "the other rows show n/a",
    )
    parser.add_argument(
        "--shardkv-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an option of every shardkv store of the W29 rows (repeatable; VALUE read as JSON when it parses, "
        "else as text); an option the installed shardkv does not know shows as n/a (option unknown)",
    )
    parser.add_argument("--dir", help="run the W29 workloads in this directory (default: the system's temp dir)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "latest.md")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per workload process")
    args = parser.parse_args(argv)
    if args.repeat is None:
        args.repeat = DEFAULT_REPEAT[args.size]
    if args.repeat < 1:
        parser.error(f"--repeat must be >= 1, got {args.repeat}")

    overrides = {"zarr2": args.zarr2_python, "zarr3": args.zarr3_python, "bench": args.bench_python}
    if args.make_envs:
        for name, override in overrides.items():
            if override is None and find_python(name, None) is None:
                log(f"creating {ENVS[name][0]} ...")
                make_env(name)
    pythons = {name: find_python(name, override) for name, override in overrides.items()}
    py2, py3 = pythons["zarr2"], pythons["zarr3"]
    for name, py in pythons.items():
        if py is None:
            log(f"{ENVS[name][0]} not found: its columns show n/a (create it with --make-envs or bash tests/run.sh)")

    started = time.perf_counter()
    load_start = os.getloadavg()
    log(f"shardkv benchmarks, size {args.size}, {args.repeat} repetition(s)")
    res = collect(args, pythons)
    log("peer matrix (one process per sample) ...")
    skip_peers = args.only is not None and "peers" not in args.only
    server = peers_matrix.S3Server(None if skip_peers else pythons["bench"] or py2, args.out.parent)
    if skip_peers:
        server.reason = "skipped: --only"
    try:
        peers = peers_matrix.collect(
            args.size,
            pythons,
            server,
            lambda py, workload, impl, extra: run_workload(py, workload, impl, args, 1, extra),
            args.peer_samples,
            Missing,
        )
    finally:
        server.stop()
    elapsed = time.perf_counter() - started
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    doc = "\n".join(
        [
            f"# shardkv benchmarks (size {args.size}, {args.repeat} repetition(s), {stamp}, {elapsed:.0f} s)",
            "",
            f"Command: `python benchmarks/run.py --size {args.size} --repeat {args.repeat}"
            f"{' --peers-only' if args.peers_only else ''}"
            f"{' --only ' + ','.join(sorted(args.only)) if args.only else ''}"
            f"{''.join(f' --shardkv-option {o}' for o in args.shardkv_option)}"
            f"{f' --dir {args.dir}' if args.dir else ''}`",
            "",
            markdown_table(
                build_rows(res, args.shardkv_option)
                + peers_matrix.goal_rows(peers, ratio_row, value_row, fmt_s, lambda r: isinstance(r, Missing))
            ),
            "",
            "## Write-cost rows (W29): every implementation (medians; W29-2 seconds: total (write, append, region))",
            "",
            w29.detail_table({k: v for k, v in res.items() if w29.env_of(k)}, args.shardkv_option),
            "",
            f"## Peer matrix: seconds, median [min-max] of {args.peer_samples or peers_matrix.SAMPLES[args.size]} "
            "fresh process(es) per cell; S3 cells add the requests the server saw (median)",
            "",
            peers_matrix.matrix_table(peers, args.size),
            "",
            "Machine:",
            f"- load average (1, 5, 15 min) at the start: {', '.join(f'{x:.2f}' for x in load_start)}",
            *machine_facts(res, py2, py3),
            *peers_matrix.versions_text(peers),
            "",
            "Notes:",
            *notes(res, args.size),
            *w29.notes({k: v for k, v in res.items() if w29.env_of(k)}, args.shardkv_option, args.dir),
            "",
            "Raw samples (every repetition):",
            *raw_samples(res),
            *raw_samples({"peers/" + "/".join(map(str, k)): r for k, r in peers.items()}),
            "",
        ]
    )
    print(doc)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(doc)
    log(f"written to {args.out}")
    everything = list(res.values()) + list(peers.values())
    return 1 if any(isinstance(r, Missing) and r.failed for r in everything) else 0


if __name__ == "__main__":
    sys.exit(main())
