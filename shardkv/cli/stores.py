"""Opening the stores named on the command line: URLs, storage options, one-line errors.

Every command that takes a store takes ``--storage-options JSON`` (a JSON
object passed to fsspec, e.g. ``{"anon": false, "client_kwargs":
{"endpoint_url": "http://127.0.0.1:9000"}}`` for an S3-compatible server).
:func:`open_store` checks the store can be used before any work starts:

* on object stores with buckets (``s3://``, ``gs://``, ``az://`` ...) it lists
  the bucket once, so a missing endpoint, a missing bucket, missing or wrong
  credentials and a denied permission are reported as one line naming the URL
  (:class:`~shardkv.cli.errors.StoreAccessError`); a bucket is never created.
  Missing or refused credentials are called that ("credentials"), not an
  unreachable store. The probe of an S3 store is made with connect retries
  capped (:data:`PROBE_CONFIG`), so a wrong endpoint fails in seconds rather
  than after s3fs's and botocore's retries (about 50 connections, 45 s);
  the work itself keeps the usual retries;
* a missing fsspec backend (``s3fs`` not installed) is reported the same way.

Errors raised later by the backend (a connection dropped half way) are
translated by :func:`store_errors` / :func:`describe` in ``shardkv.cli.main``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from shardkv.cli.errors import DestinationIsFileError, StoreAccessError
from shardkv.errors import ConfigurationError

if TYPE_CHECKING:
    import fsspec

    from shardkv.storage.kv import KVStore

__all__ = [
    "parse_storage_options",
    "open_store",
    "store_errors",
    "describe",
    "is_url",
    "refuse_regular_file",
    "put_all",
    "delete_all",
    "remove_everything",
]

PROBE_CONFIG = {"connect_timeout": 5, "read_timeout": 20, "retries": {"max_attempts": 1, "mode": "standard"}}
"""botocore configuration of the first probe of an S3 store (one attempt, 5 s to connect)."""

_CREDENTIAL_SIGNS = (
    "credentials",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "AuthorizationHeaderMalformed",
    "TokenRefreshRequired",
)
"""Words of backend errors that mean missing, wrong or expired credentials."""


def parse_storage_options(text: str) -> dict[str, Any]:
    """Parse ``--storage-options``: a JSON object (``'{"anon": true}'``).

    Raises
    ------
    ConfigurationError
        If ``text`` is not JSON, or not a JSON object.
    """
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigurationError(f"storage options must be a JSON object, got {text!r} ({exc})") from None
    if not isinstance(value, dict):
        raise ConfigurationError(f"storage options must be a JSON object like '{{\"anon\": true}}', got {text!r}")
    return value


def is_url(name: str) -> bool:
    """True when ``name`` names a non-local fsspec protocol (``s3://...``, ``memory://...``)."""
    return "://" in name and not name.startswith("file://")


def store_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean a store could not be used (backends' own types included when installed)."""
    types: list[type[BaseException]] = [OSError]
    try:
        from botocore.exceptions import BotoCoreError, ClientError

        types += [BotoCoreError, ClientError]
    except ImportError:
        pass
    try:
        from aiohttp import ClientError as AiohttpClientError

        types.append(AiohttpClientError)
    except ImportError:
        pass
    return tuple(types)


def describe(exc: BaseException) -> str:
    """One line for a backend error: its message on one line, or its type name when it has none."""
    text = " ".join(str(exc).split())
    name = type(exc).__name__
    if not text:
        return name
    return text if isinstance(exc, ConfigurationError) or name in text else f"{text} ({name})"


def refuse_regular_file(name: str) -> None:
    """Refuse a local destination that is a regular file (never deleted, not even with ``--overwrite``).

    Raises
    ------
    DestinationIsFileError
        If ``name`` is a local path (or ``file://`` URL) of an existing regular file.
    """
    if is_url(name):
        return
    path = name[len("file://") :] if name.startswith("file://") else name
    if os.path.isfile(path):
        raise DestinationIsFileError(name)


def open_store(name: Any, storage_options: Mapping[str, Any] | None = None, *, role: str = "store") -> KVStore:
    """Open a store named on the command line, checking first that it can be used.

    Parameters
    ----------
    name : str or store
        A local path or an fsspec URL; anything else is passed to
        :func:`shardkv.storage.open.open_kv` unchecked.
    storage_options : mapping, optional
        fsspec options for the URL's filesystem (endpoint, credentials ...).
    role : str
        How to call the store in messages (``"source"``, ``"destination"``).

    Returns
    -------
    KVStore
        What the command reads, lists and writes (the proxies are given it too).

    Raises
    ------
    StoreAccessError
        If the backend package is missing, the options are refused, or (object
        stores) the endpoint, bucket, credentials or permission fail when the
        bucket is listed. The bucket is never created.
    """
    # the stores' modules (and fsspec) are imported here, not by every command's parser; a local
    # directory needs neither fsspec nor the other stores
    from shardkv.storage.local import LocalStore

    options = dict(storage_options or {})
    if isinstance(name, str) and not options and not is_url(name) and not name.startswith("file:") and "::" not in name:
        return LocalStore(_local_root(name))  # what fsspec's local file system gives (kv_of_fs)
    import fsspec

    from shardkv.storage.fsspec import BUCKET_PROTOCOLS
    from shardkv.storage.open import kv_of_fs, open_kv

    if not isinstance(name, str):
        return open_kv(name, storage_options)

    try:
        fs, root = fsspec.core.url_to_fs(name, **options)
    except ImportError as exc:
        raise StoreAccessError(name, f"cannot open the {role}: {describe(exc)}") from None
    except (TypeError, ValueError) as exc:
        raise StoreAccessError(name, f"storage options {options} refused: {describe(exc)}") from None
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    if BUCKET_PROTOCOLS.intersection(protocols):
        _check_bucket(_probe_fs(fs, options), root, name, role)
    return kv_of_fs(fs, root)


def _local_root(name: str) -> str:
    """The directory a local path names, made absolute as fsspec's local file system makes it (not normalised)."""
    if name.startswith("~"):
        return os.path.expanduser(name)
    return name if os.path.isabs(name) else os.path.join(os.getcwd(), name)


def _probe_fs(fs: fsspec.AbstractFileSystem, options: Mapping[str, Any]) -> fsspec.AbstractFileSystem:
    """A filesystem for the first probe: for S3, a separate instance with connect retries capped."""
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    if "s3" not in protocols:
        return fs
    probe_options = dict(options)
    probe_options["config_kwargs"] = {**PROBE_CONFIG, **dict(options.get("config_kwargs") or {})}
    try:
        probe = type(fs)(**probe_options, skip_instance_cache=True)
    except (TypeError, ValueError):
        return fs  # options the backend refuses are reported by the probe with the usual instance
    probe.retries = 1  # s3fs's own retry loop around botocore's
    return probe


def _is_credentials_error(exc: BaseException) -> bool:
    """True when ``exc`` or an error it was raised from names missing, unknown or expired credentials.

    The cause is read too: s3fs turns botocore's ``InvalidAccessKeyId`` (a key the server does
    not know) into a ``PermissionError`` whose message names no code, with the botocore error,
    which does, as its ``__cause__``; it is not a denied permission.
    """
    seen: BaseException | None = exc
    for _ in range(8):  # a chain of causes, bounded
        if seen is None:
            return False
        text = f"{type(seen).__name__} {seen}"
        if any(sign in text for sign in _CREDENTIAL_SIGNS):
            return True
        seen = seen.__cause__
    return False


def _check_bucket(fs: fsspec.AbstractFileSystem, root: str, name: str, role: str) -> None:
    """List the bucket once (never create it); any failure becomes one StoreAccessError."""
    bucket = root.strip("/").split("/", 1)[0]
    if not bucket:
        raise StoreAccessError(name, f"the {role} URL names no bucket")
    try:
        fs.ls(bucket, detail=False)
    except FileNotFoundError:
        raise StoreAccessError(
            name, f"bucket {bucket!r} does not exist (shardkv never creates a bucket: create it first)"
        ) from None
    except TypeError as exc:  # backends check their options when they first connect
        raise StoreAccessError(name, f"storage options refused: {describe(exc)}") from None
    except store_errors() as exc:
        if _is_credentials_error(exc):
            raise StoreAccessError(
                name,
                f"credentials for the {role} are missing or refused: {describe(exc)} (give key/secret or a "
                "profile in --storage-options, or set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)",
            ) from None
        if isinstance(exc, PermissionError):
            raise StoreAccessError(name, f"access to bucket {bucket!r} denied: {describe(exc)}") from None
        raise StoreAccessError(name, f"cannot reach the {role}: {describe(exc)}") from None
    finally:
        fs.invalidate_cache(bucket)


# -- writing through a KVStore ------------------------------------------------------------

_DELETE_BATCH = 256  # keys deleted per batched request when a destination is emptied


def put_all(kv: KVStore, values: Mapping[str, Any]) -> None:
    """Store ``values`` (bytes-like, or lists of parts) unconditionally, in one batch."""
    from shardkv.storage.kv import ANY

    if values:
        kv.put_many({key: (value, ANY) for key, value in values.items()})


def delete_all(kv: KVStore, keys: Iterable[str]) -> None:
    """Delete ``keys`` unconditionally (missing ones are no error), in batches."""
    from shardkv.storage.kv import ANY

    batch: list[str] = []
    for key in keys:
        batch.append(key)
        if len(batch) >= _DELETE_BATCH:
            kv.put_many({k: (None, ANY) for k in batch})
            batch = []
    if batch:
        kv.put_many({k: (None, ANY) for k in batch})


def remove_everything(kv: KVStore) -> None:
    """Delete every key of ``kv`` (``--overwrite``), then the directories left empty where it has directories.

    Lock files (which writers in other processes may hold) and temporary files
    are not keys: they stay (the temporaries of killed writers are swept by
    :func:`shardkv.proxy.verify.remove_stale_temporaries`).
    """
    delete_all(kv, list(kv.list_prefix("")))
    prune = getattr(kv, "prune_empty_dirs", None)  # local directories only
    if prune is not None:
        prune("")
