"""What the Redis store checks on every connection it opens, before the connection is used.

* **TLS spoken to a plain-text server** (``rediss://`` at a server without TLS): the
  handshake is bounded by the connect timeout (``socket_connect_timeout``, else
  :data:`HANDSHAKE_TIMEOUT`) instead of redis-py's unbounded read, and a server that then
  answers a plain ``PING`` is named: ``ConfigurationError`` "use redis://".
* **A server that will lose data**: no AOF (``appendonly no``) and no RDB ``save``
  schedule, or a ``maxmemory-policy`` that evicts any key (``allkeys-*``; a ``volatile-*``
  policy too when the store sets a ``ttl``). Refused (``ConfigurationError`` naming the
  settings) unless the URL says ``?volatile=true``. A server that refuses ``CONFIG``
  (managed services rename or forbid it) cannot be inspected: it is trusted.
* **A store that lost its data under this process**: the first write stores an identity
  (``<prefix>store``, a random id, written once with ``SET NX``); every connection opened
  later reads it, and a store whose identity vanished or changed (a restart without
  persistence, ``FLUSHALL``) raises :class:`~persistkit.StoreLostError` instead of letting
  a resume run committed steps again. Fencing tokens then cannot go backwards for this
  process either: every connection it opens refuses, so its old tokens never reach the
  emptied store (a process started after the loss begins the store anew).

redis-py reconnects transparently, so the checks run in the connection's own connect
hook (``redis_connect_func``), on clients made from a URL, for the first connection and
every re-established one; for clients a user passes in, at their first use.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

import redis.exceptions as rexc
from redis.connection import Connection, SSLConnection

from .._errors import ConfigurationError, StoreLostError

__all__ = ["HANDSHAKE_TIMEOUT", "Guard", "TLSConnection", "plaintext_redis"]

#: Seconds a TLS handshake may take when the URL sets no ``socket_connect_timeout``.
HANDSHAKE_TIMEOUT = 10.0

_CONFIG = (("CONFIG", "GET", "appendonly"), ("CONFIG", "GET", "save"), ("CONFIG", "GET", "maxmemory-policy"))


def plaintext_redis(host: str, port: int, timeout: float) -> bool:
    """Whether a Redis that speaks plain text answers at ``host:port`` (a ``PING`` answered
    with ``+PONG`` or an error reply such as ``-NOAUTH``)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            reply = sock.recv(64)
    except OSError:
        return False
    return reply.startswith((b"+PONG", b"-NOAUTH", b"-ERR", b"-WRONGPASS", b"-DENIED"))


def not_tls_error(host: str, port: int, url: str) -> ConfigurationError:
    return ConfigurationError(
        f"cannot connect to the redis store {url}: this server does not speak TLS: use redis:// "
        f"(the server at {host}:{port} answered in plain text, so rediss:// cannot work there; "
        "or turn TLS on at the server)"
    )


class TLSConnection(SSLConnection):
    """redis-py's TLS connection with its handshake bounded by the connect timeout (redis-py
    runs it under ``socket_timeout``, unbounded by default: a plain-text server that never
    answers the ClientHello hung it), and a plain-text server named as such."""

    def __init__(self, *, shown_url: str = "", **kwargs: Any) -> None:
        self._shown_url = shown_url
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]

    def _connect(self) -> Any:
        limit = self.socket_connect_timeout or HANDSHAKE_TIMEOUT
        sock = Connection._connect(self)  # type: ignore[no-untyped-call]  # TCP only
        sock.settimeout(limit)
        try:
            tls = self._wrap_socket_with_ssl(sock)  # type: ignore[no-untyped-call]
        except (OSError, rexc.RedisError) as exc:
            sock.close()
            if plaintext_redis(self.host, self.port, limit):
                raise not_tls_error(self.host, self.port, self._shown_url or f"{self.host}:{self.port}") from exc
            raise
        tls.settimeout(self.socket_timeout)
        return tls


def _config_value(reply: Any) -> str | None:
    """The value of a ``CONFIG GET name`` reply (RESP2 list or RESP3 map); None when refused."""
    if isinstance(reply, Exception):
        return None
    values = list(reply.values()) if isinstance(reply, dict) else list(reply)[1::2]
    if not values:
        return None
    value = values[0]
    return value.decode() if isinstance(value, bytes) else str(value)


