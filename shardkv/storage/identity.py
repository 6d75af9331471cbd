"""The identity of a base store, as a write-back journal records it.

A journal is only ever replayed into the store whose writes it holds. A
location alone cannot tell a copy of a directory from the original, so each
store also carries a random *store id*, kept beside the data under
:data:`STORE_ID_KEY` (hidden, never listed) and created on first use.
"""

from __future__ import annotations

import uuid

from shardkv.storage.kv import LOCK_DIR, NO_VALUE, KVStore

STORE_ID_KEY = f"{LOCK_DIR}/store-id"
"""Key (in the store root, never listed) of the random id that ties a write-back journal to its store."""


def store_identity(kv: KVStore, layout: str) -> dict[str, str]:
    """``{"location": "<namespace>:<root>", "store_id": <hex>, "layout": layout}`` of the store ``kv``.

    A missing store id is created only if the key is still absent (a racing
    creator that wins is read back and used). Store errors (``OSError``) propagate.
    """
    location = kv.location
    where = ":".join(map(str, location.namespace)) + ":" + location.root
    found = kv.get(STORE_ID_KEY)
    if not found.found:
        kv.put(STORE_ID_KEY, uuid.uuid4().hex.encode(), if_generation=NO_VALUE)  # None: another creator won
        found = kv.get(STORE_ID_KEY)
        if not found.found:
            raise OSError(f"store id {STORE_ID_KEY!r} of the store at {where!r} was written but cannot be read back")
    store_id = bytes(memoryview(found.whole()).cast("B")).decode("ascii", "replace")
    return {"location": where, "store_id": store_id, "layout": layout}
