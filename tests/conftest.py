"""Fixtures shared by the whole suite.

Every store test is parametrized over every backend with the ``store_url``
fixture. Services: PostgreSQL and Redis are expected on their usual loopback
ports; S3 (and DynamoDB) is moto's server, started here as a separate process on a free
loopback port and spoken to over real HTTP. A service that cannot be reached
is skipped (and listed in the summary by ``-ra``), unless it is named in
``PERSISTKIT_REQUIRE`` (comma-separated), in which case the test fails.
Tests isolate themselves with unique thread ids and prefixes; they never
flush a shared database.

Parallel runs (pytest-xdist: ``python3 dev.py test -n 3``): each worker is
its own process, so it imports this module once and draws its own ``SESSION_TAG``, and with
it its own PostgreSQL schema ``pktest_<tag>``, Redis key prefix ``pktest:<tag>:``, DynamoDB
tables, moto server (session fixtures are per worker) and temporary directory (pytest's
per-worker basetemp). The end-of-run leak check runs in each worker on its own tag and the
controller fails the run on what any worker found.

The quick tier (``PERSISTKIT_TIER=quick``, ``python3 dev.py test --quick``): the memory
and SQLite stores only, no service, no framework adapter, no browser, nothing marked slow,
no process-mode crash matrix and none of the files in ``QUICK_LEAVES_OUT`` (see
docs/testing.md).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import persistkit as pk

POSTGRES_URL = os.environ.get("PERSISTKIT_TEST_POSTGRES", "postgresql://127.0.0.1:5432/test")
REDIS_URL = os.environ.get("PERSISTKIT_TEST_REDIS", "redis://127.0.0.1:6379/0")
RABBITMQ_URL = os.environ.get("PERSISTKIT_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672//")
REQUIRED = {s.strip() for s in os.environ.get("PERSISTKIT_REQUIRE", "").split(",") if s.strip()}
#: ``PERSISTKIT_TIER=quick``: see the module docstring.
QUICK = os.environ.get("PERSISTKIT_TIER", "") == "quick"
SERVER_BACKENDS = ["postgres", "redis", "s3", "dynamodb"]
#: Store names as test parameters spell them (the time summary groups by them).
ALL_STORE_NAMES = frozenset({"memory", "sqlite", *SERVER_BACKENDS})
BACKENDS = ["memory", "sqlite"] + ([] if QUICK else SERVER_BACKENDS)
#: One per process, so one per xdist worker (the controller's is used by nothing).
SESSION_TAG = uuid.uuid4().hex[:8]
_TESTS = Path(__file__).resolve().parent
#: The fixtures of a service: a test that asks for one is not in the quick tier.
SERVICE_FIXTURES = frozenset({"postgres_url", "redis_url", "s3_endpoint", "dynamodb_endpoint", "rabbitmq_url", "chromium",
                              "valgrind"})
#: Files (or folders) under tests/ that the quick tier does not collect, each for a reason:
#: a framework extra, a service of its own, a child process per case or a build.
QUICK_LEAVES_OUT = frozenset({
    "adapters",  # one folder per framework extra
    "test_langgraph_store.py", "test_telemetry.py",  # langgraph / opentelemetry-sdk
    "test_celery.py", "test_celery_beat.py", "test_celery_stress.py", "test_queue_recipes.py",  # job queues
    "test_timeline_browser.py",  # chromium
    "test_postgres.py", "test_postgres_kv.py", "test_postgres_prune.py", "test_postgres_schema3.py",
    "test_redis.py", "test_redis_kv.py", "test_redis_prune.py", "test_redis_ttl_index.py",
    "test_s3.py", "test_s3_kv.py", "test_s3_prune.py", "test_dynamodb.py", "test_dynamodb_kv.py",
    "test_connect_errors.py", "test_faults.py",  # the server stores' drivers: closed ports, killed connections
    "test_long_runs_memory.py", "test_fuzz.py",  # minutes each: memory bounds of long runs, mutation fuzzing
    "test_board_conformance.py",  # the shared board's suite, every wrapper x sync/async (test_board_hub.py stays)
    "test_packaging.py", "test_bench_imports.py", "test_docs_examples.py", "test_crash_matrix_examples.py",
    "test_examples.py",  # examples/ and the extras each names (every framework)
    "test_docs_site.py",  # the docs extra (mkdocs)
})

pk.set_testing(True)


def unavailable(service: str, why: str) -> None:
    """Skip, or fail when the run requires ``service``."""
    if QUICK:
        pytest.skip(f"{service}: the quick tier uses no service")
    if service in REQUIRED:
        pytest.fail(f"{service} is required (PERSISTKIT_REQUIRE) but unavailable: {why}")
    pytest.skip(f"{service} unavailable: {why}")


def uid(prefix: str = "t") -> str:
    """A thread id no other test (or earlier run) uses."""
    return f"{prefix}-{SESSION_TAG}-{uuid.uuid4().hex[:12]}"


def until(check: Callable[[], bool], what: str, limit: float = 60.0) -> None:
    """Wait for an event another process makes visible (a file line, a store record); fail
    naming ``what`` after ``limit`` seconds. Tests of real processes wait on events, never on time."""
    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The processes a test starts (append them): killed if still running when it ends."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)


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
    if QUICK:
        unavailable("postgres", "")
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
def valgrind() -> str:
    """valgrind, for the instruction-count gate (tests/test_instruction_budget.py; ``python3
    dev.py test`` installs it as root when missing); ``valgrind`` in PERSISTKIT_REQUIRE makes it required."""
    if QUICK:
        unavailable("valgrind", "")
    import shutil

    path = shutil.which("valgrind")
    if path is None:
        unavailable("valgrind", "no valgrind on PATH: `apt-get install valgrind` (python3 dev.py test does it as root)")
    return str(path)


@pytest.fixture(scope="session")
def chromium() -> str:
    """The headless browser of the timeline page's test (Debian's ``chromium`` package,
    which ``python3 dev.py test`` installs when missing); ``chromium`` in PERSISTKIT_REQUIRE
    makes it required. The test drives it over the DevTools protocol with ``websockets``."""
    if QUICK:
        unavailable("chromium", "")
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
    if QUICK:
        unavailable("redis", "")
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
    leaks += _WORKER_LEAKS  # what the xdist workers found (empty in a run without -n)
    if leaks:
        print(f"\ntests left threads where users look: {'; '.join(leaks)}. Use make_url() / store_url.")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:  # an xdist worker: its exit status is not the run's
            workeroutput["persistkit_leaks"] = leaks


#: The leaks xdist workers reported (filled by pytest_testnodedown in the controller).
_WORKER_LEAKS: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistLeaks(), "persistkit-xdist-leaks")
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        config.pluginmanager.register(_WhereTimeGoes(), "persistkit-where-time-goes")


class _WhereTimeGoes:
    """Prints, at the end of a run, the test time summed by file and by store (setup, call and
    teardown of every test; with xdist, worker time: the run's wall time is about the sum over
    the workers). Where the suite's budget goes (docs/testing.md, issue #35), for the next cut."""

    def __init__(self) -> None:
        self.files: dict[str, float] = {}
        self.stores: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        where = report.nodeid.partition("::")[0]
        self.files[where] = self.files.get(where, 0.0) + report.duration
        params = report.nodeid.rpartition("[")[2].rstrip("]") if report.nodeid.endswith("]") else ""
        store = next((p for p in re.split(r"[-_]", params) if p in ALL_STORE_NAMES), "(no store)")
        self.stores[store] = self.stores.get(store, 0.0) + report.duration

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        total = sum(self.files.values())
        if total < 30:  # a few tests: nothing to learn
            return
        write = terminalreporter.write_line
        write(f"test time by file (top 15 of {len(self.files)}; {total / 60:.1f} min in all):")
        for name, secs in sorted(self.files.items(), key=lambda kv: -kv[1])[:15]:
            write(f"  {secs:8.1f} s  {name}")
        by_store = sorted(self.stores.items(), key=lambda kv: -kv[1])
        write("test time by store parameter: " + ", ".join(f"{name} {secs / 60:.1f} min" for name, secs in by_store))


