"""The write-cost rows (W29) in ``benchmarks/run.py``: write cost against tensorstore, zarr 3 and zarrs.

Three workloads on the array of ``workloads/_w29.py`` (3-D uint16, 64³
chunks, 256³ shards, zstd 0; 512³ in 8 shards at full size), each
implementation in a process of its own and the environment it needs (shardkv
and the dask row: ``.venv-zarr3``; zarr 3 native, zarrs and tensorstore:
``.venv-bench``):

* W29-1, ``workloads/w29_write.py``: a whole write; goals: shardkv with default
  options writes <= 1.1x the bytes it stores, in <= 1.05x the time of shardkv
  with ``buffer_bytes`` (W29-1-time);
* W29-2, ``workloads/w29_dask.py``: xarray ``to_zarr`` from a LocalCluster of 2
  processes, dask chunks 1/64 of a shard, three steps; goal: shardkv's time
  <= 1.0x zarr 3 native shards with ``align_chunks=True``, nothing lost;
* W29-3, ``workloads/w29_update.py``: one 64³ chunk updated in each shard; goal:
  shardkv writes <= 1/8 of the bytes zarr 3 native writes.

Every shardkv figure takes the runner's ``--shardkv-option NAME=VALUE``
options; an option the installed shardkv does not know shows as ``n/a (option
unknown)``. ``--dir PATH`` runs them in that directory. Uses the standard
library only; the table helpers are the runner's, passed in.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

MiB = 1 << 20
# workload -> implementation -> environment (the runner's ENVS)
IMPLS: dict[str, dict[str, str]] = {
    "w29_write": {
        "shardkv": "zarr3",
        "shardkv-buffer": "zarr3",
        "zarr3": "bench",
        "zarr3-zarrs": "bench",
        "tensorstore": "bench",
    },
    "w29_dask": {"shardkv": "zarr3", "shardkv-shards": "zarr3", "native-align": "zarr3", "native-unsafe": "zarr3"},
    "w29_update": {"shardkv": "zarr3", "zarr3": "bench", "zarr3-zarrs": "bench", "tensorstore": "bench"},
}
# "{options}": the shardkv options of the run (the defaults, or those of --shardkv-option)
LABEL = {
    ("w29_write", "shardkv"): "shardkv.zarr3.ShardedStore(dir), {options}",
    ("w29_write", "shardkv-buffer"): "shardkv.zarr3.ShardedStore(dir), {options}, buffer_bytes=array bytes, flush()",
    ("w29_dask", "shardkv"): "shardkv.zarr3.ShardedStore(dir), {options}, dask chunks 64³",
    ("w29_dask", "shardkv-shards"): "shardkv.zarr3.ShardedStore(dir), {options}, dask chunks cut at the shards",
    ("w29_dask", "native-align"): "zarr 3 native shards, align_chunks=True",
    ("w29_dask", "native-unsafe"): "zarr 3 native shards, safe_chunks=False",
    ("w29_update", "shardkv"): "shardkv.zarr3.ShardedStore(dir), {options}",
}
PEER_LABEL = {"zarr3": "zarr 3 native shards", "zarr3-zarrs": "zarr 3 + zarrs", "tensorstore": "tensorstore"}
# the detail table names the rows in words: its lines are not rows of the main table (W29-n)
ROW_OF = {"w29_write": "row 1 (W29-1)", "w29_dask": "row 2 (W29-2)", "w29_update": "row 3 (W29-3)"}

Runner = Callable[[str | None, str, str, list[str]], Any]


def keys() -> list[str]:
    """Every result key (``workload/impl``)."""
    return [f"{workload}/{impl}" for workload, impls in IMPLS.items() for impl in impls]


def env_of(key: str) -> str | None:
    """The environment of a result key, or ``None`` if the key is not one of these rows'."""
    workload, _, impl = key.partition("/")
    return IMPLS.get(workload, {}).get(impl)


def collect(pythons: dict[str, str | None], run: Runner, options: list[str], directory: str | None) -> dict[str, Any]:
    """Every implementation of every workload, each ``run(python, workload, impl, extra)`` in its environment.

    ``options``: the ``NAME=VALUE`` texts of ``--shardkv-option``; ``directory``: ``--dir``.
    """
    extra = [arg for item in options for arg in ("--shardkv-option", item)]
    if directory is not None:
        extra += ["--dir", directory]
    return {
        f"{workload}/{impl}": run(pythons[env], workload, impl, extra)
        for workload, impls in IMPLS.items()
        for impl, env in impls.items()
    }


def _median(result: Any, key: str) -> Any:
    """The median of a result's samples, or the result itself when it is a ``Missing``."""
    if not isinstance(result, dict):
        return result
    return statistics.median(result["samples"][key])


def _mib(n: float) -> str:
    return f"{n / MiB:.1f} MiB"


def _shape(res: dict[str, Any]) -> str:
    shape = next((r["shape"] for r in res.values() if isinstance(r, dict) and "shape" in r), None)
    return "x".join(map(str, shape)) + " u2" if shape else "(size unknown)"


def options_text(options: list[str]) -> str:
    """The shardkv options of a run, as the tables name them."""
    return "options " + ", ".join(options) if options else "default options"