def data_loss_settings(appendonly: str | None, save: str | None, policy: str | None, ttl: bool) -> list[str]:
    """The settings of a server that will lose data, each with what to set (empty: none)."""
    found = []
    if appendonly is not None and save is not None and appendonly != "yes" and not save.strip():
        found.append(
            "no persistence (appendonly is 'no' and save is empty: a restart comes back empty); "
            "set `appendonly yes` (or an RDB schedule, e.g. `save 3600 1 300 100 60 10000`)"
        )
    if policy is not None and (policy.startswith("allkeys-") or (ttl and policy.startswith("volatile-"))):
        found.append(
            f"maxmemory-policy is {policy!r} (under memory pressure it evicts "
            f"{'any key' if policy.startswith('allkeys-') else 'keys with a ttl, as this store sets'}); "
            "set `maxmemory-policy noeviction`"
        )
    return found


class Guard:
    """One store's checks (see the module docstring); shared by its sync, async and watch
    connections. ``identity`` is what this process saw stored, once it saw one."""

    def __init__(self, identity_key: bytes, url: str, *, volatile: bool, ttl: bool) -> None:
        self.key = identity_key
        self.url = url
        self.volatile = volatile
        self.ttl = ttl
        self.identity: bytes | None = None
        self.written = False  # this process stored or read an identity after a write
        self._lock = threading.Lock()

    # -- the commands and what their replies mean (no I/O here) ------------------------

    def commands(self) -> tuple[tuple[Any, ...], ...]:
        return (*(() if self.volatile else _CONFIG), ("GET", self.key))

    def judge(self, replies: list[Any], known: bytes | None) -> None:
        """Raise for a server that will lose data, or a store that lost its data. ``known``
        is :attr:`identity` as it was before the commands were sent (see :meth:`seen`)."""
        *config, stored = replies
        if config:
            appendonly, save, policy = (_config_value(r) for r in config)
            found = data_loss_settings(appendonly, save, policy, self.ttl)
            if found:
                raise ConfigurationError(
                    f"the redis store {self.url} will lose data: " + "; ".join(found) + ". Change that "
                    "in the server's configuration (redis.conf, or CONFIG SET then CONFIG REWRITE), "
                    "or, for a cache or a test where losing threads is acceptable, say so in the "
                    "URL: ?volatile=true"
                )
        if isinstance(stored, Exception):
            raise stored
        self.seen(stored, known)

    def seen(self, stored: bytes | None, known: bytes | None) -> None:
        """Compare an identity read from the store with the one this process saw. ``known``
        is :attr:`identity` as it was when the read was sent: connections race, and a read
        sent before this process's first write (which stores the identity) may be judged
        after it; its empty answer is no loss."""
        with self._lock:
            if stored is None and known is None:
                return  # nothing written yet when the read was sent
            if self.identity is None:
                self.identity = stored  # the first look (None: nothing written yet)
                return
            if stored == self.identity:
                return
        raise StoreLostError(
            f"the redis store {self.url} lost its data while this process had it open: its identity "
            f"record ({self.key.decode(errors='replace')}) is "
            + ("gone" if stored is None else "another one")
            + " (the server restarted without persistence, or was flushed). Nothing was written; "
            "steps this process saw committed are not in the store any more, so going on would run "
            "them again. Give the server persistence (appendonly yes) and restore it from a backup, "
            "or, to start over on the emptied store, open it again (pk.connect) and redeliver the turns"
        )

    def write_identity(self) -> tuple[tuple[Any, ...], ...]:
        """The commands that store an identity once (before the first write of this process)."""
        return (("SET", self.key, os.urandom(12).hex().encode(), "NX"), ("GET", self.key))

    def written_identity(self, replies: list[Any]) -> None:
        stored = replies[-1]
        if isinstance(stored, Exception):
            raise stored
        with self._lock:
            fresh = self.identity is None
            if fresh:
                self.identity = stored
        if not fresh:
            self.seen(stored, stored)
        self.written = True

    # -- the connect hooks (redis_connect_func) ----------------------------------------

    def on_connect(self, conn: Any) -> None:
        conn.on_connect()
        try:
            known = self.identity
            self.judge(_ask(conn, self.commands()), known)
        except BaseException:
            conn.disconnect()  # redis-py leaves a connection whose hook raised a non-redis error open
            raise

    async def aon_connect(self, conn: Any) -> None:
        await conn.on_connect()
        try:
            commands, known = self.commands(), self.identity
            await conn.send_packed_command(conn.pack_commands(commands))
            replies = []
            for _ in commands:
                try:
                    replies.append(await conn.read_response())
                except rexc.ResponseError as exc:
                    replies.append(exc)
            self.judge(replies, known)
        except BaseException:
            await conn.disconnect()
            raise


def _ask(conn: Any, commands: tuple[tuple[Any, ...], ...]) -> list[Any]:
    conn.send_packed_command(conn.pack_commands(commands))
    replies: list[Any] = []
    for _ in commands:
        try:
            replies.append(conn.read_response())
        except rexc.ResponseError as exc:  # CONFIG refused (a managed service): judged as unknown
            replies.append(exc)
    return replies
