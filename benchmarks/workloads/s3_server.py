"""An S3-protocol server on loopback for the benchmarks (moto), logging every request.

    python benchmarks/workloads/s3_server.py --log FILE

Started and stopped by ``benchmarks/run.py``: binds ``127.0.0.1`` on a free
port, prints ``READY <port>`` on stdout once it answers, then serves until
its standard input closes (or it is killed). Every request is one line in
``FILE`` (``METHOD /path?query STATUS``), written before the response is sent,
so a workload counts the requests of a phase as the lines added during it
(:func:`count_requests`). Requests come only from this machine. The server
decides conditional writes as S3 does (one winner per ETag; ``If-Match`` on
``CompleteMultipartUpload``, ``x-amz-copy-source-if-match``), through the
tests' one helper, ``tests/moto_strict.py``: moto alone lets two conditional
writers win.
"""

from __future__ import annotations

import argparse
import logging
import re
import socket
import sys
from collections import Counter
from pathlib import Path

ACCESS_KEY = "shardkv-bench"
SECRET_KEY = "shardkv-bench-secret"
REGION = "us-east-1"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # werkzeug colours its request lines


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _RequestLog(logging.Handler):
    """Writes ``METHOD path status`` per request from werkzeug's access log records."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.file = open(path, "a", buffering=1)  # noqa: SIM115 (open for the server's lifetime)

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 2:
            request_line = _ANSI.sub("", str(args[0])).split(" ")
            if len(request_line) >= 2:
                self.file.write(f"{request_line[0]} {request_line[1]} {_ANSI.sub('', str(args[1]))}\n")


def count_requests(log_path: str, start: int) -> tuple[Counter[str], int]:
    """Requests logged in ``log_path`` after byte offset ``start``, by method; and the new offset.

    A ``GET`` whose query lists keys (``list-type``, ``prefix=``, ``delimiter=``)
    counts as ``LIST``.
    """
    counts: Counter[str] = Counter()
    with open(log_path, "rb") as f:
        f.seek(start)
        data = f.read()
    for line in data.decode().splitlines():
        parts = line.split(" ")
        if len(parts) < 2:
            continue
        method, target = parts[0], parts[1]
        if method == "GET" and ("list-type" in target or "prefix=" in target or "delimiter=" in target):
            method = "LIST"
        counts[method] += 1
    return counts, start + len(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", required=True, help="file that gets one line per request")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # moto_strict
    import moto_strict

    handler = _RequestLog(args.log)
    werkzeug = logging.getLogger("werkzeug")
    werkzeug.addHandler(handler)
    werkzeug.setLevel(logging.INFO)
    werkzeug.propagate = False  # the log file only; nothing on the terminal
    port = free_port()
    moto_strict.start_server(port)
    sys.stdout.write(f"READY {port}\n")
    sys.stdout.flush()
    sys.stdin.read()  # until the runner closes our stdin
    # then end without server.stop(): it waits out the serving loop's 0.5 s poll, and the serving
    # thread is a daemon; every request has been answered and logged (line-buffered) by then


if __name__ == "__main__":
    main()
