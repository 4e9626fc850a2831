"""The DynamoDB store's kv batches larger than one transaction (persistkit/backends/_dynamo_kvbatch.py):
a batch stopped between any two of its steps is seen whole or not at all and is completed or
aborted by the next writer, a stalled one fails its commit, racing batches over shared keys
have one winner and are never half-visible, batches cut by bytes, options. The shared
contract is the kv and board suites (tests/test_kv_conformance.py, test_board_conformance.py
-k dynamodb); everything here runs against moto's server over real HTTP."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from persistkit import ConfigurationError, ConflictError
from persistkit.backends import open_backend
from persistkit.backends._protocol import KvEntry, KvOp
from persistkit.backends.dynamodb import DynamoBackend, make_client

KEYS = [
    f"k{i:03d}" for i in range(120)
]  # marks: 3 transactions (50, 50, 20); completion: 2 (100, 20)


@pytest.fixture(scope="module")
def url(dynamodb_endpoint: str) -> str:
    return f"dynamodb://pktest-kvb-{uuid.uuid4().hex[:10]}?endpoint_url={dynamodb_endpoint}&region=us-east-1&create=1"


@pytest.fixture
def endpoint(url: str) -> str:
    return url.split("endpoint_url=", 1)[1].split("&", 1)[0]


@pytest.fixture
def scope(url: str) -> Iterator[str]:
    s = f"kv_{uuid.uuid4().hex[:12]}"
    yield s
    b = _open(url)
    b.kv_drop(s)
    b.close()


def _open(url: str, **options: Any) -> DynamoBackend:
    b = open_backend(url, **options)
    assert isinstance(b, DynamoBackend)
    return b


class _Crash(BaseException):
    """Stands for the process dying: not an Exception, so nothing in the store catches it."""


class _Stop:
    """A botocore ``before-call`` hook: raises ``_Crash`` at the ``nth`` call of ``op`` (or, with
    ``pause``, holds that call until released): the store stops between two of its steps."""

    def __init__(self, op: str, nth: int, *, pause: bool = False) -> None:
        self.op, self.nth, self.pause = op, nth, pause
        self.seen = 0
        self.paused = threading.Event()
        self.release = threading.Event()

    def __call__(self, model: Any, **_: Any) -> None:
        if model.name != self.op:
            return
        self.seen += 1
        if self.seen != self.nth:
            return
        if not self.pause:
            raise _Crash()
        self.paused.set()
        assert self.release.wait(timeout=120), "the test never released the paused writer"


def _stopped(endpoint: str, url: str, stop: _Stop, **options: Any) -> DynamoBackend:
    client = make_client(endpoint, "us-east-1")
    client.meta.events.register("before-call.dynamodb", stop)
    return _open(url, client=client, **options)


def _raw(b: DynamoBackend, scope: str, prefix: str) -> list[dict[str, Any]]:
    return list(b._query("k" + scope, "test", begins=prefix))


def _records(b: DynamoBackend, scope: str) -> list[str]:
    return sorted(str(i["st"]["S"]) for i in _raw(b, scope, "x!"))


def _edges(keys: list[str]) -> list[str]:
    """The first and last key of every 50 (a mark transaction's, a completion's) and the last."""
    return [k for i, k in enumerate(keys) if i % 50 in (0, 49) or i == len(keys) - 1]


def _state(b: DynamoBackend, scope: str, keys: list[str]) -> set[tuple[int, bytes | None]]:
    """Every way a reader can see the keys, reduced to the distinct (version, value) pairs:
    the listing and what a watch polls for every key, ``kv_get`` and ``kv_history`` for the
    keys at each transaction's edges (issue #35: each is one more request per key on moto,
    and every key's latest version and value are already read by the listing)."""
    seen = set()
    listed = {e.key: e for e in b.kv_list(scope)}
    assert sorted(listed) == sorted(keys)
    seen.update((e.version, e.value) for e in listed.values())
    for k in _edges(keys):
        got = b.kv_get(scope, k)
        assert got is not None and got == listed[k]
        history = b.kv_history(scope, k)
        assert history[0] == got and [e.version for e in history] == list(range(got.version, 0, -1))
        assert b.kv_get(scope, k, version=got.version + 1) is None
        seen.add((got.version, got.value))
    assert b._kv_versions(scope) == {k: listed[k].version for k in keys}  # what a watch polls
    return seen


