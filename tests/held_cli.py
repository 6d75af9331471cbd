"""The ``shardkv`` command line with its work held after a chosen number of finished shards.

The tests that interrupt ``convert`` or ``unshard`` (Ctrl-C, ``kill``) must never race the
signal against the work: on a busy machine a small job finishes first, on an idle one a
large job takes minutes. Run as a script, this module runs the command line in its own
process with the progress manifest changed in two ways:

* every finished shard the manifest records is written to the destination at once (not
  every 0.5 s), so the manifest on disk says exactly what finished;
* after the ``N``-th record the process prints ``held`` on stdout and then reads its stdin
  until the test closes it: the test interrupts the command there, at a known point.

::

    python tests/held_cli.py N COMMAND ARGS...

:func:`start_held` starts it and returns once the command is held. With ``--workers`` the
hold is in the main process (where the manifest is kept): the worker processes finish the
tasks they were given and wait for more.
"""

from __future__ import annotations

import select
import subprocess
import sys
from pathlib import Path
from typing import Any

HELD = "held"
WAIT_SECONDS = 240.0  # the longest a test waits for the command to reach its hold


def start_held(n_shards: int, *args: str, **popen: Any) -> subprocess.Popen:
    """Start ``shardkv ARGS`` held after ``n_shards`` finished shards; return once it is held.

    Raises
    ------
    AssertionError
        If the command ended (or said nothing) before it recorded ``n_shards`` shards.
    """
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__)), str(n_shards), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], WAIT_SECONDS)
    line = proc.stdout.readline().strip() if ready else ""
    if line != HELD:
        proc.kill()
        _, err = proc.communicate(timeout=60)
        raise AssertionError(f"shardkv {' '.join(args)} was not held after {n_shards} shards: {line!r}\n{err}")
    return proc


def _hold_after(n_shards: int) -> None:
    from shardkv.cli import manifest as manifest_module

    record = manifest_module.Manifest.record
    count = 0

    def record_then_hold(
        self: Any, path: str, index: int, shard_key: str, nbytes: int, nbytes_read: int, chunks: int = 0
    ) -> None:
        nonlocal count
        record(self, path, index, shard_key, nbytes, nbytes_read, chunks)
        self.flush()
        count += 1
        if count == n_shards:
            print(HELD, flush=True)
            sys.stdin.read()  # until the test closes it (or interrupts this process)

    manifest_module.Manifest.record = record_then_hold  # type: ignore[method-assign]


if __name__ == "__main__":  # not when the worker processes of --workers import this module
    import signal

    from shardkv.cli.main import main

    # Ctrl-C as at a terminal, even when the test run was started in the background, where the shell
    # ignores SIGINT and this process would inherit that (Python then installs no KeyboardInterrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _hold_after(int(sys.argv[1]))
    sys.exit(main(sys.argv[2:]))