class _XdistLeaks:
    """Carries each worker's leak report to the controller (a worker's own exit status
    does not fail an xdist run: only its test reports do)."""

    def pytest_testnodedown(self, node: object, error: object) -> None:
        _WORKER_LEAKS.extend(getattr(node, "workeroutput", {}).get("persistkit_leaks", []))


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The quick tier leaves out QUICK_LEAVES_OUT (it might not even import them)."""
    if QUICK and collection_path.name in QUICK_LEAVES_OUT and collection_path.parent == _TESTS:
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The quick tier deselects slow tests and tests of a service (a service fixture, or a
    server store among their parameters)."""
    if not QUICK:
        return
    keep, drop = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        server = any(isinstance(v, str) and v.split("-")[0] in SERVER_BACKENDS for v in params.values())
        # the crash matrix's process mode, a fork per crash point (its inline mode stays)
        forks = params.get("mode") == "process" or (item.path.name.startswith("test_crash_matrix") and "process" in item.name)
        if server or forks or item.get_closest_marker("slow") or SERVICE_FIXTURES & set(getattr(item, "fixturenames", ())):
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    """RabbitMQ for the job-queue tests (Celery); ``rabbitmq`` in PERSISTKIT_REQUIRE makes it required."""
    if QUICK:
        unavailable("rabbitmq", "")
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
    if QUICK:
        unavailable("s3", "")
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
    if QUICK:
        unavailable("dynamodb", "")
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


_S3_ADMIN: dict[str, Any] = {}


def _s3_admin(endpoint: str) -> Any:
    """One boto3 client per moto endpoint (this worker's), made once."""
    if endpoint not in _S3_ADMIN:
        import boto3

        _S3_ADMIN[endpoint] = boto3.client("s3", endpoint_url=endpoint)
    return _S3_ADMIN[endpoint]


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
        # one bucket per store: moto lists a prefix by scanning every object of the bucket
        # (~3 us each), so in one shared bucket every LIST grew slower with the session
        endpoint = request.getfixturevalue("s3_endpoint")
        bucket = f"pktest-{SESSION_TAG}-{tag}"
        _s3_admin(endpoint).create_bucket(Bucket=bucket)
        return f"s3://{bucket}/{SESSION_TAG}/{tag}?endpoint_url={endpoint}"
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
