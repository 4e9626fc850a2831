"""The conformance suite every persistkit backend must pass.

Subclass :class:`BackendConformance` in your own test module and provide one
fixture, ``persistkit_url``: the URL of a fresh store that
:func:`persistkit.backends.open_backend` can open (register your scheme
first with :func:`persistkit.backends.register_backend`)::

    import pytest
    from persistkit.testing.backend_suite import BackendConformance

    class TestMyStore(BackendConformance):
        @pytest.fixture
        def persistkit_url(self) -> str:
            return "mystore://localhost/test"

Contract of the fixture:

* Opening the URL twice must give two instances on the SAME storage (the
  suite checks that a second instance sees the first one's writes, and races
  writers through two instances).
* The store need not be empty and may be shared between tests: every test
  uses fresh random thread ids and thread-id prefixes and never assumes that
  it is alone.
* Override the ``backend_options`` fixture (a dict, empty by default) to pass
  keyword options to ``open_backend``.

No plugin is needed: async twins are driven with :func:`asyncio.run`.
Tests synchronize threads with barriers and joins, never with sleeps.

Capabilities: required, declared, detected
------------------------------------------
Required of every store (abstract in :class:`~persistkit.backends.Backend`, so
a store without them cannot even be instantiated): ``write`` with the head's
compare-and-swap, ``put_blobs``, ``head``, ``get``, ``list``, ``get_blobs``,
``scan_blobs``, ``threads``, ``delete_thread``, ``close`` and their ``a*``
twins. Every test below without a skip checks one of them.

Optional today, each detected or declared, never guessed:

* ``namespaces`` — detected: the store overrides ``Backend.namespaces`` (its
  default raises ``ConfigurationError``); ``verify`` and key rotation need it.
  Not implemented: its test is skipped and says so.
* ``rewrite`` — declared by ``supports_rewrite`` (True by default) and
  detected by the override; a store that declares it must implement it
  (``test_declared_capabilities_are_implemented``). Declared False (the
  integrity wrapper): its tests are skipped.
* ``atomic_blobs`` — declared; True makes the suite also check that a lost
  compare-and-swap leaves no blob behind.

The primitives the coming layers need (docs/architecture.md, "The store
protocol, planned") join the same way, each as a named capability with its
own test class in this package, run only when the store has it:
``fencing`` (a head write that carries a lease token and is refused when it
is stale), ``leases`` (a lease record with owner, expiry and a token that
grows with every holder), ``kv`` (a versioned key-value space with
compare-and-swap and listing by prefix), ``watch`` (a change feed, pushed or
polled) and ``prune`` (per-checkpoint deletion). A store declares them in one
class attribute, ``capabilities: ClassVar[frozenset[str]]``, and the suite
detects them by the overridden primitive methods; a capability declared but
not implemented, or implemented but not declared, fails. A layer asked for a
capability the store lacks raises ``ConfigurationError`` naming the store,
the capability and the stores that have it. Until a primitive exists, this
suite has no test for it.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from .._errors import BackendError, ConflictError, StoreClosedError
from ..backends import Backend, CheckpointRow, Head, open_backend

__all__ = ["BackendConformance"]

_MB5 = 5 * 1024 * 1024
_JOIN_TIMEOUT = 120.0  # seconds; a hung backend fails the test instead of hanging the run

# Thread-id suffixes that must round-trip unchanged. "long" cases are padded
# to exactly 512 characters (the protocol's maximum) after the unique prefix.
_ODD_IDS: dict[str, str] = {
    "emoji": "emoji 🧵🚀👩‍👩‍👧",
    "cjk": "中文线程・日本語のスレッド",
    "rtl": "עברית العربية \u202eRTL",
    "combining": "e\u0301 a\u0308 n\u0303",
    "spaces": "  spaces\tand tab ",
    "slashes": "a/b/../c//d/",
    "percent": "100%25 %s %% %",
    "colons": "a:b::c:",
    "quotes": "quote'\"`\\ back\\slash",
    "newline": "line1\nline2\r\n",
    "glob": "star* ?mark [set] {brace}",
    "long-ascii": "x",
    "long-cjk": "线",
}


def _uid(label: str = "t") -> str:
    return f"pkconf-{label}-{uuid.uuid4().hex}"


def _cid(i: int) -> str:
    """Checkpoint ids that sort in write order, like the ones the layer above makes."""
    return f"{i:012d}"


def _row(
    thread_id: str,
    i: int,
    *,
    namespace: str = "",
    parent: str | None = None,
    run_id: str | None = None,
    payload: bytes | None = None,
) -> CheckpointRow:
    return CheckpointRow(
        thread_id=thread_id,
        namespace=namespace,
        checkpoint_id=_cid(i),
        parent_id=parent,
        run_id=run_id,
        payload=payload if payload is not None else f"payload {i}".encode(),
    )


def _write_chain(
    backend: Backend, thread_id: str, n: int, *, namespace: str = "", runs: int = 0
) -> list[CheckpointRow]:
    """Write ``n`` linked rows (ids 1..n); with ``runs`` > 0, run ids cycle r0, r1, ..."""
    rows: list[CheckpointRow] = []
    parent: str | None = None
    for i in range(1, n + 1):
        run_id = f"r{i % runs}" if runs else None
        row = _row(thread_id, i, namespace=namespace, parent=parent, run_id=run_id)
        backend.write(row, {}, i - 1)
        rows.append(row)
        parent = row.checkpoint_id
    return rows


def _implements(backend: Backend, method: str) -> bool:
    """Whether ``backend``'s class overrides ``Backend.<method>`` (an optional capability)."""
    return getattr(type(backend), method) is not getattr(Backend, method)


