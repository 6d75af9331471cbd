"""moto's S3 server with S3's guarantees for conditional writes: the one way the tests and benchmarks start it.

S3 decides every conditional write atomically: of writers conditioned on one
ETag at most one wins, the others get ``412 Precondition Failed`` (or ``409
ConditionalRequestConflict``). moto (5.2) does not:

* ``PutObject`` and ``DeleteObject`` check ``If-Match`` / ``If-None-Match``
  in ``S3Response`` (``moto/s3/responses.py``) and store afterwards with no
  lock, while ``ThreadedMotoServer`` serves each request in a thread of its
  own: two PUTs conditioned on one ETag can both win (a lost update);
* ``CompleteMultipartUpload`` (``S3Response._key_response_post``) ignores
  ``If-Match`` (and checks ``If-None-Match: *`` without a lock): a stale
  complete silently replaces another writer's object;
* ``UploadPartCopy`` (``S3Response.upload_part_copy``) ignores
  ``x-amz-copy-source-if-match``: a part copied from a source replaced
  since is copied from the new source.

:func:`install` (idempotent, for the rest of the process: every moto server
it serves then behaves) wraps those handlers, and ``CopyObject``, under one
process-wide lock, and adds the two missing checks with moto's own errors.
:func:`start_server` installs it and starts a ``ThreadedMotoServer`` on
127.0.0.1. Every moto server of ``tests/`` and ``benchmarks/`` comes from
here (``tests/test_moto_strict.py`` proves the server refuses the losers).
"""

from __future__ import annotations

import functools
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

__all__ = ["install", "start_server", "free_port", "widened_races", "Exchange", "Wire"]

_LOCK = threading.RLock()  # one for every write handler: handlers call each other (put -> copy_object)
_GUARD = threading.Lock()
_INSTALLED: list[bool] = []
_WRITE_HANDLERS = ("put_object", "copy_object", "delete_object", "upload_part_copy", "_key_response_post")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bare(etag: str) -> str:
    return etag.replace('"', "")


def _check_copy_source(response: Any) -> None:
    """``x-amz-copy-source-if-match`` / ``-if-none-match`` of an ``UploadPartCopy``, as S3 checks them (412)."""
    from moto.s3.exceptions import PreconditionFailed

    source = response.headers.get("x-amz-copy-source")
    if isinstance(source, bytes):
        source = source.decode("utf-8")
    if not source:
        return
    parsed = urlparse(source)
    bucket, _, key = unquote(parsed.path).lstrip("/").partition("/")
    version = parse_qs(parsed.query).get("versionId", [None])[0]
    stored = response.backend.get_object(bucket, key, version_id=version)
    if stored is None:
        return  # moto answers 404
    if_match = response.headers.get("x-amz-copy-source-if-match")
    if if_match is not None and _bare(if_match) != _bare(stored.etag):
        raise PreconditionFailed("x-amz-copy-source-If-Match")
    if_none_match = response.headers.get("x-amz-copy-source-if-none-match")
    if if_none_match is not None and _bare(if_none_match) == _bare(stored.etag):
        raise PreconditionFailed("x-amz-copy-source-If-None-Match")


def _check_complete(response: Any, request: Any, body: bytes, bucket: str, query: dict[str, Any], key: str) -> None:
    """``If-Match`` of a ``CompleteMultipartUpload``, as S3 checks it (412; 404 when nothing is stored)."""
    from moto.s3.exceptions import MissingKey, PreconditionFailed

    upload_id = (query.get("uploadId") or [None])[0]
    if_match = request.headers.get("If-Match")
    if upload_id is None or "uploads" in query or if_match is None:
        return
    stored = response.backend.get_object(bucket, key)
    if stored is not None and stored.multipart is not None and stored.multipart.id == upload_id:
        return  # this upload's own object: moto answers a repeated complete idempotently
    if stored is None:
        raise MissingKey(key)
    if _bare(if_match) != _bare(stored.etag):
        raise PreconditionFailed("If-Match")


def install() -> None:
    """Make this process's moto S3 decide conditional writes as S3 does (see the module docstring). Idempotent."""
    from moto.s3.responses import S3Response

    with _GUARD:
        if _INSTALLED:
            return
        for name in _WRITE_HANDLERS:
            if name not in S3Response.__dict__:
                raise RuntimeError(f"moto's S3Response has no {name!r} any more: update tests/moto_strict.py")
        originals = {name: S3Response.__dict__[name] for name in _WRITE_HANDLERS}

        def locked(name: str) -> Any:
            method = originals[name]

            @functools.wraps(method)
            def handler(self: Any, *args: Any, **kwargs: Any) -> Any:
                with _LOCK:
                    if name == "upload_part_copy":
                        _check_copy_source(self)
                    elif name == "_key_response_post":
                        _check_complete(self, *args, **kwargs)
                    return method(self, *args, **kwargs)

            return handler

        for name in _WRITE_HANDLERS:
            setattr(S3Response, name, locked(name))
        _INSTALLED.append(True)


