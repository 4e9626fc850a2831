"""The DynamoDB store's own promises, on moto's server over real HTTP (``dynamodb_endpoint``).

The shared suites run on it through ``store_url``; this file checks what only this store
has: the table is never created unasked, one request a step with and without a lease
(counted with a botocore event hook), a 5 MB value through chunks, throttling mapped
to ``BackendUnavailableError``, and moto's departure from DynamoDB's isolation.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import _free_port, _port_open, uid

import persistkit as pk
from persistkit._errors import BackendUnavailableError, ConfigurationError
from persistkit.backends import CheckpointRow, open_backend
from persistkit.backends._dynamo_items import map_error
from persistkit.backends.dynamodb import make_client


@pytest.fixture
def url(dynamodb_endpoint: str) -> str:
    return f"dynamodb://pktest-{uuid.uuid4().hex[:12]}?endpoint_url={dynamodb_endpoint}&region=us-east-1&create=1"


def test_missing_table_names_the_table_and_the_command(dynamodb_endpoint: str) -> None:
    table = f"pktest-missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ConfigurationError, match=rf"{table}.*persistkit dynamodb create-table"):
        pk.connect(f"dynamodb://{table}?endpoint_url={dynamodb_endpoint}&region=us-east-1")
    with pytest.raises(ConfigurationError, match="not a flag"):
        pk.connect(f"dynamodb://{table}?endpoint_url={dynamodb_endpoint}&create=maybe")
    with pytest.raises(ConfigurationError, match=r"unknown|not know|option"):
        pk.connect(f"dynamodb://{table}?password=x")


def test_cli_creates_the_table_once(dynamodb_endpoint: str) -> None:
    table = f"pktest-cli-{uuid.uuid4().hex[:8]}"
    target = f"dynamodb://{table}?endpoint_url={dynamodb_endpoint}&region=us-east-1"
    cmd = [sys.executable, "-m", "persistkit", "dynamodb", "create-table", "--url", target]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=os.environ)
    assert first.returncode == 0 and "created" in first.stdout, first.stderr
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=os.environ)
    assert again.returncode == 0 and "exists already" in again.stdout, again.stderr
    with pk.connect(target) as store:
        assert store.backend.threads() == []


def test_migrate_import_and_readers_on_a_missing_table(dynamodb_endpoint: str, tmp_path: Any) -> None:
    """`migrate` creates the table (a deploy step), `migrate --check` and the readers call a
    missing table no store (exit 3), `import` creates it as `migrate` would, and the error
    when opening it names a command with the store's own endpoint."""

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "persistkit", *args], capture_output=True, text=True,
                              timeout=120, env=os.environ)

    def url() -> str:
        return f"dynamodb://pktest-mig-{uuid.uuid4().hex[:8]}?endpoint_url={dynamodb_endpoint}&region=us-east-1"

    missing = url()
    with pytest.raises(ConfigurationError) as info:
        pk.connect(missing)
    assert f"create-table --url '{missing}'" in str(info.value)  # the same endpoint, not AWS
    assert cli("migrate", "--check", "--url", missing).returncode == 3
    assert cli("threads", "--url", missing).returncode == 3
    made = cli("migrate", "--url", missing)
    assert made.returncode == 0 and "table created" in made.stdout, made.stderr
    assert cli("migrate", "--url", missing).stdout.strip().endswith("the table exists; nothing to do")
    assert cli("migrate", "--check", "--url", missing).returncode == 0
    source = f"sqlite:///{tmp_path}/src.db"
    with pk.connect(source) as store, pk.resume("moved\nthread", store=store, state=Chat):
        add(1)
    exported = cli("export", "--url", source, "moved\nthread", "-o", str(tmp_path / "t.jsonl"))
    assert exported.returncode == 0, exported.stderr
    target = url()
    imported = cli("import", "--url", target, str(tmp_path / "t.jsonl"))
    assert imported.returncode == 0, imported.stderr
    assert "imported 'moved\\nthread'" in imported.stdout  # one line, the id as a literal
    with pk.connect(target) as store:
        assert store.get_state("moved\nthread", state=Chat).items == [1]


class _Count:
    def __init__(self, client: Any) -> None:
        self.ops: list[str] = []
        client.meta.events.register("before-send.dynamodb", self._sent)

    def _sent(self, request: Any, **_: Any) -> None:
        self.ops.append(str(request.headers.get("X-Amz-Target", b""), "ascii").split(".")[-1])


