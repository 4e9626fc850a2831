"""Scratch stores for a benchmark that compares SQLite, PostgreSQL and Redis in one run.

``scratch_stores("msg")`` gives ``(name, url, drop)`` for a SQLite file in a new temporary
folder, a PostgreSQL schema ``pkbench_msg_<tag>`` and a Redis prefix ``pkbench-msg-<tag>:``
(``drop()`` removes the schema or the keys; None for SQLite). PostgreSQL is
``$PERSISTKIT_TEST_POSTGRES`` or 127.0.0.1:5432/test, Redis ``$PERSISTKIT_TEST_REDIS`` or
127.0.0.1:6379/0; a server that cannot be reached is left out and said so.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Callable

PG_URL = os.environ.get("PERSISTKIT_TEST_POSTGRES", "postgresql://127.0.0.1:5432/test")
REDIS_URL = os.environ.get("PERSISTKIT_TEST_REDIS", "redis://127.0.0.1:6379/0")
TAG = uuid.uuid4().hex[:8]

Drop = Callable[[], None] | None


def scratch_stores(name: str, *, sqlite: bool = True) -> list[tuple[str, str, Drop]]:
    out: list[tuple[str, str, Drop]] = []
    if sqlite:
        out.append(("SQLite", f"sqlite:///{tempfile.mkdtemp()}/bench.db", None))
    try:
        import psycopg

        admin = psycopg.connect(PG_URL, autocommit=True)
        schema = f"pkbench_{name}_{TAG}"

        def drop_pg() -> None:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            admin.close()

        out.append(("PostgreSQL", f"{PG_URL}?schema={schema}", drop_pg))
    except Exception as exc:  # no server, no driver: say so
        print(f"PostgreSQL skipped: {exc}")
    try:
        import redis

        client = redis.Redis.from_url(REDIS_URL)
        client.ping()
        prefix = f"pkbench-{name}-{TAG}:"

        def drop_redis() -> None:
            for key in client.scan_iter(f"{prefix}*"):
                client.delete(key)
            client.close()

        out.append(("Redis", f"{REDIS_URL}?volatile=true&prefix={prefix}", drop_redis))
    except Exception as exc:
        print(f"Redis skipped: {exc}")
    return out
