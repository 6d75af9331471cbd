"""Fork-and-SIGKILL helpers shared by the crash tests (strategies, write-back journal, journal file).

A child writes and logs each acknowledged write to an fsync'd file; the parent
kills it at a chosen moment, reopens the store and checks that every
acknowledged write is still there and nothing is torn.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ChildRaised", "run_and_kill", "acked_seqs", "check_chunks", "write_and_ack"]


class ChildRaised(AssertionError):
    """The forked child ended with an exception (not killed, not finished): its traceback is the message."""


def run_and_kill(target: Callable[[], None], delay: float | None) -> int:
    """Fork a child running ``target``; SIGKILL it after ``delay`` seconds unless it ended first.

    ``delay=None`` waits up to 10 s for the child to end by itself. Returns the
    child's wait status. A child that raises is a test failure, never a quiet
    round with no writes: :class:`ChildRaised` carries the child's traceback.
    """
    fd, tb_path = tempfile.mkstemp(prefix="kill-harness-", suffix=".txt")
    os.close(fd)
    try:
        pid = os.fork()
        if pid == 0:  # the child never returns into pytest
            code = 0
            try:
                target()
            except BaseException:  # handed to the parent as text, then exit status 3
                code = 3
                with open(tb_path, "w") as f:
                    traceback.print_exc(file=f)
            os._exit(code)  # no flush, no close: as abrupt as a kill for any buffer
        deadline = time.monotonic() + (10.0 if delay is None else delay)
        status = None
        while time.monotonic() < deadline:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
                break
            time.sleep(0.005)
        if status is None:
            os.kill(pid, signal.SIGKILL)
            status = os.waitpid(pid, 0)[1]
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 3:
            raise ChildRaised("the forked child raised:\n" + Path(tb_path).read_text())
        return status
    finally:
        os.unlink(tb_path)


def acked_seqs(acks: Path) -> list[int]:
    """The sequence numbers a child logged as acknowledged, in order."""
    return [int(x) for x in acks.read_text().split()] if acks.exists() else []


def check_chunks(
    data: np.ndarray,
    acked: list[int],
    in_flight: set[int],
    chunk_of: Callable[[int], int],
    value_of: Callable[[int], np.ndarray],
    n_chunks: int,
) -> None:
    """Every chunk holds its last acknowledged write, or a later one that was in flight at a kill; never a mix."""
    chunk = len(data) // n_chunks
    last = {chunk_of(s): s for s in sorted(acked)}
    for c in range(n_chunks):
        got = data[c * chunk : (c + 1) * chunk]
        allowed = [value_of(last[c])] if c in last else [np.zeros(chunk, dtype=data.dtype)]
        allowed += [value_of(s) for s in in_flight if chunk_of(s) == c and s > last.get(c, -1)]
        assert any(np.array_equal(got, a) for a in allowed), (
            f"chunk {c} holds {got[:3]}...: acknowledged write lost or torn"
        )


def write_and_ack(
    z: Any,
    acks: Path,
    first_seq: int,
    seconds: float,
    chunk_of: Callable[[int], int],
    value_of: Callable[[int], np.ndarray],
    before: Callable[[], None] | None = None,
) -> None:
    """The child's loop: write chunk ``chunk_of(seq)`` of the 1-d array ``z`` for ``seconds`` (bounded),
    appending each acknowledged ``seq`` to ``acks`` with an fsync. ``before`` runs once after ``acks``
    is open (e.g. to install a fault injector)."""
    chunk = z.chunks[0]
    fd = os.open(acks, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    if before is not None:
        before()
    deadline = time.monotonic() + seconds
    for seq in range(first_seq, first_seq + 100000):
        if time.monotonic() > deadline:
            break
        c = chunk_of(seq)
        z[c * chunk : (c + 1) * chunk] = value_of(seq)
        os.write(fd, f"{seq}\n".encode())
        os.fsync(fd)
