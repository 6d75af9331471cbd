"""``python -m shardkv``: the command line (see :mod:`shardkv.cli`)."""

from __future__ import annotations

from .cli import main

raise SystemExit(main())