class Chat(pk.State, name="test.dynamo.Chat"):
    items: list[int] = []


@pk.checkpointed(name="add")
def add(i: int) -> None:
    run = pk.current_run()
    assert run is not None
    run.state.items.append(i)


@pytest.mark.parametrize("busy", [None, "reject"])
def test_one_request_a_step_with_and_without_a_lease(
    url: str, dynamodb_endpoint: str, busy: str | None
) -> None:
    client = make_client(dynamodb_endpoint, "us-east-1")
    count = _Count(client)
    with (
        pk.connect(url, client=client) as store,
        pk.resume(uid(), store=store, state=Chat, busy=busy) as run,
    ):  # type: ignore[arg-type]
        add(-1)
        count.ops.clear()
        for i in range(20):
            add(i)
        ops = list(count.ops)
        assert run.state.items == [-1, *range(20)]
    client.close()
    # a lease renewal may fall inside the loop; every step is one transaction
    assert ops.count("TransactWriteItems") == 20 and len(ops) <= 21, ops


@pytest.mark.parametrize("busy", [None, "reject"])
def test_a_step_write_that_lands_twice_is_one_step(
    url: str, dynamodb_endpoint: str, busy: str | None
) -> None:
    """botocore sends a write again when its response is lost; DynamoDB dedupes a
    transaction by its request token, moto (and a retry after the token's 10 minutes) does
    not: the second copy meets its own head and the step stands, not a ConflictError."""
    client = make_client(dynamodb_endpoint, "us-east-1")
    real = client.transact_write_items

    def twice(**kwargs: Any) -> Any:
        real(**kwargs)  # lands; its response is lost
        return real(**kwargs)

    client.transact_write_items = twice
    t = uid()
    with pk.connect(url, client=client) as store:
        with pk.resume(t, store=store, state=Chat, busy=busy) as run:  # type: ignore[arg-type]
            for i in range(5):
                add(i)
            assert run.state.items == [0, 1, 2, 3, 4]
        steps = [c.step for c in store.history(t) if c.kind == "step"]
        assert steps == ["add"] * 5, steps
    client.close()


def test_a_five_megabyte_value_round_trips(url: str) -> None:
    big = os.urandom(5 * 1024 * 1024)
    backend = open_backend(url)
    t = uid()
    try:
        backend.write(CheckpointRow(t, "", "000001", None, None, big), {"k": big[::-1]}, 0)
        assert backend.get(t, "", "000001") == CheckpointRow(t, "", "000001", None, None, big)
        assert backend.get_blobs(t, ["k"]) == {"k": big[::-1]}
        assert backend.delete_thread(t)
        assert backend.get_blobs(t, ["k"]) == {} and backend.head(t, "") is None
    finally:
        backend.close()


def test_throttling_and_transaction_conflicts_are_transient() -> None:
    from botocore.exceptions import ClientError

    for code in ("ProvisionedThroughputExceededException", "ThrottlingException"):
        exc = ClientError({"Error": {"Code": code, "Message": "slow down"}}, "TransactWriteItems")
        assert isinstance(map_error(exc, "writing", "t"), BackendUnavailableError)
    conflict = ClientError(
        {"Error": {"Code": "TransactionCanceledException", "Message": "x"},
         "CancellationReasons": [{"Code": "TransactionConflict"}, {"Code": "None"}]},
        "TransactWriteItems",
    )  # fmt: skip
    assert isinstance(map_error(conflict, "writing", "t"), BackendUnavailableError)


def test_a_url_that_cannot_work_is_a_clear_error_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """No region, an endpoint that is not a URL, nothing listening: persistkit's own errors
    naming what to fix (never a botocore traceback); nothing listening is transient."""
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    with pytest.raises(ConfigurationError, match=r"no AWS region: add \?region="):
        pk.connect(f"dynamodb://pktest-{uuid.uuid4().hex[:8]}?endpoint_url=http://127.0.0.1:9")
    with pytest.raises(ConfigurationError, match="endpoint_url='notaurl' is not a URL"):
        pk.connect("dynamodb://pktest-t?region=us-east-1&endpoint_url=notaurl")
    # nothing listening: the service is down or restarting, retryable (#34 3), naming the endpoint
    with pytest.raises(pk.BackendError, match=r"nothing accepts connections at http://127\.0\.0\.1:") as refused:
        pk.connect(f"dynamodb://pktest-t?region=us-east-1&endpoint_url=http://127.0.0.1:{_free_port()}")
    assert isinstance(refused.value, BackendUnavailableError) and "endpoint_url" in str(refused.value)
    with pytest.raises(ConfigurationError, match="timeout="):
        pk.connect("dynamodb://pktest-t?region=us-east-1&timeout=soon")
    from botocore.exceptions import NoCredentialsError  # boto3's default session caches credentials

    assert "no AWS credentials" in str(map_error(NoCredentialsError(), "describing table 't'", "t"))
    assert isinstance(map_error(NoCredentialsError(), "x", "t"), ConfigurationError)


