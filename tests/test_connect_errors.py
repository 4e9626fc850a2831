"""connect() refuses what it does not understand, and says what to fix when it cannot connect.

An unknown option (URL query or keyword) is a ConfigurationError at connect()
on every store, naming it and listing the accepted ones; an error before the
store was ever reached is not "transient, safe to retry" but names the URL
(password masked) and what to fix.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import socket
import time
import uuid

import pytest
from conftest import POSTGRES_URL

import persistkit as pk
from persistkit.backends import CONNECT_OPTIONS, URL_PASSWORD_MASK


def _with(url: str, query: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{query}"


@pytest.mark.parametrize("where", ["query", "keyword"])
def test_unknown_options_are_refused_at_connect_on_every_store(store_url: str, where: str) -> None:
    url, options = (_with(store_url, "bogus_opt=1"), {}) if where == "query" else (store_url, {"bogus_opt": 1})
    with pytest.raises(pk.ConfigurationError) as info:
        pk.connect(url, **options)  # at connect(), not at the first read or write
    text = str(info.value)
    assert "'bogus_opt'" in text and "pk.connect() itself takes: blobs" in text
    assert "accepted: " in text or "options, in the URL query or as keywords: none" in text


@pytest.mark.parametrize(
    ("kind", "typo", "meant"),
    [("redis", "prefx", "prefix"), ("postgres", "scheam", "schema"), ("sqlite", "busy_timout", "busy_timeout"),
     ("s3", "regoin", "region"), ("memory", "blobz", "blobs")],
)
def test_a_typo_gets_the_option_it_was_meant_to_be(
    kind: str, typo: str, meant: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from conftest import make_url

    url = make_url(kind, request, tmp_path_factory)
    for attempt in (lambda: pk.connect(_with(url, f"{typo}=1")), lambda: pk.connect(url, **{typo: 1})):
        with pytest.raises(pk.ConfigurationError, match=f"Did you mean '{meant}' for '{typo}'"):
            attempt()


def test_connect_options_listed_in_messages_are_the_real_ones() -> None:
    params = inspect.signature(pk.connect).parameters
    real = [n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert sorted(CONNECT_OPTIONS) == sorted(real)


def _pg(path: str, auth: str = "") -> str:
    base = POSTGRES_URL.split("://", 1)[1].split("/", 1)[0]
    return f"postgresql://{auth}{base}/{path}"


@pytest.mark.parametrize(
    ("url", "error", "fix"),
    [
        (lambda: _pg(f"no_such_db_{uuid.uuid4().hex[:8]}", "pk_user:hunter22-pw@"), pk.ConfigurationError,
         "database does not exist|refused the login"),
        (lambda: _pg(f"no_such_db_{uuid.uuid4().hex[:8]}"), pk.ConfigurationError, "database does not exist"),
        (lambda: "postgresql://no-such-host.invalid/test?connect_timeout=2", pk.ConfigurationError,
         "host name does not resolve"),
        (lambda: "postgresql://127.0.0.1/test?sslmode=bogus", pk.ConfigurationError, "parameter in the URL is invalid"),
    ],
    ids=["db-missing-with-password", "db-missing", "unknown-host", "bad-parameter"],
)
def test_postgres_connect_failures_name_the_url_and_the_fix(
    postgres_url: str, url: object, error: type[Exception], fix: str
) -> None:
    target = url()  # type: ignore[operator]
    with pytest.raises(error, match=fix) as info:
        pk.connect(target)
    text = str(info.value)
    assert not isinstance(info.value, pk.BackendUnavailableError)
    assert "safe to retry" not in text and "may or may not have committed" not in text
    assert "hunter22" not in text and "cannot connect to the PostgreSQL store postgresql://" in text
    if "@" in target:
        assert URL_PASSWORD_MASK in text


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("kind", ["postgres", "redis", "s3", "dynamodb"])
def test_refused_on_the_first_connect_is_an_outage_to_retry_on_every_store(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that opens its store while the server restarts must retry its turn, not
    fail it for good: the first connect and the hundredth are the same outage."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, os.environ.get(name, "testing"))
    pytest.importorskip({"postgres": "psycopg", "redis": "redis", "s3": "boto3", "dynamodb": "boto3"}[kind])
    port = _closed_port()
    url = {
        "postgres": f"postgresql://pk_user:hunter22-pw@127.0.0.1:{port}/test?connect_timeout=2",
        "redis": f"redis://:hunter22-pw@127.0.0.1:{port}/0?socket_connect_timeout=1&volatile=true",
        "s3": f"s3://no-bucket/p?endpoint_url=http://127.0.0.1:{port}&region=us-east-1",
        "dynamodb": f"dynamodb://pk-table?endpoint_url=http://127.0.0.1:{port}&region=us-east-1",
    }[kind]
    with pytest.raises(pk.BackendUnavailableError) as info:
        store = pk.connect(url)  # PostgreSQL and DynamoDB connect here; Redis and S3 at first use
        try:
            store.threads()
        finally:
            store.close()
    assert info.value.retryable and isinstance(info.value, pk.RetryableError)
    assert "hunter22" not in str(info.value)


def test_redis_never_reached_names_the_url_and_what_to_check() -> None:
    store = pk.connect("redis://:hunter22-pw@127.0.0.1:1/0?socket_connect_timeout=1")
    with pytest.raises(pk.BackendUnavailableError, match="cannot connect to the redis store") as info:
        store.threads()
    assert "host and port" in str(info.value)
    assert "hunter22" not in str(info.value) and URL_PASSWORD_MASK in str(info.value)
    store.close()


@pytest.mark.parametrize("side", ["sync", "async"])
def test_rediss_at_a_plain_text_redis_says_use_redis_within_the_connect_timeout(redis_url: str, side: str) -> None:
    url = redis_url.replace("redis://", "rediss://", 1) + "?socket_connect_timeout=2&volatile=true"
    store = pk.connect(url)
    started = time.monotonic()
    with pytest.raises(pk.ConfigurationError, match="this server does not speak TLS: use redis://"):
        if side == "sync":
            store.threads()
        else:
            asyncio.run(store.backend.athreads())
    assert time.monotonic() - started < 6  # the connect timeout and one plain PING, not 26 s
    store.close()


def test_s3_missing_bucket_says_what_to_fix(s3_endpoint: str) -> None:
    store = pk.connect(f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/p?endpoint_url={s3_endpoint}")
    with pytest.raises(pk.ConfigurationError, match="bucket does not exist"):  # a wrong URL, as docs/backends.md says
        store.threads()
    store.close()


def test_password_mask_is_the_same_in_url_repr_and_errors() -> None:
    store = pk.connect("redis://:hunter22-pw@127.0.0.1:1/0?socket_connect_timeout=1")
    with pytest.raises(pk.BackendError) as info:
        store.threads()
    shown = store.url
    assert "hunter22" not in shown and URL_PASSWORD_MASK in shown
    assert shown in repr(store) and shown in str(info.value)
    store.close()


@pytest.mark.parametrize(
    ("typo", "meant"), [("sqllite:///agent.db", "sqlite"), ("postgressql://h/db", "postgresql"), ("reddis://h:6379/0", "redis"),
                        ("dynamo://table", "dynamodb")],
)
def test_a_scheme_typo_gets_the_scheme_it_was_meant_to_be(typo: str, meant: str) -> None:
    with pytest.raises(pk.BackendNotFoundError, match=f"Did you mean '{meant}://'") as info:
        pk.connect(typo)
    assert "known schemes: dynamodb, memory" in str(info.value)


def test_a_scheme_far_from_every_known_one_gets_no_guess() -> None:
    with pytest.raises(pk.BackendNotFoundError) as info:
        pk.connect("ftp://host/path")
    assert "Did you mean" not in str(info.value) and "known schemes" in str(info.value)
