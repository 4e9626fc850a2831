"""moto's S3 server for the tests, with conditional writes made atomic.

    python tests/moto_s3.py HOST PORT [--raw-dynamodb]

moto 5.2 checks ``If-Match`` / ``If-None-Match`` and stores the object in two
steps, and its server is threaded, so two racing conditional PUTs of one key
can both succeed. AWS S3 evaluates the condition atomically (documented since
2024), and the S3 store (heads) and its leases rely on that: with many writers
racing one lease object, moto's window lost queue entries and granted a lease
twice. This runs the same moto application over real HTTP, but serializes the
requests that carry a condition (every other request stays concurrent).

The same server speaks DynamoDB. moto 5.2 evaluates a DynamoDB condition and
applies the write (or a transaction's items, one by one) without a lock, where
DynamoDB evaluates conditions atomically and isolates transactions
(serializable), so DynamoDB requests are serialized too (see docs/backends.md;
tests/test_dynamodb.py runs a race on an unserialized server: --raw-dynamodb).

moto 5.2 also backs a transaction up by deep-copying its table once per action
(100 copies of the whole table for a 100-action transaction), which made
transactions on a table of a few thousand items take seconds and pushed tests
past the client's read timeout. ``_copy_each_table_once`` makes it one copy per
table per transaction: the same backup, the same rollback.
"""

from __future__ import annotations

import copy
import ctypes
import functools
import os
import signal
import sys
import threading
import types
from collections.abc import Callable, Iterable
from typing import Any

import moto.backends as moto_backends
import moto.dynamodb.models as dynamodb_models
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import run_simple

_CONDITIONAL = threading.Lock()
_IN_TRANSACTION = threading.local()


def _deepcopy(obj: Any, memo: dict[int, Any] | None = None) -> Any:
    """``copy.deepcopy``, except that inside a transaction a table is copied once."""
    copies: dict[int, Any] | None = getattr(_IN_TRANSACTION, "copies", None)
    if copies is None or not isinstance(obj, dynamodb_models.Table):
        return copy.deepcopy(obj, memo)
    if id(obj) not in copies:
        copies[id(obj)] = copy.deepcopy(obj)
    return copies[id(obj)]


def _copy_each_table_once() -> None:
    backend = dynamodb_models.DynamoDBBackend
    original = backend.transact_write_items

    def transact_write_items(self: Any, transact_items: Any) -> None:
        _IN_TRANSACTION.copies = {}
        try:
            original(self, transact_items)
        finally:
            _IN_TRANSACTION.copies = None

    backend.transact_write_items = transact_write_items  # type: ignore[method-assign]
    dynamodb_models.copy = types.SimpleNamespace(deepcopy=_deepcopy)  # type: ignore[assignment]


def _dispatch_once_per_host() -> None:
    """Find a request's backend from a table, not from the disk.

    moto 5.2 finds the backend of every request by listing its own package directory
    (``os.listdir`` and an ``isdir`` per module, ~250) and matching ~300 URL patterns, all
    under one lock: a third of the server's time in the S3 tests. The answer depends only
    on the host the request names, so it is computed once per host.
    """
    modules = tuple(moto_backends.list_of_moto_modules())
    moto_backends.list_of_moto_modules = lambda: modules
    lookup = functools.lru_cache(maxsize=None)(DomainDispatcherApplication.get_backend_for_host)
    DomainDispatcherApplication.get_backend_for_host = lookup  # type: ignore[method-assign]


class _QuietHandler(MotoRequestHandler):
    """moto's handler without werkzeug's line per request (a tenth of the server's time in a
    logger the tests never read); errors are still logged. HTTP/1.0 as before: keep-alive
    (HTTP/1.1) measured within noise of it (the S3 tests are bound by botocore and by listings)."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass


def _die_with_the_parent() -> None:
    """Ask Linux to end this server when the process that started it dies: a pytest worker
    that crashed never ran the fixture that stops it, and its server lived on (Linux only)."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the request: nobody will stop us
        sys.exit(0)


def main() -> None:
    _die_with_the_parent()
    host, port = sys.argv[1], int(sys.argv[2])
    serialize_dynamodb = "--raw-dynamodb" not in sys.argv[3:]
    _copy_each_table_once()
    _dispatch_once_per_host()
    app = DomainDispatcherApplication(create_backend_app)

    def atomic(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        conditional = "HTTP_IF_MATCH" in environ or "HTTP_IF_NONE_MATCH" in environ
        if conditional or (serialize_dynamodb and environ.get("HTTP_X_AMZ_TARGET", "").startswith("DynamoDB_")):
            with _CONDITIONAL:
                return list(app(environ, start_response))
        return app(environ, start_response)  # type: ignore[no-any-return]

    run_simple(host, port, atomic, threaded=True, request_handler=_QuietHandler)


if __name__ == "__main__":
    main()
