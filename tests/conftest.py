"""Fixtures shared by the whole suite.

Every store test is parametrized over every backend with the ``store_url``
fixture. Services: PostgreSQL and Redis are expected on their usual loopback
ports; S3 (and DynamoDB) is moto's server, started here as a separate process on a free
loopback port and spoken to over real HTTP. A service that cannot be reached
is skipped (and listed in the summary by ``-ra``), unless it is named in
``PERSISTKIT_REQUIRE`` (comma-separated), in which case the test fails.
Tests isolate themselves with unique thread ids and prefixes; they never
flush a shared database.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

import persistkit as pk

POSTGRES_URL = os.environ.get("PERSISTKIT_TEST_POSTGRES", "postgresql://127.0.0.1:5432/test")
REDIS_URL = os.environ.get("PERSISTKIT_TEST_REDIS", "redis://127.0.0.1:6379/0")
RABBITMQ_URL = os.environ.get("PERSISTKIT_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672//")
REQUIRED = {s.strip() for s in os.environ.get("PERSISTKIT_REQUIRE", "").split(",") if s.strip()}
BACKENDS = ["memory", "sqlite", "postgres", "redis", "s3", "dynamodb"]
SESSION_TAG = uuid.uuid4().hex[:8]

pk.set_testing(True)


def unavailable(service: str, why: str) -> None:
    """Skip, or fail when the run requires ``service``."""
    if service in REQUIRED:
        pytest.fail(f"{service} is required (PERSISTKIT_REQUIRE) but unavailable: {why}")
    pytest.skip(f"{service} unavailable: {why}")


def uid(prefix: str = "t") -> str:
    """A thread id no other test (or earlier run) uses."""
    return f"{prefix}-{SESSION_TAG}-{uuid.uuid4().hex[:12]}"


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    try:
        import psycopg
    except ImportError as exc:
        unavailable("postgres", f"psycopg is not installed ({exc})")
    try:
        with psycopg.connect(POSTGRES_URL, connect_timeout=3) as conn:
            conn.execute("select 1")
    except Exception as exc:  # any driver failure means "not reachable"
        unavailable("postgres", f"cannot connect to {POSTGRES_URL}: {exc}")
    yield POSTGRES_URL
    # This session's schemas only (make_url's, isolated ones too): other runs may be using theirs.
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        names = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname = %s OR nspname LIKE %s",
            (f"pktest_{SESSION_TAG}", f"pktest_{SESSION_TAG}_%"),
        ).fetchall()
        for (name,) in names:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture(scope="session")
def chromium() -> str:
    """The headless browser of the timeline page's test (Debian's ``chromium`` package,
    which ``python3 dev.py test`` installs when missing); ``chromium`` in PERSISTKIT_REQUIRE
    makes it required. The test drives it over the DevTools protocol with ``websockets``."""
    import shutil

    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        unavailable("chromium", "no chromium on PATH: `apt-get install chromium` (python3 dev.py test does it as root)")
    try:
        import websockets.sync.client  # noqa: F401
    except ImportError as exc:
        unavailable("chromium", f"websockets is not installed: pip install 'persistkit[test]' ({exc})")
    return str(path)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    try:
        import redis
    except ImportError as exc:
        unavailable("redis", f"redis-py is not installed ({exc})")
    try:
        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3)
        client.ping()
    except Exception as exc:
        unavailable("redis", f"cannot connect to {REDIS_URL}: {exc}")
    yield REDIS_URL
    # This session's keys only (make_url's prefixes): other runs may be using theirs.
    keys = list(client.scan_iter(match=f"pktest:{SESSION_TAG}:*", count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i : i + 500])
    client.close()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if a test left threads where a user of the plain URL looks: the
    default schema of the PostgreSQL database, the default prefix of the Redis db.
    Only this session's thread ids count (``uid()`` embeds SESSION_TAG)."""
    leaks = []
    try:
        import psycopg

        with psycopg.connect(POSTGRES_URL, connect_timeout=2, autocommit=True) as conn:
            if conn.execute("SELECT to_regclass('persistkit.checkpoints')").fetchone() != (None,):
                n = conn.execute(
                    "SELECT count(DISTINCT thread_id) FROM persistkit.checkpoints WHERE thread_id LIKE %s",
                    (f"%{SESSION_TAG}%",),
                ).fetchone()
                if n and n[0]:
                    leaks.append(f"{n[0]} thread(s) in schema 'persistkit' of {POSTGRES_URL}")
    except Exception:  # no server or no driver: nothing could leak there
        pass
    try:
        import redis

        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
        ids = [m for m in client.zrange("persistkit:threads", 0, -1) if SESSION_TAG.encode() in m]
        client.close()
        if ids:
            leaks.append(f"{len(ids)} thread(s) under the default prefix 'persistkit:' of {REDIS_URL}")
    except Exception:  # as above
        pass
    if leaks:
        print(f"\ntests left threads where users look: {'; '.join(leaks)}. Use make_url() / store_url.")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    """RabbitMQ for the job-queue tests (Celery); ``rabbitmq`` in PERSISTKIT_REQUIRE makes it required."""
    try:
        import celery  # noqa: F401
        import kombu
    except ImportError as exc:
        unavailable("rabbitmq", f"celery is not installed: pip install 'persistkit[celery]' ({exc})")
    try:
        with kombu.Connection(RABBITMQ_URL, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:
        unavailable("rabbitmq", f"cannot connect to {RABBITMQ_URL}: {exc}")
    return RABBITMQ_URL


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server in its own process, on a free loopback port."""
    try:
        import boto3
        import moto.server  # noqa: F401
    except ImportError as exc:
        unavailable("s3", f"boto3 / moto[server] not installed ({exc})")
    port = _free_port()
    # moto's server with atomic conditional writes, as AWS has (see tests/moto_s3.py)
    proc = subprocess.Popen(
        [sys.executable, os.path.join(os.path.dirname(__file__), "moto_s3.py"), "127.0.0.1", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not _port_open("127.0.0.1", port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            unavailable("s3", "moto server did not start")
        time.sleep(0.05)
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    endpoint = f"http://127.0.0.1:{port}"
    import boto3

    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="persistkit-test")
    yield endpoint
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="session")
def dynamodb_endpoint(request: pytest.FixtureRequest) -> str:
    """moto's server (the ``s3_endpoint`` one, which speaks DynamoDB too) checked able to
    create a DynamoDB table; a store URL adds ``dynamodb://<table>?...&create=1``."""
    try:
        endpoint = request.getfixturevalue("s3_endpoint")
    except pytest.skip.Exception as exc:
        unavailable("dynamodb", f"moto's server did not start: {exc}")
        raise
    from persistkit.backends.dynamodb import create_table, make_client

    client = make_client(endpoint, "us-east-1")
    try:
        create_table(client, f"pktest-{SESSION_TAG}")
    except Exception as exc:
        unavailable("dynamodb", f"moto's server did not create a DynamoDB table: {exc}")
    finally:
        client.close()
    return str(endpoint)


def make_url(
    kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, *, isolated: bool = False
) -> str:
    """A URL for a fresh, isolated store of ``kind``. PostgreSQL stores share this session's
    schema (threads apart by id) unless ``isolated``: a test that lists the whole store
    (``store.pending()``, ``due()``, ``drain_outbox()``) gets a schema of its own, so it never
    meets another test's threads (sealed with keys it does not have)."""
    tag = uuid.uuid4().hex[:10]
    if kind == "memory":
        return f"memory://{tag}"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path_factory.mktemp('sqlite')}/store.db"
    if kind == "postgres":
        base = request.getfixturevalue("postgres_url")
        return f"{base}?schema=pktest_{SESSION_TAG}" + (f"_{tag}" if isolated else "")
    if kind == "redis":
        base = request.getfixturevalue("redis_url")
        return f"{base}?volatile=true&prefix=pktest:{SESSION_TAG}:{tag}:"
    if kind == "s3":
        endpoint = request.getfixturevalue("s3_endpoint")
        return f"s3://persistkit-test/{SESSION_TAG}/{tag}?endpoint_url={endpoint}"
    if kind == "dynamodb":
        # one table per store: a store's threads(), leases and kv scopes are table-wide
        endpoint = request.getfixturevalue("dynamodb_endpoint")
        return f"dynamodb://pktest-{SESSION_TAG}-{tag}?endpoint_url={endpoint}&region=us-east-1&create=1"
    raise AssertionError(kind)


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh store URL, once per backend. The conformance suites use it as ``persistkit_url``."""
    return make_url(request.param, request, tmp_path_factory)


@pytest.fixture
def persistkit_url(store_url: str) -> str:
    return store_url


@pytest.fixture
def store(store_url: str) -> Iterator[pk.Store]:
    s = pk.connect(store_url)
    yield s
    s.close()


@pytest.fixture(params=["memory", "sqlite"])
def local_store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[pk.Store]:
    """A store on the two backends that need no service (for tests of engine logic)."""
    s = pk.connect(make_url(request.param, request, tmp_path_factory))
    yield s
    s.close()
