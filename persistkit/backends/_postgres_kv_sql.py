"""The PostgreSQL kv space's SQL, its notification channel and payload: the one copy of each.

Both the hand-written async operations (``_postgres_kv_async.py``) and their generated
sync twin (``_postgres_kv_sync.py``) execute only the statements defined here; the
tables are created by migration 4 (``_postgres_sql.MIGRATIONS``).

Layout: ``kv_keys (scope, key) -> version, live`` is each key's latest version, the
row a compare-and-swap updates (``UPDATE ... WHERE version = expected``: READ COMMITTED
re-checks the condition on the newest row version, so of two writers of one version
exactly one moves it) or creates (``INSERT ... ON CONFLICT DO NOTHING``: a concurrent
creator waits for the first one's commit and then inserts nothing). ``kv_versions
(scope, key, version) -> value`` holds every kept version, the latest included (``value
IS NULL``: a tombstone), so a read of one key never needs the other table. A write of
several keys is one statement; the function ``kv_all_moved`` (migration 4) fails it, and
so rolls all of it back, when any op's key was not at its expected version.

Watch: the write statement calls ``pg_notify`` for every key it moved. A notification
is queued by the transaction and delivered at its commit, never after a rollback, so a
hint is after-commit by construction. One channel per (schema, scope), named by a hash
(a channel is an identifier of at most 63 bytes; a scope alone may have 64), so the
server delivers a listener only its scope's hints. The payload is ``"<scope> <version>
<key>"``; a key is at most 1024 characters (4096 bytes of UTF-8), well under the 8000
bytes a payload may have, but a payload that would not fit is sent as ``"<scope>"``
alone, which the listener reads as "re-list" (``KvHint(None)``).
"""

from __future__ import annotations

import hashlib
import re

from ._protocol import KvHint

__all__ = ["NOT_ALL_MOVED", "KvQueries", "channel", "glob_of", "hint_of", "like_pattern"]

# Bytes of a key above which its hint is sent as "re-list" (a payload must stay under 8000).
_HINT_KEY_BYTES = 7000

_WRITE = """WITH ops AS (
    SELECT o.key, o.expected, o.value
    FROM unnest(%(keys)s::text[], %(expected)s::bigint[], %(values)b::bytea[]) AS o(key, expected, value)
),
up AS (
    UPDATE {s}.kv_keys k SET version = o.expected + 1, live = o.value IS NOT NULL
    FROM ops o
    WHERE k.scope = %(scope)s::text AND k.key = o.key AND o.expected > 0 AND k.version = o.expected
    RETURNING k.key, k.version
),
cr AS (
    INSERT INTO {s}.kv_keys (scope, key, version, live)
    SELECT %(scope)s::text, o.key, 1, o.value IS NOT NULL FROM ops o WHERE o.expected = 0
    ON CONFLICT (scope, key) DO NOTHING
    RETURNING key, version
),
moved AS (SELECT key, version FROM up UNION ALL SELECT key, version FROM cr),
ins AS (
    INSERT INTO {s}.kv_versions (scope, key, version, value)
    SELECT %(scope)s::text, m.key, m.version, o.value FROM moved m JOIN ops o ON o.key = m.key
),
cut AS (
    DELETE FROM {s}.kv_versions v USING moved m
    WHERE v.scope = %(scope)s::text AND v.key = m.key AND v.version <= m.version - %(keep)s::bigint
),
sent AS (
    SELECT pg_notify(%(channel)s::text, CASE WHEN octet_length(m.key) <= {max_key}
        THEN %(scope)s::text || ' ' || m.version::text || ' ' || m.key ELSE %(scope)s::text END)
    FROM moved m
)
SELECT {s}.kv_all_moved((SELECT count(*) FROM moved), %(n)s::bigint), (SELECT count(*) FROM sent)"""

#: The SQLSTATE of kv_all_moved (migration 4): not every op of a write moved its key.
NOT_ALL_MOVED = "PKC01"

