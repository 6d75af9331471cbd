"""Which shardkv functions, in which files, one call runs (``sys.setprofile`` on every thread)."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable

import shardkv
import shardkv.transformers

PACKAGES = tuple(os.path.dirname(m.__file__ or "") + os.sep for m in (shardkv, shardkv.transformers))
INLINED = {"<listcomp>", "<dictcomp>", "<setcomp>"}
"""Comprehensions: their own code objects before Python 3.12, inlined into their function since (PEP 709)."""


def functions_called(call: Callable[[], object]) -> set[tuple[str, int, str]]:
    """``(file, first line, name)`` of every shardkv function ``call`` runs, on any thread."""
    seen: set[tuple[str, int, str]] = set()

    def profile(frame, event, arg):  # type: ignore[no-untyped-def]
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(PACKAGES) and code.co_name not in INLINED:
            seen.add((code.co_filename, code.co_firstlineno, code.co_name))

    if sys.version_info >= (3, 12):
        threading.setprofile_all_threads(profile)
    else:
        sys.setprofile(profile)
    try:
        call()
    finally:
        if sys.version_info >= (3, 12):
            threading.setprofile_all_threads(None)
        else:
            sys.setprofile(None)
    return seen


def describe(seen: set[tuple[str, int, str]]) -> str:
    """The functions by file, for an assertion message."""
    return "\n".join(f"{os.path.relpath(f)}:{line} {name}" for f, line, name in sorted(seen))