def goal_rows(
    res: dict[str, Any],
    options: list[str],
    ratio_row: Callable[..., list[str]],
    value_row: Callable[..., list[str]],
) -> list[list[str]]:
    """W29-1, W29-1-time, W29-2 and W29-3 of the main table (the runner's ``ratio_row`` and ``value_row``)."""
    shape = _shape(res)
    opts = options_text(options)
    layout = f"{shape}, 64³ chunks, 256³ shards, zstd 0"
    rows = []

    sk, buf = res["w29_write/shardkv"], res["w29_write/shardkv-buffer"]
    what = f"zarr 3 whole write {layout}, through shardkv.zarr3.ShardedStore(dir), {opts}"
    if isinstance(sk, dict):
        written, stored = _median(sk, "written_bytes"), _median(sk, "stored_bytes")
        cell = (
            f"{_mib(written)} written, {_median(sk, 'write_s'):.3g} s, {_median(sk, 'shard_puts'):.0f} shard puts, "
            f"{_median(sk, 'writes_queued'):.0f} writes queued"
        )
        rows.append(
            value_row("W29-1", f"{what}: bytes written / stored", cell, f"{_mib(stored)} stored", written / stored, 1.1)
        )
    else:
        rows.append(value_row("W29-1", f"{what}: bytes written / stored", "", "—", sk, 1.1))
    rows.append(
        ratio_row(
            "W29-1-time",
            f"{what} vs the same with buffer_bytes = the array's bytes (+ flush); time",
            _median(sk, "write_s"),
            _median(buf, "write_s"),
            "buffer_bytes",
            _fmt_s,
            1.05,
        )
    )

    sk, native = res["w29_dask/shardkv"], res["w29_dask/native-align"]
    row = ratio_row(
        "W29-2",
        f"xarray to_zarr {layout} from a LocalCluster of 2 processes, dask chunks 64³ (write, append_dim, region=), "
        f"through shardkv.zarr3.ShardedStore ({opts}) vs zarr 3 native shards with align_chunks=True; time",
        _median(sk, "total_s"),
        _median(native, "total_s"),
        "native, align_chunks",
        _fmt_s,
        1.0,
    )
    if isinstance(sk, dict):
        lost = max(sk["samples"]["lost_chunks"])
        row[2] += f", {lost} chunks lost"
        if lost:  # the goal is the time of a write that loses nothing
            row[-1] = "no (chunks lost)"
    rows.append(row)

    sk, native = res["w29_update/shardkv"], res["w29_update/zarr3"]
    n = next((r["updates"] for r in (sk, native) if isinstance(r, dict)), "?")
    row = ratio_row(
        "W29-3",
        f"update one 64³ chunk in each of the {n} shards of {layout}: shardkv.zarr3.ShardedStore ({opts}) vs "
        "zarr 3 native shards; bytes written",
        _median(sk, "written_bytes"),
        _median(native, "written_bytes"),
        "zarr 3 native",
        _mib,
        0.125,
    )
    if isinstance(sk, dict):
        row[2] += f" ({_mib(_median(sk, 'read_bytes'))} read, {_median(sk, 'update_s'):.3g} s)"
    rows.append(row)
    return rows


def _fmt_s(x: Any) -> str:
    return str(x) if not isinstance(x, (int, float)) else f"{x:.3g} s"


def detail_table(res: dict[str, Any], options: list[str]) -> str:
    """Every implementation's figures, one line each (medians over the repetitions)."""
    header = ["row", "implementation", "env", "seconds", "written", "read", "stored", "shard puts", "chunks lost"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    time_key = {"w29_write": "write_s", "w29_dask": "total_s", "w29_update": "update_s"}
    for key, r in res.items():
        workload, _, impl = key.partition("/")
        label = LABEL.get((workload, impl), PEER_LABEL.get(impl, impl)).format(options=options_text(options))
        cells = [ROW_OF[workload], label, IMPLS[workload][impl]]
        if not isinstance(r, dict):
            cells += [str(r)] + ["—"] * 5
        else:
            samples = r["samples"]

            def get(name: str, fmt: Callable[[float], str], s: dict[str, Any] = samples) -> str:
                return fmt(statistics.median(s[name])) if name in s else "—"

            seconds = get(time_key[workload], lambda x: f"{x:.3g}")
            if workload == "w29_dask":
                seconds += (
                    " ("
                    + ", ".join(get(f"{step}_s", lambda x: f"{x:.3g}") for step in ("write", "append", "region"))
                    + ")"
                )
            lost = "—"
            if "lost_chunks" in samples:
                lost = f"{get('lost_chunks', lambda x: f'{x:.0f}')} of {get('chunks_written', lambda x: f'{x:.0f}')}"
            cells += [
                seconds,
                get("written_bytes", _mib),
                get("read_bytes", _mib),
                get("stored_bytes", _mib),
                get("shard_puts", lambda x: f"{x:.0f}"),
                lost,
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def notes(res: dict[str, Any], options: list[str], directory: str | None) -> list[str]:
    """What the W29 rows ran with: options, directory, load, versions."""
    out = [
        f"- W29 rows: shardkv options {', '.join(options) if options else '(none: the defaults)'}; "
        f"directories under {directory or 'the system temporary directory'}. Bytes are wchar/rchar of "
        "/proc/self/io (every write/read call of the process, page cache or not); W29-2's dask chunks "
        "are written by the worker processes, so that row reports time and chunks lost only.",
    ]
    loads = [
        x
        for r in res.values()
        if isinstance(r, dict)
        for x in (r["load_avg_1m"] if isinstance(r["load_avg_1m"], list) else [r["load_avg_1m"]])
    ]
    if loads:
        out.append(f"- W29 rows: 1-minute load average {min(loads):.2f} to {max(loads):.2f} at their ends.")
    seen = sorted(
        {f"{k} {v}" for r in res.values() if isinstance(r, dict) for k, v in r.get("peer_versions", {}).items()}
    )
    if seen:
        out.append(f"- W29 versions: {', '.join(seen)}")
    return out
