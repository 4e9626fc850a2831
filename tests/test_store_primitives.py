"""The native operations docs/architecture.md's protocol plan builds on, checked on the
servers and libraries CI runs (moto's S3, Redis, PostgreSQL, the sqlite3 module).

These test the platforms, not persistkit: each test is one claim of the plan
("S3 refuses a PUT whose If-Match is stale", "NOTIFY is delivered at commit
and never on rollback", ...). If an upgrade drops one, the plan's row for that
store is wrong and this file says which.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from conftest import uid


def _s3_status(call: Any) -> int:
    import botocore.exceptions

    try:
        return int(call()["ResponseMetadata"]["HTTPStatusCode"])
    except botocore.exceptions.ClientError as exc:
        return int(exc.response["ResponseMetadata"]["HTTPStatusCode"])


def test_s3_conditional_writes_reads_and_deletes(s3_endpoint: str) -> None:
    """Lease/head records, KV compare-and-swap, cheap polling and fenced deletion on S3."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    bucket, key = "persistkit-test", f"{uid('prim')}/lease"
    put = s3.put_object(Bucket=bucket, Key=key, Body=b"holder 1", IfNoneMatch="*")
    first = put["ETag"]
    # create-if-absent: a second creator loses
    assert _s3_status(lambda: s3.put_object(Bucket=bucket, Key=key, Body=b"holder 2", IfNoneMatch="*")) == 412
    # compare-and-swap on the ETag
    second = s3.put_object(Bucket=bucket, Key=key, Body=b"holder 2", IfMatch=first)["ETag"]
    assert _s3_status(lambda: s3.put_object(Bucket=bucket, Key=key, Body=b"stale", IfMatch=first)) == 412
    assert _s3_status(lambda: s3.put_object(Bucket=bucket, Key=key + "-none", Body=b"x", IfMatch=first)) == 404
    # polling costs a 304 while nothing changed
    assert _s3_status(lambda: s3.get_object(Bucket=bucket, Key=key, IfNoneMatch=second)) == 304
    got = s3.get_object(Bucket=bucket, Key=key, IfNoneMatch=first)
    assert got["Body"].read() == b"holder 2"
    # the server's clock, for expiries judged without trusting the client's
    assert got["ResponseMetadata"]["HTTPHeaders"]["date"]
    # deletion fenced by the ETag
    assert _s3_status(lambda: s3.delete_object(Bucket=bucket, Key=key, IfMatch=first)) == 412
    assert _s3_status(lambda: s3.head_object(Bucket=bucket, Key=key)) == 200
    assert _s3_status(lambda: s3.delete_object(Bucket=bucket, Key=key, IfMatch=second)) == 204
    assert _s3_status(lambda: s3.head_object(Bucket=bucket, Key=key)) == 404


def test_redis_lease_token_check_and_publish_in_one_script(redis_url: str) -> None:
    """SET NX PX takes a lease; one Lua script checks the token, moves the head and publishes."""
    import redis

    r = redis.Redis.from_url(redis_url)
    base = uid("pkprim")
    lease, head, channel = f"{base}:lease", f"{base}:head", f"{base}:feed"
    sub = r.pubsub()
    try:
        sub.subscribe(channel)
        assert sub.get_message(timeout=5)["type"] == "subscribe"
        assert r.set(lease, "token-1", nx=True, px=60_000)
        assert not r.set(lease, "token-2", nx=True, px=60_000)
        assert 0 < r.pttl(lease) <= 60_000
        fenced_write = r.register_script(
            """
            if redis.call('GET', KEYS[1]) ~= ARGV[1] then return redis.error_reply('STALE lease') end
            redis.call('SET', KEYS[2], ARGV[2])
            redis.call('PUBLISH', KEYS[3], ARGV[2])
            return redis.call('TIME')
            """
        )
        now = fenced_write(keys=[lease, head, channel], args=["token-1", "v1"])
        assert len(now) == 2 and int(now[0]) > 0  # the server's clock, inside the script
        with pytest.raises(redis.ResponseError, match="STALE"):
            fenced_write(keys=[lease, head, channel], args=["token-0", "v2"])
        assert r.get(head) == b"v1"
        message = sub.get_message(timeout=5)
        assert message is not None and (message["channel"], message["data"]) == (channel.encode(), b"v1")
        assert sub.get_message(timeout=0.2) is None  # the refused write published nothing
    finally:
        sub.close()
        r.delete(lease, head)
        r.close()