def start_server(port: int | None = None) -> tuple[Any, str]:
    """A started ``ThreadedMotoServer`` on 127.0.0.1 (``port``, default a free one) with :func:`install`'s
    guarantees; and its endpoint URL. Stop it with ``server.stop()``."""
    from moto.server import ThreadedMotoServer

    install()
    port = free_port() if port is None else port
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    return server, f"http://127.0.0.1:{port}"


@contextmanager
def widened_races(pause_s: float = 0.002) -> Iterator[None]:
    """A pause in moto's store step (``S3Backend.put_object``, after a handler checked its conditions) while
    the block runs: writers that a lock-free check lets through then overlap nearly every time. It widens
    a window only: no result may depend on the pause's length."""
    from moto.s3.models import S3Backend

    real = S3Backend.__dict__["put_object"]

    @functools.wraps(real)
    def put_object(self: Any, *args: Any, **kwargs: Any) -> Any:
        time.sleep(pause_s)
        return real(self, *args, **kwargs)

    S3Backend.put_object = put_object  # type: ignore[method-assign]
    try:
        yield
    finally:
        S3Backend.put_object = real  # type: ignore[method-assign]


@dataclass(frozen=True)
class Exchange:
    """One HTTP exchange as the server saw it: bytes of the request body read (up) and of the response body (down)."""

    method: str
    path: str
    query: str
    status: int
    up: int
    down: int
    headers: dict[str, str]  # the request's conditions and ranges (If-Match, Range, x-amz-copy-source-*)

    @property
    def operation(self) -> str:
        """S3's name of the request (the few that shardkv sends)."""
        q, m = self.query, self.method
        if "uploadId=" in q and "partNumber=" in q:
            return "UploadPartCopy" if "x-amz-copy-source" in self.headers else "UploadPart"
        if m == "POST":
            return "CreateMultipartUpload" if "uploads" in q and "uploadId=" not in q else "CompleteMultipartUpload"
        if m == "DELETE":
            return "AbortMultipartUpload" if "uploadId=" in q else "DeleteObject"
        if m == "GET" and ("list-type" in q or "prefix=" in q or "delimiter=" in q or "uploads" in q):
            return "List"
        return {"GET": "GetObject", "HEAD": "HeadObject", "PUT": "PutObject"}.get(m, m)


class _Counted:
    """A WSGI input stream that counts the bytes read from it."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.nbytes = stream, 0

    def read(self, *args: Any) -> bytes:
        data = self.stream.read(*args)
        self.nbytes += len(data)
        return bytes(data)

    def readline(self, *args: Any) -> bytes:
        data = self.stream.readline(*args)
        self.nbytes += len(data)
        return bytes(data)

    def __iter__(self) -> Any:
        return iter(self.readline, b"")


_KEPT_HEADERS = ("HTTP_IF_MATCH", "HTTP_IF_NONE_MATCH", "HTTP_RANGE", "HTTP_X_AMZ_COPY_SOURCE")
_KEPT_HEADERS += ("HTTP_X_AMZ_COPY_SOURCE_RANGE", "HTTP_X_AMZ_COPY_SOURCE_IF_MATCH")


class Wire:
    """A WSGI layer in front of a started server's application that records every exchange, in order."""

    def __init__(self, server: Any) -> None:
        wsgi = getattr(server, "_server", None)  # moto 5's werkzeug server; its handler reads .app per request
        if wsgi is None or not hasattr(wsgi, "app"):
            raise RuntimeError("moto's ThreadedMotoServer no longer exposes its werkzeug server (_server.app)")
        self.app: Callable[..., Any] = wsgi.app
        wsgi.app = self
        self.seen: list[Exchange] = []
        self._lock = threading.Lock()

    def take(self) -> list[Exchange]:
        """The exchanges recorded since the last call."""
        with self._lock:
            out, self.seen = self.seen, []
        return out

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        status: list[int] = []
        counted = environ["wsgi.input"] = _Counted(environ["wsgi.input"])

        def recording(line: str, headers: Any, exc_info: Any = None) -> Any:
            status.append(int(line.split(" ", 1)[0]))
            return start_response(line, headers, exc_info)

        answer = self.app(environ, recording)
        try:
            body = b"".join(answer)
        finally:
            if hasattr(answer, "close"):
                answer.close()
        method = environ["REQUEST_METHOD"]
        kept = {k[5:].replace("_", "-").lower(): str(environ[k]) for k in _KEPT_HEADERS if k in environ}
        exchange = Exchange(
            method,
            environ.get("PATH_INFO", ""),
            environ.get("QUERY_STRING", ""),
            status[-1] if status else 0,
            counted.nbytes,
            0 if method == "HEAD" else len(body),
            kept,
        )
        with self._lock:
            self.seen.append(exchange)
        return [body]
