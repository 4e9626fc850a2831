"""Database-enforced access to the PostgreSQL kv space: row-level security per role.

``persistkit.backends.postgres.grant_board_access(url, role, board=, read=, write=)``
(run as the owner of the store's schema) lets database role ``role`` read keys of scope
``board`` matching ``read`` (and ``write``) globs and write keys matching ``write``; an
agent process then connects AS that role (its own URL) and the server itself enforces
the grants, whatever code runs in the agent.

How. Row-level security is enabled on ``kv_keys``, ``kv_versions`` and ``kv_grants``, with
one set of policies (created once) that look the connected role's grants up in
``kv_grants`` (role, scope, mode, pattern): a row is visible when a read or write grant's
pattern matches its key, and may be inserted, updated or deleted when a write grant's
does. A grant is a row, so granting and revoking never rewrite policies, and a refused
writer can read its own grants to name the key that was refused. A glob's ``*`` matches
any run of characters (``/`` included); every other character is literal, so
``"research/*"`` is everything under ``research/`` and ``"output/summary"`` one key.
A write grant implies reading the same keys (a compare-and-swap must see the version).

What it protects: a role's connection cannot read, list or see the history of keys
outside its grants (the rows are invisible: a read finds nothing, a listing skips
them, a write based on them sees version 0 and conflicts), and cannot create, change or
delete keys outside its write grants: the database refuses (SQLSTATE 42501), which the
store raises as ``AccessDeniedError`` naming the key and the operation; nothing of the
batch is written. It holds against any code in the agent, raw SQL included, because the
role's session is what is limited.

What it does not protect: the table owner and superusers bypass row-level security (the
store's own, unrestricted URL is such a role: keep it out of agents); a role with
``BYPASSRLS`` too. ``NOTIFY``/``LISTEN`` are not covered by row-level security: a role
that knows a scope's channel name can LISTEN to its hints, which carry key names and
versions (never values) of every write in the scope. Checkpoint tables are not covered
(this is about the shared space). Key names are data, so a denied write's error tells
the role the name it tried, nothing more.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import psycopg
from psycopg import sql

from .._errors import BackendError, ConfigurationError
from ._postgres_kv_sql import like_pattern
from ._postgres_sync import Core, Cur

__all__ = ["grant", "revoke"]

_SCOPE_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_KV_TABLES = ("kv_keys", "kv_versions")

# The connected role's grants of the row's scope covering the row's key ({t}: the table).
_VISIBLE = """EXISTS (SELECT 1 FROM {s}.kv_grants g WHERE g.role = current_user
    AND g.scope = {t}.scope AND {t}.key LIKE g.pattern)"""
_WRITABLE = """EXISTS (SELECT 1 FROM {s}.kv_grants g WHERE g.role = current_user
    AND g.scope = {t}.scope AND g.mode = 'write' AND {t}.key LIKE g.pattern)"""
_POLICIES = (
    ("pk_read", "FOR SELECT USING ({visible})"),
    ("pk_insert", "FOR INSERT WITH CHECK ({writable})"),
    ("pk_update", "FOR UPDATE USING ({visible}) WITH CHECK ({writable})"),
    ("pk_delete", "FOR DELETE USING ({writable})"),
)


def _check(role: object, scope: object, patterns: Sequence[object]) -> None:
    if not isinstance(role, str) or not role or len(role.encode()) > 63 or "\0" in role:
        raise ConfigurationError(f"role {role!r}: give the name of a database role (1-63 bytes)")
    if scope is not None and (not isinstance(scope, str) or not _SCOPE_RE.fullmatch(scope)):
        raise ConfigurationError(
            f"board {scope!r}: give the board's name (1-64 letters, digits, '_', '.', '-')"
        )
    for p in patterns:
        if not isinstance(p, str) or not p or "\0" in p:
            raise ConfigurationError(
                f"grant pattern {p!r}: give a non-empty glob of keys such as 'research/*' (no NUL)"
            )


def _ensure_policies(cur: Cur, quoted: str, schema: str) -> None:
    """Enable row-level security and create the policies that are missing (idempotent)."""
    cur.execute(
        "SELECT tablename, policyname FROM pg_catalog.pg_policies WHERE schemaname = %s",
        (schema,),
    )
    have = {(t, p) for t, p in cur.fetchall()}
    for table in (*_KV_TABLES, "kv_grants"):
        cur.execute(f"ALTER TABLE {quoted}.{table} ENABLE ROW LEVEL SECURITY".encode())
    for table in _KV_TABLES:
        visible = _VISIBLE.replace("{s}", quoted).replace("{t}", table)
        writable = _WRITABLE.replace("{s}", quoted).replace("{t}", table)
        for name, body in _POLICIES:
            if (table, name) not in have:
                text = body.replace("{visible}", visible).replace("{writable}", writable)
                cur.execute(f"CREATE POLICY {name} ON {quoted}.{table} {text}".encode())
    if ("kv_grants", "pk_own") not in have:
        cur.execute(
            f"CREATE POLICY pk_own ON {quoted}.kv_grants FOR SELECT USING (role = current_user)".encode()
        )


def _privileges(cur: Cur, schema: str, role: str, *, give: bool) -> None:
    """What the role's store needs besides the policies: the schema, the migration check
    at open, its own grants, and the kv tables."""
    verb = sql.SQL("GRANT" if give else "REVOKE")
    to = sql.SQL("TO" if give else "FROM")
    s, r = sql.Identifier(schema), sql.Identifier(role)
    statements = [
        sql.SQL("{} USAGE ON SCHEMA {} {} {}").format(verb, s, to, r),
        sql.SQL("{} SELECT ON {}.migrations, {}.kv_grants {} {}").format(verb, s, s, to, r),
        sql.SQL("{} SELECT, INSERT, UPDATE, DELETE ON {}.kv_keys, {}.kv_versions {} {}").format(
            verb, s, s, to, r
        ),
    ]
    for statement in statements:
        cur.execute(statement)


def grant(core: Core, role: str, scope: str, read: Sequence[str], write: Sequence[str]) -> None:
    """Replace ``role``'s grants in ``scope`` by ``read`` and ``write`` (see the module)."""
    _check(role, scope, [*read, *write])
    q = core._shared.queries
    rows = sorted({("read", like_pattern(p)) for p in read} | {("write", like_pattern(p)) for p in write})

    def op(cur: Cur) -> None:
        with cur.connection.transaction():
            cur.execute(q.lock, {"schema": q.schema})  # one grant or revoke at a time per schema
            _ensure_policies(cur, q.quoted_schema, q.schema)
            _privileges(cur, q.schema, role, give=True)
            cur.execute(
                f"DELETE FROM {q.quoted_schema}.kv_grants WHERE role = %s AND scope = %s".encode(),
                (role, scope),
            )
            for mode, pattern in rows:
                cur.execute(
                    f"INSERT INTO {q.quoted_schema}.kv_grants (role, scope, mode, pattern) "
                    "VALUES (%s, %s, %s, %s)".encode(),
                    (role, scope, mode, pattern),
                )

    _run(core, f"granting board {scope!r} to role {role!r}", op)


