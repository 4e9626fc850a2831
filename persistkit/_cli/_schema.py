"""``migrate``: create or upgrade a store's own tables, or check whether that is needed."""

from __future__ import annotations

import argparse
from typing import Any

from ..backends import backend_class, mask_url
from ..secrets._redact import scrub
from ._dynamodb import create
from ._open import open_existing, require_store, resolve_url
from ._output import Output

__all__ = ["add_parsers"]


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    m = sub.add_parser("migrate", parents=[common], help="create or upgrade the store's own tables",
                       description="Create or upgrade the store's tables (PostgreSQL; a DynamoDB store's table is created; other stores do it "
                       "when they open). With --check, change nothing and exit 1 when the schema is behind, "
                       "3 when there is no store at the URL.")
    m.add_argument("legacy_url", nargs="?", help=argparse.SUPPRESS)
    m.add_argument("--check", action="store_true", help="only report whether the schema is behind")
    m.add_argument("--json", action="store_true", help="print JSON instead of a sentence")
    m.set_defaults(func=_migrate)


def _migrate(ns: argparse.Namespace, out: Output) -> int:
    url = resolve_url(ns.url or ns.legacy_url)
    shown = scrub(mask_url(url))
    cls = backend_class(url)
    if url.partition("://")[0].lower() == "dynamodb":
        if ns.check:  # the table is all there is to a DynamoDB store's schema
            open_existing(cls, url).close()
            made = False
        else:
            made = create(url, "migrate")  # the store never creates its table unasked: this asks
        if out.as_json:
            out.value({"url": shown, "table_created": made, "behind": False})
        else:
            out.line(f"{shown}: " + ("table created" if made else "the table exists; nothing to do"))
        return 0
    if ns.check:
        require_store(url)  # a check creates nothing: no store there is "not found" (exit 3)
    if not hasattr(cls, "migrate"):
        if out.as_json:
            out.value({"url": shown, "managed_on_open": True, "behind": False})
        else:
            out.line(f"{shown}: this store creates and upgrades its tables when it opens; nothing to do")
        return 0
    backend = cls.from_url(url, migrate=False)  # open without migrating, then decide
    try:
        status = backend.migrate(check=ns.check)  # type: ignore[attr-defined]
    finally:
        backend.close()
    if out.as_json:
        out.value({"url": shown, "schema": status.schema, "current": status.current, "target": status.target,
                   "applied": list(status.applied), "behind": status.behind, "ahead": status.ahead})
    elif status.behind:
        have = f"at version {status.current}" if status.current else "not created yet"
        out.line(f"{shown}: schema {status.schema!r} is {have}; this persistkit needs version "
                 f"{status.target}. Run `persistkit migrate --url {shown}` to upgrade it")
    elif status.applied:
        out.line(f"{shown}: schema {status.schema!r} upgraded to version {status.current} "
                 f"(applied {', '.join(map(str, status.applied))})")
    else:
        newer = " (written by a newer persistkit, which this one still reads)" if status.ahead else ""
        out.line(f"{shown}: schema {status.schema!r} is up to date at version {status.current}{newer}")
    return 1 if ns.check and status.behind else 0
