"""The peer matrix of ``benchmarks/run.py``: shardkv against the strongest peers, side by side.

Cases: backend (local disk, S3 on loopback) x chunk layout (256² / 64²
elements, 4 x 4 chunks per shard) x inner codec (none / zstd level 1), each
run by every implementation of ``workloads/peers.py`` in the environment it
needs (zarr 2 side: ``.venv-zarr2``; zarr 3, zarrs, tensorstore:
``.venv-bench``, Python 3.12). Every sample is a fresh process; the table
shows median [min-max] over the samples, and for S3 the requests the server
saw. The S3 server (``workloads/s3_server.py``, moto on 127.0.0.1) is started
and stopped here. Uses the standard library only.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
IMPLS = ("shardkv", "shardkv-obstore", "zarr2-unsharded", "zarr2-dict", "zarr3", "zarr3-zarrs", "tensorstore")
ENV_OF = {
    "shardkv": "zarr2",
    "shardkv-obstore": "zarr2",
    "zarr2-unsharded": "zarr2",
    "zarr2-dict": "zarr2",
    "zarr3": "bench",
    "zarr3-zarrs": "bench",
    "tensorstore": "bench",
}
LABEL = {
    "shardkv": "zarr 2 + shardkv",
    "shardkv-obstore": "zarr 2 + shardkv (obstore)",
    "zarr2-unsharded": "zarr 2.18 unsharded",
    "zarr2-dict": "zarr 2.18 on dict",
    "zarr3": "zarr 3",
    "zarr3-zarrs": "zarr 3 + zarrs",
    "tensorstore": "tensorstore",
}
# (backend, layout, codec) cases per size, and samples (processes) per case
CASES = {
    "smoke": [("local", 256, "none"), ("s3", 256, "none")],
    "tiny": [("local", 256, "none"), ("s3", 256, "none")],
    "small": [
        ("local", 256, "none"),
        ("local", 256, "zstd"),
        ("local", 64, "none"),
        ("local", 64, "zstd"),
        ("s3", 256, "none"),
    ],
    "full": [
        ("local", 256, "none"),
        ("local", 256, "zstd"),
        ("local", 64, "none"),
        ("local", 64, "zstd"),
        ("s3", 256, "none"),
    ],
}
CHUNKS_PER_SHARD = 4  # per side, as workloads/peers.py writes them
SAMPLES = {"smoke": 1, "tiny": 1, "small": 1, "full": 3}
OPS = (
    ("write", "full write"),
    ("read", "full read (new store object)"),
    ("cold", "random single-chunk reads, first pass"),
    ("warm", "the same reads again (warm)"),
)

Runner = Callable[[str | None, str, str, list[str]], Any]


class S3Server:
    """``workloads/s3_server.py`` in a child process: ``endpoint`` and ``log`` once started, else ``None``."""

    def __init__(self, python: str | None, log_dir: Path) -> None:
        self.endpoint: str | None = None
        self.log: str | None = None
        self.reason = "no environment with moto"
        self.proc: subprocess.Popen[str] | None = None
        if python is None:
            return
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log = str(log_dir / "s3-requests.log")
        Path(self.log).write_text("")
        self.proc = subprocess.Popen(
            [python, str(ROOT / "benchmarks" / "workloads" / "s3_server.py"), "--log", self.log],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if line.startswith("READY "):
            self.endpoint = f"http://127.0.0.1:{int(line.split()[1])}"
        else:
            self.reason = "S3 server did not start: " + (self.proc.stderr.read().strip().splitlines() or ["?"])[-1][:80]
            self.stop()

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.stdin:
                self.proc.stdin.close()  # the server stops when its stdin closes
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


def collect(
    size: str,
    pythons: dict[str, str | None],
    server: S3Server,
    run: Runner,
    samples: int | None,
    missing: Callable[[str], Any],
) -> dict[tuple[str, int, str, str], Any]:
    """Every case x implementation: the samples of ``samples`` fresh processes merged, or a ``Missing``."""
    out: dict[tuple[str, int, str, str], Any] = {}
    n = samples or SAMPLES[size]
    for backend, layout, codec in CASES[size]:
        for impl in IMPLS:
            key = (backend, layout, codec, impl)
            if backend == "s3" and server.endpoint is None:
                out[key] = missing(server.reason)
                continue
            extra = ["--layout", str(layout), "--codec", codec, "--backend", backend]
            if backend == "s3":
                extra += ["--s3-endpoint", server.endpoint or "", "--s3-log", server.log or ""]
            runs = []
            for _ in range(n):  # one process per sample
                r = run(pythons[ENV_OF[impl]], "peers", impl, extra)
                runs.append(r)
                if not isinstance(r, dict):
                    break
            bad = next((r for r in runs if not isinstance(r, dict)), None)
            if bad is not None:
                out[key] = bad
                continue
            merged = dict(runs[0])
            merged["samples"] = {k: [s for r in runs for s in r["samples"].get(k, [])] for k in runs[0]["samples"]}
            out[key] = merged
    return out


def _cell(result: Any, op: str, backend: str) -> str:
    if not isinstance(result, dict):
        return str(result)
    vals = result["samples"].get(f"{op}_s")
    if not vals:
        return "n/a"
    text = f"{statistics.median(vals):.3g} [{min(vals):.3g}-{max(vals):.3g}]"
    if backend == "s3":
        req = result["samples"].get(f"{op}_requests") or [0]
        text += f" ({statistics.median(req):.0f} req)"
    return text


def matrix_table(res: dict[tuple[str, int, str, str], Any], size: str) -> str:
    """One row per case and operation, one column per implementation: seconds, median [min-max]."""
    header = ["case", "operation", *(LABEL[i] for i in IMPLS)]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for backend, layout, codec in CASES[size]:
        shape = next(
            (
                r["shape"]
                for (b, lay, c, _), r in res.items()
                if (b, lay, c) == (backend, layout, codec) and isinstance(r, dict)
            ),
            None,
        )
        reads = next(
            (
                r["reads"]
                for (b, lay, c, _), r in res.items()
                if (b, lay, c) == (backend, layout, codec) and isinstance(r, dict)
            ),
            "?",
        )
        where = "local disk" if backend == "local" else "S3 on loopback"
        case = f"{where}, {layout}² chunks, {codec}" + (f", {shape[0]}² f32" if shape else "")
        for op, what in OPS:
            what = f"{reads} {what}" if op in ("cold", "warm") else what
            cells = [_cell(res.get((backend, layout, codec, impl)), op, backend) for impl in IMPLS]
            lines.append("| " + " | ".join([case, what, *cells]).replace("\n", " ") + " |")
    return "\n".join(lines)


def _med(res: dict[tuple[str, int, str, str], Any], key: tuple[str, int, str, str], name: str) -> Any:
    r = res.get(key)
    if not isinstance(r, dict):
        return r
    vals = r["samples"].get(name)
    return statistics.median(vals) if vals else None


def goal_rows(
    res: dict[tuple[str, int, str, str], Any],
    ratio_row: Callable[..., list[str]],
    value_row: Callable[..., list[str]],
    fmt_s: Callable[[Any], str],
    is_missing: Callable[[Any], bool],
) -> list[list[str]]:
    """The issue's goals as rows of the main table (ids G1-G3); the shared ``ratio_row``/``value_row`` format."""
    rows: list[list[str]] = []
    for codec in ("none", "zstd"):
        sk = ("local", 256, codec, "shardkv")
        if sk not in res:
            continue
        for op in ("write", "read"):
            for peer, goal, rid in (("zarr2-unsharded", 1.0, "G1"), ("zarr2-dict", 1.25, "G1-dict")):
                rows.append(
                    ratio_row(
                        f"{rid}-{op}-{codec}",
                        f"full {op}, local disk, 256² chunks, {codec}: zarr 2 + shardkv vs {LABEL[peer]}",
                        _med(res, sk, f"{op}_s"),
                        _med(res, ("local", 256, codec, peer), f"{op}_s"),
                        LABEL[peer],
                        fmt_s,
                        goal,
                    )
                )
    for impl in ("shardkv", "shardkv-obstore"):
        key = ("s3", 256, "none", impl)
        if key not in res:
            continue
        r = res[key]
        label = LABEL[impl]
        if is_missing(r):
            rows.append(
                value_row(f"G3-requests-{impl}", f"S3 full read, {label}: requests / (shards + 3)", "", "—", r, 1.0)
            )
            rows.append(
                value_row(f"G3-warm-{impl}", f"S3 warm random reads, {label}: requests per chunk", "", "—", r, 1.0)
            )
            continue
        shards = (-(-r["shape"][0] // (r["layout"] * CHUNKS_PER_SHARD))) ** 2  # a partial shard counts (size smoke)
        req = _med(res, key, "read_requests")
        rows.append(
            value_row(
                f"G3-requests-{impl}",
                f"S3 full read ({shards} shards), {label}: requests / (shards + 3)",
                f"{req:.0f} requests",
                "—",
                req / (shards + 3),
                1.0,
            )
        )
        warm = _med(res, key, "warm_requests") / r["reads"]
        ts_key = ("s3", 256, "none", "tensorstore")
        ts_warm = _med(res, ts_key, "warm_requests")
        ts_cell = (
            "n/a" if not isinstance(ts_warm, (int, float)) else f"{ts_warm / r['reads']:.2f} req/chunk (tensorstore)"
        )
        rows.append(
            value_row(
                f"G3-warm-{impl}",
                f"S3 {r['reads']} warm random single-chunk reads, {label}: requests per chunk",
                f"{warm:.2f} req/chunk",
                ts_cell,
                warm,
                1.0,
            )
        )
        rows.append(
            ratio_row(
                f"G3-warm-time-{impl}",
                f"S3 {r['reads']} warm random single-chunk reads, {label} vs tensorstore; time",
                _med(res, key, "warm_s"),
                _med(res, ts_key, "warm_s"),
                "tensorstore",
                fmt_s,
                0.7,
            )
        )
    return rows


def versions_text(res: dict[tuple[str, int, str, str], Any]) -> list[str]:
    seen: dict[str, str] = {}
    for r in res.values():
        if isinstance(r, dict):
            for k, v in {**r.get("versions", {}), **r.get("peer_versions", {})}.items():
                seen.setdefault(f"{k} {v}", k)
    return [f"- peer matrix versions: {', '.join(sorted(seen))}"] if seen else []


def wait_note(started: float) -> str:
    return f"- peer matrix: {time.perf_counter() - started:.0f} s"