# (operation, nth call): the step the batch stops before. Its calls, in order: 2 BatchGetItem,
# PutItem (record), 3 TransactWriteItems (marks), UpdateItem (commit), 2 TransactWriteItems.
STOPS = {
    "before the record": ("PutItem", 1, False),
    "before any mark": ("TransactWriteItems", 1, False),
    "between marks": ("TransactWriteItems", 2, False),
    "before the commit": ("UpdateItem", 1, False),
    "after the commit": ("TransactWriteItems", 4, True),
    "between completions": ("TransactWriteItems", 5, True),
}


@pytest.mark.parametrize("where", list(STOPS))
def test_a_batch_stopped_between_steps_is_all_or_nothing(
    url: str, endpoint: str, scope: str, where: str
) -> None:
    op, nth, committed = STOPS[where]
    setup = _open(url)
    setup.kv_write(scope, [KvOp(k, 0, b"old") for k in KEYS], keep=5)  # itself a batch of 120
    assert _state(setup, scope, KEYS) == {(1, b"old")}
    doomed = _stopped(endpoint, url, _Stop(op, nth))
    with pytest.raises(_Crash):
        doomed.kv_write(scope, [KvOp(k, 1, b"new") for k in KEYS], keep=5)
    # A pending batch is young to this reader (an hour, not the default 10 s: on a loaded machine
    # moto took longer than that between the stop and the reads, and the reader aborted it).
    reader = _open(url, kv_pending_timeout=3600.0)
    assert _state(reader, scope, KEYS) == ({(2, b"new")} if committed else {(1, b"old")})
    if where != "before the record":
        assert sorted(_records(reader, scope)) == [
            "committed",
            "committed" if committed else "pending",
        ]
    # The next writer completes a committed batch, or waits for a pending one to age and aborts it.
    nxt = _open(url, kv_pending_timeout=0.2)
    base = 2 if committed else 1
    # one transaction; the key is held by the batch: settled first
    nxt.kv_write(scope, [KvOp("k000", base, b"single")], keep=5)
    nxt.kv_write(scope, [KvOp(k, base + (k == "k000"), b"later") for k in KEYS], keep=5)
    for b in (reader, nxt):
        assert _state(b, scope, KEYS) == {(base + 1, b"later"), (base + 2, b"later")}
        assert b.kv_get(scope, "k000", version=base + 1) == KvEntry("k000", base + 1, b"single")
    assert not [i for i in _raw(reader, scope, "l!") if "xb" in i]  # every mark settled
    if where in ("between marks", "before the commit"):  # its marks were met: aborted
        assert "aborted" in _records(reader, scope)
        done = _committed(reader, scope)  # the aborted batch's versions are gone
        assert not [i for i in _raw(reader, scope, "v!") if "xb" in i and i["xb"]["S"] not in done]
    for b in (setup, doomed, reader, nxt):
        b.close()


def _committed(b: DynamoBackend, scope: str) -> set[str]:
    return {str(i["s"]["S"])[2:] for i in _raw(b, scope, "x!") if i["st"]["S"] == "committed"}


def test_a_reader_aborts_an_old_pending_batch(url: str, endpoint: str, scope: str) -> None:
    doomed = _stopped(endpoint, url, _Stop("UpdateItem", 1))
    with pytest.raises(_Crash):
        doomed.kv_write(scope, [KvOp(k, 0, b"X") for k in KEYS[:60]], keep=1)
    assert _records(doomed, scope) == ["pending"]
    reader = _open(url, kv_pending_timeout=0.05)
    while _records(doomed, scope) == ["pending"]:  # reads never wait: they abort once it aged
        assert reader.kv_get(scope, "k000") is None
    assert _records(doomed, scope) == ["aborted"]
    assert reader.kv_list(scope) == [] and reader.kv_history(scope, "k001") == []
    assert reader.kv_drop(scope) is False  # only marks of an aborted batch: no key existed
    doomed.close()
    reader.close()


def test_a_stalled_batch_aborted_by_another_writer_fails_its_commit(
    url: str, endpoint: str, scope: str
) -> None:
    stop = _Stop("UpdateItem", 1, pause=True)
    slow = _stopped(endpoint, url, stop)
    other = _open(url, kv_pending_timeout=0.05)
    raised: list[BaseException] = []

    def write() -> None:
        try:
            slow.kv_write(scope, [KvOp(k, 0, b"slow") for k in KEYS[:60]], keep=2)
        except BaseException as exc:
            raised.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert stop.paused.wait(timeout=120)
        other.kv_write(
            scope, [KvOp("k059", 0, b"fast")], keep=2
        )  # aborts the stalled batch, then writes
    finally:
        stop.release.set()
        writer.join(timeout=120)
    assert not writer.is_alive() and len(raised) == 1 and isinstance(raised[0], ConflictError), (
        raised
    )
    assert other.kv_list(scope) == [KvEntry("k059", 1, b"fast")]
    assert _records(other, scope) == ["aborted"]
    slow.close()
    other.close()