def revoke(core: Core, role: str, scope: str | None) -> None:
    """Remove ``role``'s grants in ``scope`` (every scope when ``None``); with none left,
    also its privileges on the schema and the kv tables."""
    _check(role, scope, [])
    q = core._shared.queries

    def op(cur: Cur) -> None:
        with cur.connection.transaction():
            cur.execute(q.lock, {"schema": q.schema})
            cur.execute(
                f"DELETE FROM {q.quoted_schema}.kv_grants WHERE role = %s AND (%s::text IS NULL OR scope = %s)".encode(),
                (role, scope, scope),
            )
            cur.execute(f"SELECT 1 FROM {q.quoted_schema}.kv_grants WHERE role = %s LIMIT 1".encode(), (role,))
            if cur.fetchone() is None:
                _privileges(cur, q.schema, role, give=False)

    _run(core, f"revoking board access of role {role!r}", op)


def _run(core: Core, action: str, op: Callable[[Cur], None]) -> None:
    try:
        core._run(action, None, op, read=False)
    except BackendError as exc:
        cause = exc.__cause__
        if isinstance(cause, psycopg.errors.InsufficientPrivilege | psycopg.errors.UndefinedObject):
            raise ConfigurationError(
                f"{action} failed ({' '.join(str(cause).split())}): run it with the URL of the role that "
                "owns the store's schema (it creates policies and grants privileges), and give an "
                "existing role (CREATE ROLE name LOGIN)"
            ) from cause
        raise