class BackendConformance:
    """Tests for the :class:`persistkit.backends.Backend` contract. Needs ``persistkit_url``."""

    # -- fixtures --------------------------------------------------------------

    @pytest.fixture
    def backend_options(self) -> dict[str, Any]:
        """Keyword options for ``open_backend``; override to configure your store."""
        return {}

    @pytest.fixture
    def open_another(
        self, persistkit_url: str, backend_options: dict[str, Any]
    ) -> Iterator[Callable[[], Backend]]:
        """A factory for more instances on the same storage; all are closed at teardown."""
        opened: list[Backend] = []

        def _open() -> Backend:
            b = open_backend(persistkit_url, **backend_options)
            opened.append(b)
            return b

        yield _open
        for b in opened:
            b.close()

    @pytest.fixture
    def backend(self, open_another: Callable[[], Backend]) -> Backend:
        return open_another()

    # -- class attributes ------------------------------------------------------

    def test_declares_schemes_and_flags(self, backend: Backend) -> None:
        assert isinstance(type(backend).native_async, bool)
        assert type(backend).schemes and all(isinstance(s, str) for s in type(backend).schemes)
        assert isinstance(backend.url, str)

    def test_declared_capabilities_are_implemented(self, backend: Backend) -> None:
        cls = type(backend)
        for flag in ("native_async", "atomic_blobs", "supports_rewrite"):
            assert isinstance(getattr(cls, flag), bool), f"{cls.__name__}.{flag} must be a bool"
        if cls.supports_rewrite:
            assert _implements(backend, "rewrite"), (
                f"{cls.__name__} declares supports_rewrite = True but does not implement rewrite(); "
                "implement it or declare supports_rewrite = False"
            )
        if cls.native_async:
            missing = [m for m in ("awrite", "ahead", "aget", "alist") if not _implements(backend, m)]
            assert not missing, f"{cls.__name__} declares native_async but inherits {missing}"

    # -- write / read round trip -----------------------------------------------

    def test_write_then_head_get_list(self, backend: Backend) -> None:
        t = _uid()
        row = _row(t, 1, run_id="run-a")
        assert backend.write(row, {"k1": b"blob"}, 0) == Head(_cid(1), 1)
        assert backend.head(t, "") == Head(_cid(1), 1)
        assert backend.get(t, "", _cid(1)) == row
        assert backend.list(t, "") == [row]
        assert backend.get_blobs(t, ["k1"]) == {"k1": b"blob"}

    @pytest.mark.parametrize(
        "payload",
        [b"", b"\x00", b"\x00abc\x00\xff\xfe", bytes(range(256)) * 4, "ünï\u2028".encode()],
        ids=["empty", "nul", "nul-mixed", "all-bytes", "utf8"],
    )
    def test_payload_and_blob_bytes_exact(self, backend: Backend, payload: bytes) -> None:
        t = _uid()
        backend.write(_row(t, 1, payload=payload), {"b": payload}, 0)
        got = backend.get(t, "", _cid(1))
        assert got is not None and type(got.payload) is bytes and got.payload == payload
        assert backend.list(t, "")[0].payload == payload
        blobs = backend.get_blobs(t, ["b"])
        assert type(blobs["b"]) is bytes and blobs == {"b": payload}

    def test_large_payload_and_blob(self, backend: Backend) -> None:
        t = _uid()
        payload = bytes(range(256)) * (_MB5 // 256)
        blob = bytes(reversed(payload))
        backend.write(_row(t, 1, payload=payload), {"big": blob}, 0)
        got = backend.get(t, "", _cid(1))
        assert got is not None and got.payload == payload
        assert backend.get_blobs(t, ["big"])["big"] == blob

    def test_parent_and_run_id_none_and_set(self, backend: Backend) -> None:
        t = _uid()
        first = _row(t, 1)
        second = _row(t, 2, parent=_cid(1), run_id="run-ü/1")
        backend.write(first, {}, 0)
        backend.write(second, {}, 1)
        a, b = backend.get(t, "", _cid(1)), backend.get(t, "", _cid(2))
        assert a is not None and a.parent_id is None and a.run_id is None
        assert b is not None and b.parent_id == _cid(1) and b.run_id == "run-ü/1"

    def test_head_row_is_the_head_and_its_row(self, backend: Backend) -> None:
        """``head_row`` (what opening a run reads; by default ``head`` then ``get``) and its
        async twin: None without a head, else the newest head and its row, per namespace."""
        t = _uid()
        assert backend.head_row(t, "") is None
        first, second = _row(t, 1, payload=b"one"), _row(t, 2, parent=_cid(1), run_id="run-b", payload=b"\x00two")
        other = _row(t, 3, namespace="ns2", run_id="run-c")
        backend.write(first, {}, 0)
        assert backend.head_row(t, "") == (Head(_cid(1), 1), first)
        backend.write(second, {"k": b"blob"}, 1)
        backend.write(other, {}, 0)
        assert backend.head_row(t, "") == (Head(_cid(2), 2), second)
        assert backend.head_row(t, "ns2") == (Head(_cid(3), 1), other)
        assert asyncio.run(backend.ahead_row(t, "")) == (Head(_cid(2), 2), second)
        assert asyncio.run(backend.ahead_row(t, "ns3")) is None
        backend.delete_thread(t)
        assert backend.head_row(t, "") is None

    def test_unknown_ids_read_as_none_or_empty(self, backend: Backend) -> None:
        t = _uid()
        assert backend.head(t, "") is None
        assert backend.get(t, "", _cid(1)) is None
        assert backend.list(t, "") == []
        assert backend.get_blobs(t, ["nope"]) == {}
        assert backend.scan_blobs(t, "", "~") == {}
        backend.write(_row(t, 1), {}, 0)
        assert backend.get(t, "", _cid(2)) is None
        assert backend.get(t, "other-ns", _cid(1)) is None

    def test_second_instance_sees_writes(
        self, backend: Backend, open_another: Callable[[], Backend]
    ) -> None:
        t = _uid()
        backend.write(_row(t, 1), {"k": b"v"}, 0)
        other = open_another()
        assert other.head(t, "") == Head(_cid(1), 1)
        assert other.get_blobs(t, ["k"]) == {"k": b"v"}
        other.write(_row(t, 2, parent=_cid(1)), {}, 1)
        assert backend.head(t, "") == Head(_cid(2), 2)

    # -- compare-and-swap ------------------------------------------------------

    def test_versions_count_up_from_zero(self, backend: Backend) -> None:
        t = _uid()
        for i in range(1, 4):
            assert backend.write(_row(t, i), {}, i - 1) == Head(_cid(i), i)
        assert backend.head(t, "") == Head(_cid(3), 3)

    def test_new_thread_needs_expected_zero(self, backend: Backend) -> None:
        t = _uid()
        with pytest.raises(ConflictError) as info:
            backend.write(_row(t, 1), {"k": b"v"}, 1)
        err = info.value
        assert (err.thread_id, err.namespace, err.expected, err.found) == (t, "", 1, 0)
        assert err.found_checkpoint is None
        assert backend.head(t, "") is None and backend.get_blobs(t, ["k"]) == {}
        assert isinstance(err, BackendError)

    @pytest.mark.parametrize("expected", [0, 1, 3, 7])
    def test_wrong_version_conflicts_and_writes_nothing(
        self, backend: Backend, expected: int
    ) -> None:
        t = _uid()
        _write_chain(backend, t, 2, namespace="ns")
        with pytest.raises(ConflictError) as info:
            backend.write(_row(t, 3, namespace="ns"), {"new-blob": b"x"}, expected)
        err = info.value
        assert (err.thread_id, err.namespace, err.expected) == (t, "ns", expected)
        assert (err.found, err.found_checkpoint) == (2, _cid(2))
        assert backend.head(t, "ns") == Head(_cid(2), 2)
        assert backend.get(t, "ns", _cid(3)) is None
        assert [r.checkpoint_id for r in backend.list(t, "ns")] == [_cid(2), _cid(1)]
        assert backend.get_blobs(t, ["new-blob"]) == {}

    @pytest.mark.parametrize("reused", [1, 2])
    def test_reused_checkpoint_id_is_refused_and_writes_nothing(self, backend: Backend, reused: int) -> None:
        t = _uid()
        rows = _write_chain(backend, t, 2)
        again = _row(t, reused, parent=_cid(2), payload=b"overwrite attempt")
        with pytest.raises(BackendError) as info:
            backend.write(again, {"new-blob": b"x"}, 2)
        assert not isinstance(info.value, ConflictError), "the head was at the expected version"
        assert backend.head(t, "") == Head(_cid(2), 2)
        assert backend.list(t, "") == list(reversed(rows))
        if type(backend).atomic_blobs:
            assert backend.get_blobs(t, ["new-blob"]) == {}

    def test_two_writers_same_version_exactly_one_wins(
        self, backend: Backend, open_another: Callable[[], Backend]
    ) -> None:
        instances = [backend, open_another()]
        for _ in range(5):
            t = _uid()
            barrier = threading.Barrier(2, timeout=_JOIN_TIMEOUT)

            def attempt(
                w: int, t: str = t, barrier: threading.Barrier = barrier
            ) -> Head | ConflictError:
                row = _row(t, 1, payload=f"writer {w}".encode())
                barrier.wait()
                try:
                    return instances[w].write(row, {f"blob-{w}": b"x"}, 0)
                except ConflictError as exc:
                    return exc

            with ThreadPoolExecutor(2) as pool:
                results = [
                    f.result(_JOIN_TIMEOUT) for f in [pool.submit(attempt, w) for w in (0, 1)]
                ]
            wins = [w for w, r in enumerate(results) if isinstance(r, Head)]
            assert len(wins) == 1, results
            loser = 1 - wins[0]
            err = results[loser]
            assert isinstance(err, ConflictError) and (err.expected, err.found) == (0, 1)
            stored = backend.get(t, "", _cid(1))
            assert stored is not None and stored.payload == f"writer {wins[0]}".encode()
            if type(backend).atomic_blobs:
                assert backend.get_blobs(t, [f"blob-{loser}"]) == {}
            assert backend.head(t, "") == Head(_cid(1), 1)

    def test_many_threads_on_distinct_thread_ids(self, backend: Backend) -> None:
        ids = [_uid(f"w{w}") for w in range(8)]

        def worker(t: str) -> None:
            _write_chain(backend, t, 25)

        with ThreadPoolExecutor(8) as pool:
            for f in [pool.submit(worker, t) for t in ids]:
                f.result(_JOIN_TIMEOUT)
        for t in ids:
            assert backend.head(t, "") == Head(_cid(25), 25)
            assert len(backend.list(t, "")) == 25

    def test_racing_writers_on_one_thread_lose_no_update(
        self, backend: Backend, open_another: Callable[[], Backend]
    ) -> None:
        t, writers, per_writer = _uid(), 4, 10
        instances = [backend, open_another()]
        barrier = threading.Barrier(writers, timeout=_JOIN_TIMEOUT)

        def worker(w: int) -> int:
            b, landed, conflicts = instances[w % 2], 0, 0
            barrier.wait()
            while landed < per_writer:
                h = b.head(t, "")
                v, parent = (h.version, h.checkpoint_id) if h else (0, None)
                # The id embeds the version it would become, so ids sort in head order.
                row = CheckpointRow(t, "", f"{v + 1:08d}-w{w}", parent, f"w{w}", b"p")
                try:
                    b.write(row, {f"w{w}-{landed}": b"b"}, v)
                    landed += 1
                except ConflictError:
                    conflicts += 1
                    assert conflicts < 10_000, "writer starved"
            return conflicts

        with ThreadPoolExecutor(writers) as pool:
            for f in [pool.submit(worker, w) for w in range(writers)]:
                f.result(_JOIN_TIMEOUT)
        total = writers * per_writer
        head = backend.head(t, "")
        assert head is not None and head.version == total
        rows = backend.list(t, "")
        assert [int(r.checkpoint_id[:8]) for r in rows] == list(range(total, 0, -1))
        for newer, older in itertools.pairwise(rows):
            assert newer.parent_id == older.checkpoint_id  # a chain: nobody was overwritten
        assert rows[-1].parent_id is None and head.checkpoint_id == rows[0].checkpoint_id
        for w in range(writers):
            assert sum(r.run_id == f"w{w}" for r in rows) == per_writer
            keys = [f"w{w}-{i}" for i in range(per_writer)]
            assert set(backend.get_blobs(t, keys)) == set(keys)

    def test_namespaces_have_independent_heads(self, backend: Backend) -> None:
        t = _uid()
        _write_chain(backend, t, 3, namespace="")
        _write_chain(backend, t, 1, namespace="sub")
        assert backend.head(t, "") == Head(_cid(3), 3)
        assert backend.head(t, "sub") == Head(_cid(1), 1)
        assert backend.head(t, "other") is None
        assert len(backend.list(t, "")) == 3 and len(backend.list(t, "sub")) == 1
        with pytest.raises(ConflictError):
            backend.write(_row(t, 2, namespace="sub"), {}, 3)
        assert backend.write(_row(t, 2, namespace="sub"), {}, 1) == Head(_cid(2), 2)

    # -- list ------------------------------------------------------------------

    def test_list_newest_first_with_before_and_limit(self, backend: Backend) -> None:
        t = _uid()
        rows = _write_chain(backend, t, 6)
        ids = [r.checkpoint_id for r in reversed(rows)]
        assert [r.checkpoint_id for r in backend.list(t, "")] == ids
        assert backend.list(t, "") == list(reversed(rows))
        assert [r.checkpoint_id for r in backend.list(t, "", before=_cid(4))] == ids[3:]
        assert [r.checkpoint_id for r in backend.list(t, "", limit=2)] == ids[:2]
        assert backend.list(t, "", limit=0) == []
        assert backend.list(t, "", before=_cid(1)) == []
        assert len(backend.list(t, "", limit=100)) == 6

    def test_list_pagination_walks_every_row_once(self, backend: Backend) -> None:
        t = _uid()
        rows = _write_chain(backend, t, 23)
        seen: list[str] = []
        before: str | None = None
        while page := backend.list(t, "", before=before, limit=5):
            assert len(page) <= 5
            seen += [r.checkpoint_id for r in page]
            before = page[-1].checkpoint_id
        assert seen == [r.checkpoint_id for r in reversed(rows)]

    def test_list_run_id_filter_with_pagination(self, backend: Backend) -> None:
        t = _uid()
        rows = _write_chain(backend, t, 20, runs=3)
        want = [r.checkpoint_id for r in reversed(rows) if r.run_id == "r1"]
        assert [r.checkpoint_id for r in backend.list(t, "", run_id="r1")] == want
        seen: list[str] = []
        before: str | None = None
        while page := backend.list(t, "", run_id="r1", before=before, limit=2):
            assert all(r.run_id == "r1" for r in page)
            seen += [r.checkpoint_id for r in page]
            before = page[-1].checkpoint_id
        assert seen == want
        assert backend.list(t, "", run_id="no-such-run") == []

    # -- blobs -----------------------------------------------------------------

    def test_existing_blob_keeps_original_bytes(self, backend: Backend) -> None:
        t = _uid()
        backend.write(_row(t, 1), {"k": b"original"}, 0)
        backend.write(_row(t, 2, parent=_cid(1)), {"k": b"other", "k2": b"two"}, 1)
        backend.put_blobs(t, {"k": b"third", "k2": b"again"})
        assert backend.get_blobs(t, ["k", "k2"]) == {"k": b"original", "k2": b"two"}

    def test_put_blobs_is_idempotent_and_per_thread(self, backend: Backend) -> None:
        t, u = _uid(), _uid()
        backend.put_blobs(t, {"a": b"1", "b": b""})
        backend.put_blobs(t, {"a": b"1", "b": b""})
        backend.put_blobs(t, {})
        backend.put_blobs(u, {"a": b"u"})
        assert backend.get_blobs(t, ["a", "b"]) == {"a": b"1", "b": b""}
        assert backend.get_blobs(u, ["a", "b"]) == {"a": b"u"}

    def test_get_blobs_with_missing_keys(self, backend: Backend) -> None:
        t = _uid()
        backend.put_blobs(t, {"x": b"1", "y": b"2"})
        assert backend.get_blobs(t, ["x", "missing", "y"]) == {"x": b"1", "y": b"2"}
        assert backend.get_blobs(t, []) == {}
        assert backend.get_blobs(t, ["missing"]) == {}

    def test_scan_blobs_half_open_range(self, backend: Backend) -> None:
        t, other = _uid(), _uid()
        keys = [
            "a",
            "ab",
            "abc",
            "abd",
            "a:",
            "a~",
            "b",
            "seg:0001",
            "seg:0002",
            "seg:0010",
            "seg~",
        ]
        backend.put_blobs(t, {k: k.encode() for k in keys})
        backend.put_blobs(other, {"ab": b"other thread"})
        for start, stop in [
            ("a", "b"),
            ("ab", "abd"),
            ("ab", "ab~"),
            ("abc", "abc"),
            ("a", "a"),
            ("seg:", "seg;"),
            ("seg:0002", "seg:0010"),
            ("", "~"),
            ("c", "z"),
        ]:
            want = {k: k.encode() for k in keys if start <= k < stop}
            assert backend.scan_blobs(t, start, stop) == want, (start, stop)

    # -- threads ---------------------------------------------------------------

    def test_threads_prefix_after_limit(self, backend: Backend) -> None:
        p = _uid("threads") + "/"
        ids = sorted(f"{p}{i:02d}" for i in range(7))
        for t in reversed(ids):
            backend.write(_row(t, 1), {}, 0)
        backend.write(_row(ids[0], 1, namespace="ns2"), {}, 0)  # two heads, listed once
        backend.put_blobs(p + "blobs-only", {"k": b"v"})  # no head: not listed
        assert backend.threads(prefix=p) == ids
        assert backend.threads(prefix=p, after=ids[2]) == ids[3:]
        assert backend.threads(prefix=p, limit=3) == ids[:3]
        assert backend.threads(prefix=p, limit=0) == []
        assert backend.threads(prefix=p + "0") == ids
        assert backend.threads(prefix=p + "zz") == []
        pages: list[str] = []
        after: str | None = None
        while page := backend.threads(prefix=p, after=after, limit=3):
            pages += page
            after = pages[-1]
        assert pages == ids
        everything = backend.threads()
        assert set(ids) <= set(everything) and everything == sorted(everything)

    def test_threads_prefix_is_literal(self, backend: Backend) -> None:
        p = _uid("lit")
        specials = ["a%b", "a_b", "a*b", "a?b", "a[b", "a\\b", "aXb"]
        for s in specials:
            backend.write(_row(p + s, 1), {}, 0)
        for s in specials:
            assert backend.threads(prefix=p + s[:2]) == [p + s], s

    def test_threads_order_is_code_point_order(self, backend: Backend) -> None:
        p = _uid("order")
        ids = [
            p + s
            for s in [
                "B",
                "a",
                "_",
                "Z",
                "\u00e9",
                "e",
                "\u4e2d",
                "\U0001f9f5",
                " ",
                "~",
                "e\u0301",
            ]
        ]
        for t in ids:
            backend.write(_row(t, 1), {}, 0)
        assert backend.threads(prefix=p) == sorted(ids)
        assert backend.threads(prefix=p, after=p + "a") == sorted(t for t in ids if t > p + "a")

    # -- unicode thread ids ------------------------------------------------------

    @pytest.mark.parametrize("kind", list(_ODD_IDS))
    def test_odd_thread_ids_round_trip(self, backend: Backend, kind: str) -> None:
        prefix = _uid("odd")
        suffix = _ODD_IDS[kind]
        t = prefix + (suffix * (512 - len(prefix)) if kind.startswith("long") else suffix)
        assert len(t) <= 512
        backend.write(_row(t, 1, namespace="ns ü"), {"k": b"v"}, 0)
        backend.write(_row(t, 1), {}, 0)
        assert backend.head(t, "ns ü") == Head(_cid(1), 1)
        row = backend.get(t, "ns ü", _cid(1))
        assert row is not None and row.thread_id == t and row.namespace == "ns ü"
        assert [r.thread_id for r in backend.list(t, "ns ü")] == [t]
        assert backend.get_blobs(t, ["k"]) == {"k": b"v"}
        assert backend.scan_blobs(t, "", "~") == {"k": b"v"}
        assert backend.threads(prefix=prefix) == [t]
        assert backend.threads(prefix=t) == [t]
        assert backend.delete_thread(t) is True
        assert backend.threads(prefix=prefix) == [] and backend.head(t, "") is None

    def test_unicode_ids_are_not_normalized(self, backend: Backend) -> None:
        p = _uid("nfc")
        composed, decomposed = p + "\u00e9", p + "e\u0301"
        backend.write(_row(composed, 1), {"k": b"composed"}, 0)
        assert backend.head(decomposed, "") is None
        backend.write(_row(decomposed, 1), {"k": b"decomposed"}, 0)
        assert backend.threads(prefix=p) == sorted([composed, decomposed])
        assert backend.get_blobs(composed, ["k"]) == {"k": b"composed"}

    # -- delete ----------------------------------------------------------------

    def test_delete_thread_removes_everything(self, backend: Backend) -> None:
        p = _uid("del")
        t, neighbour = p, p + "x"  # a thread whose id has t as a prefix must survive
        _write_chain(backend, t, 3, namespace="")
        _write_chain(backend, t, 2, namespace="ns")
        backend.put_blobs(t, {"k": b"v", "seg:1": b"s"})
        _write_chain(backend, neighbour, 1)
        backend.put_blobs(neighbour, {"k": b"n"})
        assert backend.delete_thread(t) is True
        for ns in ("", "ns"):
            assert backend.head(t, ns) is None and backend.list(t, ns) == []
            assert backend.get(t, ns, _cid(1)) is None
        assert backend.get_blobs(t, ["k", "seg:1"]) == {}
        assert backend.scan_blobs(t, "", "~") == {}
        assert backend.threads(prefix=p) == [neighbour]
        assert backend.get_blobs(neighbour, ["k"]) == {"k": b"n"}
        assert backend.head(neighbour, "") == Head(_cid(1), 1)
        assert backend.delete_thread(t) is False

    def test_delete_unknown_and_blob_only_threads(self, backend: Backend) -> None:
        assert backend.delete_thread(_uid()) is False
        t = _uid()
        backend.put_blobs(t, {"k": b"v"})
        assert backend.delete_thread(t) is True
        assert backend.get_blobs(t, ["k"]) == {}

    def test_deleted_thread_starts_again_at_version_zero(self, backend: Backend) -> None:
        t = _uid()
        _write_chain(backend, t, 3)
        backend.put_blobs(t, {"k": b"old"})
        assert backend.delete_thread(t)
        with pytest.raises(ConflictError):
            backend.write(_row(t, 9), {}, 3)
        assert backend.write(_row(t, 9), {"k": b"new"}, 0) == Head(_cid(9), 1)
        assert backend.get_blobs(t, ["k"]) == {"k": b"new"}
        assert [r.checkpoint_id for r in backend.list(t, "")] == [_cid(9)]

    # -- namespaces and rewrite (maintenance) ------------------------------------

    def test_namespaces_sorted_per_thread(self, backend: Backend) -> None:
        if not _implements(backend, "namespaces"):
            pytest.skip(f"{type(backend).__name__} does not implement the optional namespaces()")
        t = _uid()
        assert backend.namespaces(t) == []
        for ns in ("zeta", "", "ünï/ns", "a" * 200):
            _write_chain(backend, t, 1, namespace=ns)
        _write_chain(backend, t + "x", 1, namespace="other")
        assert backend.namespaces(t) == sorted(["zeta", "", "ünï/ns", "a" * 200])
        backend.delete_thread(t)
        assert backend.namespaces(t) == []

    def test_rewrite_replaces_existing_bytes_only(self, backend: Backend) -> None:
        if not type(backend).supports_rewrite:
            pytest.skip(f"{type(backend).__name__} declares supports_rewrite = False")
        t = _uid()
        rows = _write_chain(backend, t, 2, namespace="ns", runs=2)
        backend.put_blobs(t, {"k": b"old", "j": b"keep"})
        head = backend.head(t, "ns")
        new = CheckpointRow(t, "ns", _cid(1), "bogus-parent", "bogus-run", b"new payload")
        missing = CheckpointRow(t, "ns", _cid(7), None, None, b"never")
        other_ns = CheckpointRow(t, "elsewhere", _cid(2), None, None, b"never")
        backend.rewrite(t, [new, missing, other_ns], {"k": b"new", "absent": b"never"})
        got = backend.get(t, "ns", _cid(1))
        assert got is not None and got.payload == b"new payload"
        assert (got.parent_id, got.run_id) == (rows[0].parent_id, rows[0].run_id)
        assert backend.get(t, "ns", _cid(2)) == rows[1]
        assert backend.get(t, "ns", _cid(7)) is None and backend.get(t, "elsewhere", _cid(2)) is None
        assert backend.head(t, "ns") == head
        assert [r.payload for r in backend.list(t, "ns")] == [rows[1].payload, b"new payload"]
        assert backend.get_blobs(t, ["k", "j", "absent"]) == {"k": b"new", "j": b"keep"}
        assert backend.namespaces(t) == ["ns"]
        backend.rewrite(t, [], {})  # nothing to do is fine
        # Blobs written later keep "existing bytes win" semantics.
        backend.put_blobs(t, {"k": b"newer"})
        assert backend.get_blobs(t, ["k"]) == {"k": b"new"}

    def test_rewrite_and_namespaces_async(self, backend: Backend) -> None:
        if not type(backend).supports_rewrite:
            pytest.skip(f"{type(backend).__name__} declares supports_rewrite = False")
        t = _uid()
        _write_chain(backend, t, 1, namespace="a")
        backend.put_blobs(t, {"k": b"v"})

        async def scenario() -> tuple[list[str], CheckpointRow | None, dict[str, bytes]]:
            try:
                await backend.arewrite(t, [_row(t, 1, namespace="a", payload=b"async")], {"k": b"w"})
                got = await backend.aget(t, "a", _cid(1))
                return await backend.anamespaces(t), got, await backend.aget_blobs(t, ["k"])
            finally:
                await backend.aclose()

        namespaces, got, blobs = asyncio.run(scenario())
        assert namespaces == ["a"] and blobs == {"k": b"w"}
        assert got is not None and got.payload == b"async"

    # -- lifecycle -------------------------------------------------------------

    def test_closed_backend_raises_store_closed(
        self, backend: Backend, open_another: Callable[[], Backend]
    ) -> None:
        t = _uid()
        backend.write(_row(t, 1), {}, 0)
        backend.close()
        backend.close()
        b = backend
        calls: list[Callable[[], object]] = [
            lambda: b.write(_row(t, 2), {}, 1),
            lambda: b.put_blobs(t, {"k": b"v"}),
            lambda: b.head(t, ""),
            lambda: b.get(t, "", _cid(1)),
            lambda: b.list(t, ""),
            lambda: b.get_blobs(t, ["k"]),
            lambda: b.scan_blobs(t, "", "~"),
            lambda: b.threads(),
            lambda: b.delete_thread(t),
            lambda: asyncio.run(b.awrite(_row(t, 2), {}, 1)),
            lambda: asyncio.run(b.aput_blobs(t, {})),
            lambda: asyncio.run(b.ahead(t, "")),
            lambda: asyncio.run(b.aget(t, "", _cid(1))),
            lambda: asyncio.run(b.alist(t, "")),
            lambda: asyncio.run(b.aget_blobs(t, ["k"])),
            lambda: asyncio.run(b.ascan_blobs(t, "", "~")),
            lambda: asyncio.run(b.athreads()),
            lambda: asyncio.run(b.adelete_thread(t)),
        ]
        for call in calls:
            with pytest.raises(StoreClosedError):
                call()
        asyncio.run(b.aclose())
        # Closing one instance leaves the storage (and other instances) intact.
        assert open_another().head(t, "") == Head(_cid(1), 1)

    # -- async twins -----------------------------------------------------------

    def test_async_twins_agree_with_sync(
        self, backend: Backend, open_another: Callable[[], Backend]
    ) -> None:
        p = _uid("async")
        t = p + "/1"
        b = backend

        async def scenario() -> None:
            try:
                await body()
            finally:
                # Async resources (pools, clients) belong to this loop: close them in it.
                await backend.aclose()

        async def body() -> None:
            assert await b.awrite(_row(t, 1, run_id="r"), {"a": b"1"}, 0) == Head(_cid(1), 1)
            await b.aput_blobs(t, {"b": b"2", "a": b"ignored"})
            with pytest.raises(ConflictError):
                await b.awrite(_row(t, 2), {}, 0)
            assert await b.ahead(t, "") == b.head(t, "") == Head(_cid(1), 1)
            assert await b.aget(t, "", _cid(1)) == b.get(t, "", _cid(1))
            await b.awrite(_row(t, 2, parent=_cid(1)), {}, 1)
            assert await b.alist(t, "") == b.list(t, "")
            assert await b.alist(t, "", run_id="r", before=_cid(3), limit=1) == b.list(
                t, "", run_id="r", before=_cid(3), limit=1
            )
            assert await b.aget_blobs(t, ["a", "b", "c"]) == {"a": b"1", "b": b"2"}
            assert await b.ascan_blobs(t, "a", "b") == b.scan_blobs(t, "a", "b") == {"a": b"1"}
            assert await b.athreads(prefix=p, after=None, limit=5) == [t]
            assert await b.adelete_thread(t) is True
            assert await b.adelete_thread(t) is False
            assert await b.ahead(t, "") is None

        asyncio.run(scenario())

    def test_async_racing_writers_exactly_one_wins(
        self, backend: Backend, open_another: Callable[[], Backend]
    ) -> None:
        t = _uid()
        racer = open_another()

        async def race() -> list[Head | BaseException]:
            try:
                writes = [racer.awrite(_row(t, 1, payload=bytes([w])), {}, 0) for w in range(4)]
                return await asyncio.gather(*writes, return_exceptions=True)
            finally:
                # Async resources (pools, clients) belong to this loop: close them in it.
                await racer.aclose()

        results = asyncio.run(race())
        assert sum(isinstance(r, Head) for r in results) == 1, results
        assert all(isinstance(r, Head | ConflictError) for r in results), results
        assert backend.head(t, "") == Head(_cid(1), 1)
