"""Where the CLI's store comes from, and how it reads it without changing it.

The URL is ``--url``, else ``$PERSISTKIT_URL``, else the default SQLite file;
a first positional argument holding ``://`` is accepted as the URL too (the
form before ``--url`` existed). Every verb but ``migrate`` and ``import`` opens an EXISTING
store: a missing SQLite file, or a database without persistkit's tables, is
a :class:`NotFoundError` that names the URL, and nothing is created.
Values are shown as plain JSON, never revived as classes, so a state holding
a pydantic model of the user's program prints without that program.

An encrypted or integrity-protected store opens as ``persistkit verify`` opens
it: with ``$PERSISTKIT_ENCRYPTION_KEYS`` set, every verb opens the store with
``encryption=True`` (the keys from that variable), with ``$PERSISTKIT_INTEGRITY_KEYS``
set, with ``integrity=True``, unless the URL's own ``?encryption=`` /
``?integrity=`` (or a verb's flag) says otherwise.
"""

from __future__ import annotations

import os
from typing import Any

from .._errors import ConfigurationError, NotFoundError
from .._io import call
from ..backends import Backend, backend_class, mask_url, split_connect_options
from ..codec._plain import PlainCodec, plain
from ..engine._store import DEFAULT_URL, Store, check_namespace, check_thread_id, connect

__all__ = [
    "KEY_VARIABLES",
    "env_keys",
    "namespaces",
    "open_store",
    "plain",
    "require_store",
    "require_thread",
    "resolve_url",
    "split_url",
    "thread_not_found",
]


def split_url(args: list[str]) -> tuple[str | None, list[str]]:
    """A leading store URL (anything with ``://``) and the remaining positional arguments."""
    if args and "://" in args[0]:
        return args[0], args[1:]
    return None, args


def resolve_url(given: str | None) -> str:
    return given or os.environ.get("PERSISTKIT_URL") or DEFAULT_URL


def _where(url: str) -> str:
    source = "" if os.environ.get("PERSISTKIT_URL") != url else " (from $PERSISTKIT_URL)"
    return f"{mask_url(url)}{source}"


def _sqlite_path(url: str) -> str:
    rest = url.partition("://")[2]
    return rest[1:].partition("?")[0]


def open_store(url: str, *, create: bool = False, display: bool = False, **options: Any) -> Store:
    """The store at ``url``; unless ``create``, only if it already exists (nothing is created).
    ``display``: decode values to plain JSON (:func:`plain`), for printing."""
    if create:
        if url.partition("://")[0].lower() == "dynamodb":
            options = {"create": True, **options}  # as `migrate` and `dynamodb create-table` do
        return connect(url, **options)
    options = {**env_keys(url), **options}
    if require_store(url):
        options = {**options, "migrate": False}
    store = connect(url, **options)
    if display:
        store.codec = PlainCodec.like(store.codec)
    return store


#: The environment variables that make every verb open the store with its keys.
KEY_VARIABLES = {"encryption": "PERSISTKIT_ENCRYPTION_KEYS", "integrity": "PERSISTKIT_INTEGRITY_KEYS"}


def env_keys(url: str) -> dict[str, Any]:
    """``encryption=True`` / ``integrity=True`` for each key variable that is set, unless
    the URL names that option itself: the store opens with the keys it was written with."""
    in_url = split_connect_options(url)[1]
    return {opt: True for opt, var in KEY_VARIABLES.items() if opt not in in_url and os.environ.get(var)}


def require_store(url: str) -> bool:
    """Raise :class:`NotFoundError` unless a store exists at ``url``, creating
    nothing; True for stores whose tables are managed by ``migrate`` (open
    them with ``migrate=False``)."""
    cls = backend_class(url)
    url = split_connect_options(url)[0]  # pk.connect()'s own options are not the store's
    if url.partition("://")[0].lower() == "sqlite":
        path = _sqlite_path(url)
        if path and not os.path.isfile(path):
            raise NotFoundError(
                f"no store at {_where(url)}: the file {os.path.abspath(path)} does not exist. "
                "Pass the store's URL with --url or set $PERSISTKIT_URL"
            )
    elif hasattr(cls, "migrate"):
        # Stores that create their tables on open (PostgreSQL): open without
        # migrating, and only if persistkit's tables are there.
        backend = cls.from_url(url, migrate=False)
        try:
            status = backend.migrate(check=True)  # type: ignore[attr-defined]
        except ConfigurationError as exc:
            if not getattr(exc, "missing_database", False):
                raise
            # a mistyped database name is no store there, as a mistyped schema is (exit 3)
            raise NotFoundError(f"no store at {_where(url)}: {exc}") from None
        finally:
            backend.close()
        if not status.current:
            raise NotFoundError(
                f"no store at {_where(url)}: schema {status.schema!r} has no persistkit tables. "
                "Check the URL (and its ?schema=), or create the store with `persistkit migrate URL`"
            )
        return True
    elif hasattr(cls, "has_data"):
        # Stores without tables or files (Redis, S3) exist once something is stored under
        # their prefix: an empty prefix is a fresh store or a typo, and a reader gets nothing.
        backend = open_existing(cls, url)
        try:
            found = backend.has_data()  # type: ignore[attr-defined]
        finally:
            backend.close()
        if not found:
            raise NotFoundError(
                f"no store at {_where(url)}: nothing is stored "
                f"{'in its table' if url.partition('://')[0].lower() == 'dynamodb' else 'under its prefix'}. Check the URL "
                f"({_PREFIX_HINT.get(url.partition('://')[0].lower(), 'its prefix')}); a store whose "
                "threads were all deleted holds nothing either"
            )
    return False


def open_existing(cls: type[Backend], url: str) -> Backend:
    """``cls.from_url(url)``; a DynamoDB table that does not exist is no store either
    (``NotFoundError``, exit 3), where ``pk.connect`` says how to create it."""
    try:
        return cls.from_url(url)
    except ConfigurationError as exc:
        if getattr(exc, "missing_table", None) is None:
            raise
        raise NotFoundError(f"no store at {_where(url)}: {exc}") from None


_PREFIX_HINT = {
    "redis": "its ?prefix=, 'persistkit:' when not given, and the database number after the port",
    "rediss": "its ?prefix=, 'persistkit:' when not given, and the database number after the port",
    "s3": "the bucket and the prefix after it",
    "dynamodb": "the table name, and its endpoint_url and region",
}


def require_thread(store: Store, thread_id: str, namespace: str = "") -> None:
    """Raise :func:`thread_not_found` unless the thread has a head in ``namespace``."""
    check_thread_id(thread_id)
    check_namespace(namespace)
    if store.call_sync(call("head", thread_id, namespace)) is None:
        raise thread_not_found(store, thread_id, namespace)


def namespaces(store: Store, thread_id: str) -> list[str] | None:
    """The thread's namespaces, or None when the store cannot list them."""
    try:
        return store.backend.namespaces(thread_id)
    except ConfigurationError:  # a store without this maintenance primitive
        return None


def thread_not_found(store: Store, thread_id: str, namespace: str = "") -> NotFoundError:
    """The one error every verb gives for a thread the store does not have."""
    where = f" in namespace {namespace!r}" if namespace else ""
    hint = "List the store's threads with `persistkit threads`"
    spaces = [ns for ns in namespaces(store, thread_id) or () if ns != namespace]
    if spaces:
        shown = ", ".join(repr(ns) for ns in spaces[:5])
        hint = f"It is stored under namespace(s) {shown}: pass --namespace {spaces[0]!r}"
    return NotFoundError(f"thread {thread_id!r} not found{where} in the store at {_where(store.url)}. {hint}")