def test_an_endpoint_that_never_answers_times_out_by_the_timeout_option(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # accepts connections, never answers
    try:
        port = silent.getsockname()[1]
        with pytest.raises(BackendUnavailableError, match="DynamoDB"):
            pk.connect(f"dynamodb://pktest-t?region=us-east-1&endpoint_url=http://127.0.0.1:{port}&timeout=0.2")
    finally:
        silent.close()


def test_moto_unserialized_departure_from_dynamodb_isolation() -> None:
    """moto evaluates a condition and applies the write without a lock; DynamoDB does both
    atomically. On moto's raw server (``--raw-dynamodb``), racing compare-and-swaps of one
    head may both win; ``tests/moto_s3.py`` serializes DynamoDB requests for the suites.
    This records the departure: it passes whether or not moto's race shows in this run,
    and checks that the serialized server never shows it (see docs/backends.md)."""
    port = _free_port()
    here = os.path.dirname(__file__)
    proc = subprocess.Popen([sys.executable, os.path.join(here, "moto_s3.py"), "127.0.0.1", str(port), "--raw-dynamodb"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not _port_open("127.0.0.1", port):
            assert proc.poll() is None and time.monotonic() < deadline, "moto did not start"
            time.sleep(0.05)
        raw = f"dynamodb://pktest-raw-{uuid.uuid4().hex[:8]}?endpoint_url=http://127.0.0.1:{port}&region=us-east-1&create=1"
        double_wins = _race(raw)
        print(
            f"moto without serialization: {double_wins} rounds with more than one winner"
        )  # the departure
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _race(url: str, writers: int = 6, rounds: int = 8) -> int:
    instances = [open_backend(url) for _ in range(writers)]
    t, doubled = uid("race"), 0
    try:
        for version in range(rounds):
            barrier = threading.Barrier(writers, timeout=60)

            def attempt(w: int, v: int = version, barrier: threading.Barrier = barrier) -> bool:
                barrier.wait()
                try:
                    instances[w].write(
                        CheckpointRow(t, "", f"{v + 1:06d}-{w}", None, None, b"x"), {}, v
                    )
                    return True
                except pk.ConflictError:
                    return False

            with ThreadPoolExecutor(writers) as pool:
                wins = sum(pool.map(attempt, range(writers)))
            assert wins >= 1
            doubled += wins > 1
            head = instances[0].head(t, "")
            assert head is not None
            if head.version != version + 1:
                break
    finally:
        for b in instances:
            b.close()
    return doubled


def test_serialized_server_gives_exactly_one_winner(url: str) -> None:
    assert _race(url) == 0


def test_a_claim_reads_the_latest_items_under_its_prefix_only(
    url: str, dynamodb_endpoint: str
) -> None:
    """A claim lists one page of ``tasks/``: not the scope's version items (which sort after
    every latest item) nor the keys after the prefix. An unbounded listing read them all on
    every claim, and 16 claimers on moto's serialized server ran past 360 s (now ~45 s)."""
    client = make_client(dynamodb_endpoint, "us-east-1")
    read: list[int] = []
    client.meta.events.register(
        "after-call.dynamodb.Query", lambda parsed, **_: read.append(len(parsed.get("Items", ())))
    )
    with pk.connect(url, client=client) as store:
        board = store.board("b")
        for n in range(3):  # 3 versions of each task, and keys after the prefix
            with board.batch() as b:
                for i in range(40):
                    b.put(f"tasks/{i:02d}", n)
            with board.batch() as b:
                for i in range(40):
                    b.put(f"z/{i:02d}", n)
        read.clear()
        claim = board.claim("tasks/", "me", lease_ttl=30)
        assert claim is not None and claim.key.startswith("tasks/")
        assert sum(read) <= 40, (
            read
        )  # the 40 latest items of tasks/ at most: no version item, no z/ key
        claim.complete(results={"done/" + claim.key: 1})
        assert len(board.list("tasks/")) == 39
    client.close()