def test_postgres_notify_at_commit_and_share_lock_orders_a_takeover(postgres_url: str) -> None:
    """NOTIFY is delivered when the transaction commits (never on rollback); a lease row
    read FOR SHARE by a fenced write makes a concurrent takeover wait for that commit."""
    import psycopg
    from psycopg import errors

    channel, table = uid("pkprim").replace("-", "_"), "pkprim_" + uid("l").replace("-", "_")
    with (
        psycopg.connect(postgres_url, autocommit=True) as listener,
        psycopg.connect(postgres_url, autocommit=True) as writer,
        psycopg.connect(postgres_url, autocommit=True) as other,
    ):
        listener.execute(f"LISTEN {channel}")
        with writer.transaction():
            writer.execute("SELECT pg_notify(%s, 'v1')", (channel,))
            assert list(listener.notifies(timeout=0.2, stop_after=1)) == []
        assert [n.payload for n in listener.notifies(timeout=5, stop_after=1)] == ["v1"]

        class Rollback(Exception):
            pass

        with pytest.raises(Rollback), writer.transaction():
            writer.execute("SELECT pg_notify(%s, 'never')", (channel,))
            raise Rollback
        assert list(listener.notifies(timeout=0.2, stop_after=1)) == []

        writer.execute(f"CREATE TABLE {table} (thread text PRIMARY KEY, token bigint)")
        try:
            writer.execute(f"INSERT INTO {table} VALUES ('t', 1)")
            with writer.transaction():
                assert writer.execute(f"SELECT token FROM {table} WHERE thread = 't' FOR SHARE").fetchone() == (1,)
                other.execute("SET lock_timeout = '200ms'")
                with pytest.raises(errors.LockNotAvailable):
                    other.execute(f"UPDATE {table} SET token = token + 1 WHERE thread = 't'")
            other.execute(f"UPDATE {table} SET token = token + 1 WHERE thread = 't'")
            assert writer.execute(f"SELECT token FROM {table}").fetchone() == (2,)
        finally:
            writer.execute(f"DROP TABLE {table}")


def test_sqlite_trigger_refuses_a_stale_token_and_data_version_sees_other_writers(tmp_path: Path) -> None:
    """One INSERT can carry the token and be refused inside SQLite; PRAGMA data_version moves
    when another connection commits (and not for the connection's own commits)."""
    path = tmp_path / "prim.db"
    a = sqlite3.connect(path, isolation_level=None)
    b = sqlite3.connect(path, isolation_level=None)
    try:
        a.execute("PRAGMA journal_mode=WAL")
        a.executescript(
            """
            CREATE TABLE lease (thread TEXT PRIMARY KEY, token INTEGER NOT NULL);
            CREATE TABLE row (thread TEXT, id TEXT, token INTEGER, PRIMARY KEY (thread, id));
            CREATE TRIGGER fenced BEFORE INSERT ON row
            WHEN NEW.token < (SELECT token FROM lease WHERE thread = NEW.thread)
            BEGIN SELECT RAISE(ABORT, 'stale lease token'); END;
            INSERT INTO lease VALUES ('t', 2);
            """
        )
        a.execute("INSERT INTO row VALUES ('t', '1', 2)")
        with pytest.raises(sqlite3.IntegrityError, match="stale lease token"):
            a.execute("INSERT INTO row VALUES ('t', '2', 1)")
        assert a.execute("SELECT count(*) FROM row").fetchone() == (1,)
        # Expiry in SQL: julianday works on every SQLite; unixepoch('subsec') needs 3.42.
        assert a.execute("SELECT (julianday('now') - 2440587.5) * 86400.0").fetchone()[0] > 1.7e9
        before = a.execute("PRAGMA data_version").fetchone()
        a.execute("INSERT INTO row VALUES ('t', '3', 2)")
        assert a.execute("PRAGMA data_version").fetchone() == before
        b.execute("INSERT INTO row VALUES ('t', '4', 2)")
        assert a.execute("PRAGMA data_version").fetchone() != before
    finally:
        a.close()
        b.close()