_SQL = {
    "get": """SELECT version, value FROM {s}.kv_versions
    WHERE scope = %(scope)s::text AND key = %(key)s::text ORDER BY version DESC LIMIT 1""",
    "get_version": """SELECT version, value FROM {s}.kv_versions
    WHERE scope = %(scope)s::text AND key = %(key)s::text AND version = %(version)s::bigint""",
    "history": """SELECT version, value FROM {s}.kv_versions
    WHERE scope = %(scope)s::text AND key = %(key)s::text
      AND (%(before)s::bigint IS NULL OR version < %(before)s::bigint)
    ORDER BY version DESC LIMIT %(limit)s::bigint""",
    # The latest versions (kv_keys, in key order on its primary key) joined to their
    # values; tombstones are skipped before the limit counts. starts_with() makes the
    # prefix literal; ">= prefix" gives the index its lower bound.
    "list": """SELECT k.key, k.version, v.value FROM {s}.kv_keys k
    JOIN {s}.kv_versions v ON v.scope = k.scope AND v.key = k.key AND v.version = k.version
    WHERE k.scope = %(scope)s::text AND k.live AND k.key >= %(prefix)s::text
      AND starts_with(k.key, %(prefix)s::text){after}
    ORDER BY k.key LIMIT %(limit)s::bigint""",
    "found": """SELECT coalesce(k.version, 0) FROM unnest(%(keys)s::text[]) WITH ORDINALITY AS o(key, ord)
    LEFT JOIN {s}.kv_keys k ON k.scope = %(scope)s::text AND k.key = o.key ORDER BY o.ord""",
    "drop": """WITH k AS (DELETE FROM {s}.kv_keys WHERE scope = %(scope)s::text RETURNING 1),
    v AS (DELETE FROM {s}.kv_versions WHERE scope = %(scope)s::text RETURNING 1)
    SELECT (SELECT count(*) FROM k) + (SELECT count(*) FROM v)""",
    # After the database refused a write: the first key no write grant of the current
    # role covers (kv_grants' own policy shows a role its rows only).
    "ungranted": """SELECT o.key FROM unnest(%(keys)s::text[]) WITH ORDINALITY AS o(key, ord)
    WHERE NOT EXISTS (SELECT 1 FROM {s}.kv_grants g WHERE g.role = current_user
        AND g.scope = %(scope)s::text AND g.mode = 'write' AND o.key LIKE g.pattern)
    ORDER BY o.ord LIMIT 1""",
    "grants": """SELECT mode, pattern FROM {s}.kv_grants
    WHERE role = current_user AND scope = %(scope)s::text ORDER BY mode, pattern""",
    # Whether row-level security limits this connection's role on the kv tables (the
    # schema's owner and BYPASSRLS roles see every row).
    "limited": "SELECT row_security_active(%(table)s::text::regclass)",
}


class KvQueries:
    """The kv statements, rendered once for one schema (bytes: psycopg sends them as is)."""

    def __init__(self, schema: str, quoted_schema: str) -> None:
        self.schema = schema

        def render(text: str) -> bytes:
            return text.replace("{s}", quoted_schema).replace("{max_key}", str(_HINT_KEY_BYTES)).encode()

        self.write = render(_WRITE)
        self.get = render(_SQL["get"])
        self.get_version = render(_SQL["get_version"])
        self.history = render(_SQL["history"])
        self.found = render(_SQL["found"])
        self.drop = render(_SQL["drop"])
        self.ungranted = render(_SQL["ungranted"])
        self.grants = render(_SQL["grants"])
        self.limited = render(_SQL["limited"])
        self.kv_keys = f"{quoted_schema}.kv_keys"
        # Two static variants rather than "(after IS NULL OR ...)", so each gets a plan
        # that bounds the index scan.
        self.list = {
            after: render(_SQL["list"].replace("{after}", " AND k.key > %(after)s::text" if after else ""))
            for after in (False, True)
        }


def channel(schema: str, scope: str) -> str:
    """The NOTIFY channel of ``scope``'s hints in ``schema`` (an identifier of 38 characters)."""
    return "pk_kv_" + hashlib.md5(f"{schema}\0{scope}".encode(), usedforsecurity=False).hexdigest()


def hint_of(payload: str, scope: str) -> KvHint | None:
    """The hint a notification's payload carries; ``None`` for a payload of another scope
    (a hash collision of channels: never expected, and harmless)."""
    head, _, rest = payload.partition(" ")
    if head != scope:
        return None
    if not rest:
        return KvHint(None)  # the key did not fit the payload: re-list
    version, _, key = rest.partition(" ")
    try:
        return KvHint(key, int(version))
    except ValueError:
        return KvHint(None)


def like_pattern(glob: str) -> str:
    """A grant's glob (``*``: any run of characters, ``/`` included; everything else
    literal) as a ``LIKE`` pattern (backslash escapes ``%``, ``_`` and ``\\``)."""
    escaped = glob.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped.replace("*", "%")


def covers(pattern: str, key: str, *, prefix: bool = False) -> bool:
    """Whether a grant's ``LIKE`` pattern matches ``key`` or, with ``prefix``, some key that
    starts with ``key`` (it matches a leading part of the pattern: a cut may fall in a ``*``)."""
    glob = glob_of(pattern)
    cuts = range(len(glob) + 1) if prefix else (len(glob),)
    return any(re.fullmatch(".*".join(map(re.escape, glob[:cut].split("*"))), key, re.DOTALL) for cut in cuts)


def glob_of(pattern: str) -> str:
    """The glob a grant's ``LIKE`` pattern was made from (the inverse of :func:`like_pattern`)."""
    out: list[str] = []
    chars = iter(pattern)
    for c in chars:
        if c == "\\":
            out.append(next(chars, ""))
        else:
            out.append("*" if c == "%" else c)
    return "".join(out)