def _race(scope: str, jobs: list[tuple[DynamoBackend, list[str], str]], base: int) -> list[str]:
    """Start the batches at once (each key from ``base``); the tags of those that won."""
    barrier = threading.Barrier(len(jobs))
    won: list[str] = []
    failed: list[BaseException] = []

    def race(b: DynamoBackend, keys: list[str], tag: str) -> None:
        barrier.wait()
        try:
            b.kv_write(scope, [KvOp(k, base, tag.encode()) for k in keys], keep=10)
            won.append(tag)
        except ConflictError:
            pass
        except BaseException as exc:  # anything else fails the test, with its cause shown
            failed.append(exc)

    threads = [threading.Thread(target=race, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failed, failed
    return won


def test_racing_batches_over_shared_keys_have_one_winner(url: str, scope: str) -> None:
    a, b = _open(url), _open(url)
    a_keys, b_keys = (
        KEYS[:80],
        KEYS[40:],
    )  # 40 shared keys; each batch 80 keys (2 mark transactions)
    won = _race(scope, [(a, a_keys, "A"), (b, b_keys, "B")], 0)
    assert len(won) == 1, won
    mine = a_keys if won == ["A"] else b_keys
    entries = {e.key: e for e in b.kv_list(scope)}
    assert sorted(entries) == mine  # nothing of the losing batch, not even its own keys
    assert {(e.version, e.value) for e in entries.values()} == {(1, won[0].encode())}
    a.kv_write(scope, [KvOp(k, 0, b"fill") for k in KEYS if k not in entries], keep=2)
    for base in (1, 2, 3):  # the same 120 keys from the same versions
        won = _race(scope, [(a, KEYS, "A"), (b, KEYS, "B")], base)
        assert len(won) == 1, won
        assert _state(a, scope, KEYS) == {(base + 1, won[0].encode())}
    a.close()
    b.close()


def test_a_batch_whose_requests_land_twice_commits_once(url: str, scope: str) -> None:
    """A request that landed but whose response was lost is sent again by the client
    (botocore's retries; DynamoDB dedupes a transaction by its token, moto does not): the
    record's put and every mark transaction meet their own write, and the batch commits."""
    b = _open(url)
    client = b._client
    sent: list[str] = []

    def twice(name: str) -> Any:
        real = getattr(client, name)

        def call(**kwargs: Any) -> Any:
            sent.append(name)
            real(**kwargs)  # lands; its response is lost
            return real(**kwargs)

        return call

    client.put_item = twice("put_item")
    client.transact_write_items = twice("transact_write_items")
    b.kv_write(scope, [KvOp(k, 0, b"once") for k in KEYS], keep=2)
    assert sent.count("put_item") == 1 and sent.count("transact_write_items") >= 3
    assert _state(b, scope, KEYS) == {(1, b"once")}
    assert _records(b, scope) == ["committed"]
    b.close()


def test_a_batch_over_the_transaction_bytes_is_cut_by_size(url: str, scope: str) -> None:
    big = [bytes([i]) * 300_000 for i in range(12)]  # inline values, 7 MB: beyond one transaction
    b = _open(url)
    b.kv_write(scope, [KvOp(f"big{i:02d}", 0, v) for i, v in enumerate(big)], keep=1)
    assert [e.value for e in b.kv_list(scope)] == big
    assert _records(b, scope) == ["committed"]
    b.kv_write(
        scope, [KvOp("big00", 1, b"small"), KvOp("big01", 1, None)], keep=1
    )  # small again: one transaction
    assert _records(b, scope) == ["committed"]
    assert b.kv_history(scope, "big01") == [KvEntry("big01", 2, None)]
    b.close()


def test_a_small_batch_is_one_transaction_and_has_no_record(url: str, scope: str) -> None:
    b = _open(url)
    b.kv_write(scope, [KvOp(k, 0, b"x") for k in KEYS[:50]], keep=1)
    assert _records(b, scope) == []
    b.kv_write(scope, [KvOp(k, 0, b"x") for k in KEYS[50:101]], keep=1)  # 51 keys: a record
    assert _records(b, scope) == ["committed"]
    b.close()


def test_pending_timeout_option(url: str) -> None:
    b = _open(url + "&kv_pending_timeout=3")
    assert b._pending_timeout == 3.0
    b.close()
    for bad in ("kv_pending_timeout=0", "kv_pending_timeout=soon", "kv_pending_timeout=inf"):
        with pytest.raises(ConfigurationError, match="kv_pending_timeout"):
            _open(url + "&" + bad)
