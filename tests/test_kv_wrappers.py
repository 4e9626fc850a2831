"""kv and watch through the wrappers (encryption seals values, integrity tags them, offload moves
big ones): the shipped kv and watch suites through each wrapper and all three stacked, opened with
pk.connect's options, and what only a wrapper promises (stored bytes, moved or altered values)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import persistkit as pk
from persistkit import IntegrityError
from persistkit.backends import Backend, open_backend
from persistkit.backends._protocol import KvEntry, KvOp
from persistkit.testing.kv_suite import KvConformance
from persistkit.testing.watch_suite import WatchConformance, seen
from persistkit.wrappers._kv import ValueKv
from persistkit.wrappers._offload import KV_BLOB_THREAD, kv_blob_thread

ENC_KEY = bytes(range(32))
INT_KEY = bytes(range(64, 96))
THRESHOLD = 512  # the suites' 768-byte and 1 MB values go to the blob store
SECRET = b"PLANTED-KV-SECRET-51c0"

WRAPS = ["encryption", "integrity", "offload", "stacked"]
#: the configurations that authenticate values (offload alone only checks the object's hash)
SEALING = ["encryption", "integrity", "stacked"]


def _primary_url(kind: str, tmp_path: Path) -> str:
    if kind == "memory":
        return f"memory://kvwrap-{uuid.uuid4().hex[:10]}"
    return f"sqlite:///{tmp_path}/store.db"


def _options(wrap: str, blob_url: str) -> dict[str, Any]:
    offload = {"blobs": blob_url, "blob_threshold": THRESHOLD}
    return {
        "encryption": {"encryption": ENC_KEY},
        "integrity": {"integrity": INT_KEY},
        "offload": offload,
        "stacked": {**offload, "encryption": ENC_KEY, "integrity": INT_KEY},
    }[wrap]


@pytest.fixture(params=["memory", "sqlite"])
def persistkit_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return _primary_url(request.param, tmp_path)


@pytest.fixture
def blob_url(persistkit_url: str, tmp_path: Path) -> str:
    if persistkit_url.startswith("memory:"):
        return f"memory://kvwrap-blobs-{uuid.uuid4().hex[:10]}"
    return f"sqlite:///{tmp_path}/blobs.db"


class _Wrapped:
    """The suites' two instances of the store, each opened with pk.connect(url, **options)."""

    @pytest.fixture(params=WRAPS)
    def backend_options(self, request: pytest.FixtureRequest, blob_url: str) -> dict[str, Any]:
        return _options(request.param, blob_url)

    @pytest.fixture
    def backend(self, persistkit_url: str, backend_options: dict[str, Any]) -> Iterator[Backend]:
        store = pk.connect(persistkit_url, **backend_options)
        if not store.backend.supports_kv:
            store.close()
            pytest.skip(f"{persistkit_url.partition(':')[0]} has no kv capability on this branch")
        yield store.backend
        store.close()

    @pytest.fixture
    def other(self, persistkit_url: str, backend_options: dict[str, Any]) -> Iterator[Backend]:
        store = pk.connect(persistkit_url, **backend_options)
        yield store.backend
        store.close()


class TestWrappedKv(_Wrapped, KvConformance):
    def test_the_suite_runs_through_the_wrappers(self, backend: Backend, backend_options: dict[str, Any]) -> None:
        layers, node = [], backend
        while isinstance(node, ValueKv):
            layers.append(type(node).__name__)
            node = node.kv_inner()
        assert len(layers) == sum(k in backend_options for k in ("encryption", "integrity", "blobs")) > 0


class TestWrappedWatch(_Wrapped, WatchConformance):
    pass


# -- what the wrappers promise beyond the suites -----------------------------------------


@pytest.fixture
def scope() -> str:
    return f"kvw_{uuid.uuid4().hex[:16]}"


