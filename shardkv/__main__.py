"""``python -m shardkv``: the command line (see :mod:`shardkv.cli.main`)."""

from __future__ import annotations

from shardkv.cli.main import main

raise SystemExit(main())