def _open(url: str, blob_url: str, wrap: str) -> tuple[Backend, Backend, Backend]:
    """(the wrapped store, the primary store itself, the blob store itself)."""
    wrapped = pk.connect(url, **_options(wrap, blob_url)).backend
    raw, blobs = open_backend(url), open_backend(blob_url)
    if not raw.supports_kv:
        for b in (wrapped, raw, blobs):
            b.close()
        pytest.skip(f"{url.partition(':')[0]} has no kv capability on this branch")
    return wrapped, raw, blobs


@pytest.fixture(params=WRAPS)
def wrap(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=SEALING)
def sealing(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def opened(persistkit_url: str, blob_url: str, request: pytest.FixtureRequest) -> Iterator[tuple[Backend, Backend, Backend]]:
    name = "sealing" if "sealing" in request.fixturenames else "wrap"
    stores = _open(persistkit_url, blob_url, request.getfixturevalue(name))
    yield stores
    for b in stores:
        b.close()


def stored_form(backend: Backend, scope: str, ops: list[KvOp]) -> list[KvOp]:
    """``ops`` as the wrapper stack would hand them to the store itself (every layer's seal)."""
    node: Any = backend
    while isinstance(node, ValueKv):
        ops = node._kv_seal(scope, ops)
        node = node.kv_inner()
    return ops


def test_stored_bytes_never_hold_the_plaintext(
    wrap: str, opened: tuple[Backend, Backend, Backend], scope: str
) -> None:
    backend, raw, blobs = opened
    small, big = SECRET * 4, SECRET * 1000
    backend.kv_write(scope, [KvOp("small", 0, small), KvOp("big", 0, big)], keep=3)
    backend.kv_write(scope, [KvOp("small", 1, small + b"2")], keep=3)
    assert backend.kv_get(scope, "small") == KvEntry("small", 2, small + b"2")
    assert backend.kv_get(scope, "big") == KvEntry("big", 1, big)
    stored = [e.value or b"" for k in ("small", "big") for e in raw.kv_history(scope, k)]
    objects = list(blobs.scan_blobs(kv_blob_thread(scope), "", "\x7f").values())
    assert len(stored) == 3
    if wrap in ("encryption", "stacked"):  # sealed in the store and in the blob store
        assert not [v for v in stored + objects if SECRET in v]
    if wrap in ("offload", "stacked"):  # only the big value moved; the store keeps its pointer
        assert len(objects) == 1 and all(len(v) < 200 for v in stored)
    if wrap == "offload":
        assert SECRET in objects[0]  # offload alone moves bytes, it does not seal them


def test_a_value_copied_to_another_key_or_version_is_refused(
    sealing: str, opened: tuple[Backend, Backend, Backend], scope: str
) -> None:
    backend, raw, _ = opened
    backend.kv_write(scope, [KvOp("a", 0, b"alpha"), KvOp("b", 0, b"beta")], keep=5)
    a1 = raw.kv_get(scope, "a")
    assert a1 is not None and a1.value is not None
    raw.kv_write(scope, [KvOp("b", 1, a1.value)], keep=5)  # a's sealed bytes, as b's version 2
    with pytest.raises(IntegrityError, match="'b'"):
        backend.kv_get(scope, "b")
    with pytest.raises(IntegrityError, match="'b'"):
        backend.kv_list(scope)
    raw.kv_write(scope, [KvOp("a", 1, a1.value)], keep=5)  # a's version 1, replayed as its version 2
    with pytest.raises(IntegrityError, match="key 'a' version 2"):
        backend.kv_get(scope, "a")
    assert backend.kv_get(scope, "a", version=1) == KvEntry("a", 1, b"alpha")  # in its place it opens
    with pytest.raises(IntegrityError):
        backend.kv_history(scope, "a")


def test_a_flipped_bit_is_refused_and_the_untouched_bytes_open(
    sealing: str, opened: tuple[Backend, Backend, Backend], scope: str
) -> None:
    backend, raw, _ = opened
    first = stored_form(backend, scope, [KvOp("k", 0, b"the value")])[0]
    second = stored_form(backend, scope, [KvOp("k", 1, b"the next value")])[0]
    assert second.value is not None
    for i in (len(second.value) - 1, len(second.value) // 2, 5):
        flipped = bytearray(second.value)
        flipped[i] ^= 0x04
        raw.kv_drop(scope)
        raw.kv_write(scope, [first], keep=5)
        raw.kv_write(scope, [KvOp("k", 1, bytes(flipped))], keep=5)
        with pytest.raises(IntegrityError, match=r"kv scope .* key 'k' version 2"):
            backend.kv_get(scope, "k")
        assert backend.kv_get(scope, "k", version=1) == KvEntry("k", 1, b"the value")
    raw.kv_drop(scope)
    raw.kv_write(scope, [first], keep=5)
    raw.kv_write(scope, [second], keep=5)  # the same bytes untouched: they open
    assert backend.kv_get(scope, "k") == KvEntry("k", 2, b"the next value")


def test_integrity_refuses_a_delete_written_without_the_key(
    persistkit_url: str, blob_url: str, scope: str
) -> None:
    backend, raw, blobs = _open(persistkit_url, blob_url, "integrity")
    try:
        backend.kv_write(scope, [KvOp("gone", 0, b"v"), KvOp("kept", 0, b"v")], keep=5)
        backend.kv_write(scope, [KvOp("kept", 1, None)], keep=5)  # a delete through the wrapper
        assert backend.kv_get(scope, "kept") == KvEntry("kept", 2, None)
        raw.kv_write(scope, [KvOp("gone", 1, None)], keep=5)  # a bare tombstone: forged
        with pytest.raises(IntegrityError, match="delete that carries no integrity tag"):
            backend.kv_get(scope, "gone")
        with pytest.raises(IntegrityError):
            backend.kv_history(scope, "gone")
    finally:
        for b in (backend, raw, blobs):
            b.close()


def test_plaintext_values_are_refused_unless_accepted(persistkit_url: str, blob_url: str, scope: str) -> None:
    backend, raw, blobs = _open(persistkit_url, blob_url, "encryption")
    migrating = pk.connect(persistkit_url, encryption=ENC_KEY, accept_plaintext=True).backend
    try:
        raw.kv_write(scope, [KvOp("old", 0, b"written before encryption")], keep=2)
        with pytest.raises(IntegrityError, match="not encrypted"):
            backend.kv_get(scope, "old")
        assert migrating.kv_get(scope, "old") == KvEntry("old", 1, b"written before encryption")
        migrating.kv_write(scope, [KvOp("old", 1, b"new")], keep=2)  # new values are always sealed
        assert backend.kv_get(scope, "old") == KvEntry("old", 2, b"new")
        stored = raw.kv_get(scope, "old")
        assert stored is not None and stored.value is not None and stored.value[:1] == b"\xe1"
    finally:
        for b in (backend, raw, blobs, migrating):
            b.close()


def test_a_5mb_value_round_trips_through_offload_and_leaves_a_pointer(
    persistkit_url: str, blob_url: str, scope: str
) -> None:
    backend = pk.connect(persistkit_url, blobs=blob_url).backend  # the default threshold (256 KiB)
    raw, blobs = open_backend(persistkit_url), open_backend(blob_url)
    try:
        if not raw.supports_kv:
            pytest.skip("no kv capability on this branch")
        big = bytes(i % 253 for i in range(5 * 1024 * 1024))
        backend.kv_write(scope, [KvOp("huge", 0, big)], keep=2)
        assert backend.kv_get(scope, "huge") == KvEntry("huge", 1, big)
        assert [e.value for e in backend.kv_list(scope)] == [big]
        stored = raw.kv_get(scope, "huge")
        assert stored is not None and stored.value is not None and len(stored.value) < 200
        assert list(blobs.scan_blobs(kv_blob_thread(scope), "", "\x7f").values()) == [big]
        listed = backend.threads() + blobs.threads()
        assert not [t for t in listed if t.startswith(KV_BLOB_THREAD)]  # no head: never a thread
        backend.kv_write(scope, [KvOp("huge", 1, None)], keep=1)  # the object stays until the drop
        assert blobs.scan_blobs(kv_blob_thread(scope), "", "\x7f")
        assert backend.kv_drop(scope) is True
        assert blobs.scan_blobs(kv_blob_thread(scope), "", "\x7f") == {}
    finally:
        for b in (backend, raw, blobs):
            b.close()


def test_a_missing_offloaded_object_is_an_integrity_error(persistkit_url: str, blob_url: str, scope: str) -> None:
    backend, raw, blobs = _open(persistkit_url, blob_url, "offload")
    try:
        backend.kv_write(scope, [KvOp("big", 0, b"x" * (THRESHOLD + 1))], keep=1)
        blobs.delete_thread(kv_blob_thread(scope))
        with pytest.raises(IntegrityError, match="key 'big' version 1 was offloaded"):
            backend.kv_get(scope, "big")
    finally:
        for b in (backend, raw, blobs):
            b.close()


def test_another_process_writes_through_the_same_wrappers(tmp_path: Path, scope: str) -> None:
    """The watch suite skips its child process under options; here the child opens the stack too."""
    url, blob_url = _primary_url("sqlite", tmp_path), f"sqlite:///{tmp_path}/blobs.db"
    backend, raw, blobs = _open(url, blob_url, "stacked")
    watch = backend.watch_open(scope)
    code = (
        "import sys; import persistkit as pk; from persistkit.backends._protocol import KvOp\n"
        "s = pk.connect(sys.argv[1], blobs=sys.argv[2], blob_threshold=int(sys.argv[3]),\n"
        "               encryption=bytes.fromhex(sys.argv[4]), integrity=bytes.fromhex(sys.argv[5]))\n"
        "s.backend.kv_write(sys.argv[6], [KvOp('child', 0, b'from the child ' * 100)], keep=1); s.close()\n"
    )
    try:
        subprocess.run(
            [sys.executable, "-c", code, url, blob_url, str(THRESHOLD), ENC_KEY.hex(), INT_KEY.hex(), scope],
            check=True, timeout=120,
        )
        assert seen(watch, backend, scope, "child", 1)
        assert backend.kv_get(scope, "child") == KvEntry("child", 1, b"from the child " * 100)
        stored = raw.kv_get(scope, "child")
        assert stored is not None and stored.value is not None and len(stored.value) < 200  # offloaded
    finally:
        watch.close()
        for b in (backend, raw, blobs):
            b.close()


@pytest.mark.parametrize("sealed", ["encryption", "integrity", "encryption+integrity"])
def test_an_offloaded_value_read_without_blobs_names_blobs(
    sealed: str, persistkit_url: str, blob_url: str, scope: str
) -> None:
    """Encryption and integrity sit above offload: without blobs= they meet its pointer, which
    is a missing option (pk.StoreOptionsError naming blobs=), not a forged value."""
    from persistkit.wrappers import _offload, _options

    assert _options.MARKER == _offload._MARKER  # the pointer the wrappers above offload recognize
    keys: dict[str, Any] = {"encryption": ENC_KEY, "integrity": INT_KEY}
    options = {name: keys[name] for name in sealed.split("+")}
    with pk.connect(persistkit_url, blobs=blob_url, blob_threshold=THRESHOLD, **options) as writer:
        writer.backend.kv_write(scope, [KvOp("big", 0, SECRET * 1000)], keep=3)
        with pk.connect(persistkit_url, **options) as half:
            for read in (lambda: half.backend.kv_get(scope, "big"), lambda: half.backend.kv_history(scope, "big")):
                with pytest.raises(pk.StoreOptionsError, match="without blobs=") as info:
                    read()
                assert "forged" not in str(info.value) and "'big'" in str(info.value), info.value
        assert writer.backend.kv_get(scope, "big") == KvEntry("big", 1, SECRET * 1000)
