"""Encryption at rest: sealed records on every store, moved/forged records refused, rotation."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import BACKENDS, make_url, uid

import persistkit as pk
from persistkit import ConfigurationError, IntegrityError, KeyRing
from persistkit.__main__ import main as cli
from persistkit.backends import Backend, CheckpointRow, open_backend
from persistkit.secrets import _registry
from persistkit.secrets._handlekey import HANDLE_BLOB, HANDLE_THREAD
from persistkit.testing.backend_suite import BackendConformance
from persistkit.testing.store_suite import StoreConformance
from persistkit.wrappers._encryption import EncryptedBackend, key_id_of

KEY_A = bytes(range(32))
KEY_B = bytes(range(100, 132))
MARKER = "PLANTED-MARKER-7f3a9c"


def ring(*ids: str, active: str | None = None) -> KeyRing:
    keys = {"A": KEY_A, "B": KEY_B}
    return KeyRing({i: keys[i] for i in ids}, active=active)


def raw_dump(backend: Backend, threads: list[str]) -> list[tuple[str, bytes]]:
    """Every row payload and blob the store holds for ``threads``, as stored."""
    out: list[tuple[str, bytes]] = []
    for t in threads:
        for ns in backend.namespaces(t):
            out += [(f"row {t} {r.checkpoint_id}", r.payload) for r in backend.list(t, ns)]
        out += [(f"blob {t} {k}", v) for k, v in backend.scan_blobs(t, "", "\x7f").items()]
    return out


def planted(data: bytes) -> bool:
    forms = [
        MARKER.encode(),
        MARKER.encode().hex().encode(),
        base64.b64encode(MARKER.encode())[:16],
    ]
    return any(f in data for f in forms)


def run_agent(store: pk.Store, tid: str, calls: dict[str, int], *, fail_at: int = -1) -> list[str]:
    @pk.checkpointed
    def step(i: int) -> str:
        calls[f"s{i}"] = calls.get(f"s{i}", 0) + 1
        if i == fail_at:
            raise TimeoutError("flaky tool")
        run = pk.current_run()
        assert run is not None
        run.state["messages"] = [
            *run.state.get("messages", []),
            f"{MARKER} message {i} " + "x" * 300,
        ]
        return f"{MARKER}-result-{i}"

    with pk.resume(tid, store=store) as run:
        run.state["secret_note"] = MARKER * 40  # large enough to become a channel blob
        return [step(i) for i in range(4)]


# -- every store -------------------------------------------------------------------


def test_agent_round_trip_and_no_plaintext_at_rest(store_url: str) -> None:
    store = pk.connect(store_url, encryption=ring("A"))
    raw = open_backend(store_url)
    try:
        tid, calls = uid("enc"), {}
        with pytest.raises(TimeoutError):
            run_agent(store, tid, calls, fail_at=2)
        assert run_agent(store, tid, calls) == [f"{MARKER}-result-{i}" for i in range(4)]
        assert calls == {
            "s0": 1,
            "s1": 1,
            "s2": 2,
            "s3": 1,
        }  # finished steps replayed from ciphertext
        state = store.get_state(tid)
        assert state["secret_note"] == MARKER * 40 and len(state["messages"]) == 4
        history = store.history(tid)
        assert (
            len(history) >= 5
            and history[0].checkpoint_id == store.get_checkpoint(tid).checkpoint_id
        )
        fork = store.fork(tid, update={"extra": 1})
        assert store.get_state(fork.thread_id)["extra"] == 1
        dump = raw_dump(raw, [tid, fork.thread_id])
        assert any(what.startswith("blob") for what, _ in dump)
        assert dump and all(data[0] == 0xE1 and key_id_of(data) == "A" for _, data in dump)
        assert not [what for what, data in dump if planted(data)]
    finally:
        store.close()
        raw.close()


def test_rotation_then_old_key_dropped(store_url: str) -> None:
    tid, calls = uid("rot"), {}
    with pk.connect(store_url, encryption=ring("A")) as store:
        run_agent(store, tid, calls)
        before = store.get_state(tid)
    with pk.connect(store_url, encryption=ring("A", "B")) as store:
        report = store.rotate_keys(tid, batch_size=2)
        assert report.active_key == "B" and report.rows_resealed >= 5 and report.blobs_resealed >= 1
        assert report.last_thread == tid and report.threads == 1
        again = store.rotate_keys(tid)  # idempotent: nothing left under A
        assert (
            again.rows_resealed == again.blobs_resealed == 0
            and again.rows_skipped == report.rows_resealed
        )
    with pk.connect(store_url, encryption=ring("B")) as store:
        assert store.get_state(tid) == before
        assert run_agent(store, tid, calls) == [f"{MARKER}-result-{i}" for i in range(4)]
    raw = open_backend(store_url)
    try:
        assert all(key_id_of(data) == "B" for _, data in raw_dump(raw, [tid]))
    finally:
        raw.close()


# -- a detected secret's handle key: the store's own blob (thread '__persistkit__') ------------

TOKEN = "ghp_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3z5A"  # detected (GitHub-style), in no variable


@pytest.fixture(params=BACKENDS)
def whole_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store of its own on every backend (a store-wide rotation lists every thread)."""
    return make_url(request.param, request, tmp_path_factory, isolated=True)


def token_agent(store: pk.Store, tid: str, *, crash_at: int = -1) -> list[str]:
    """A step returns TOKEN (stored as a detected secret's handle); ``use`` crashes at ``crash_at``."""

    @pk.checkpointed
    def get_token() -> str:
        return TOKEN

    @pk.checkpointed
    def use(tok: str, i: int) -> str:
        assert tok == TOKEN, f"handed {tok[:24]!r}"
        if i == crash_at:
            raise KeyboardInterrupt("process killed")
        return f"ok {i}"

    with pk.resume(tid, store=store, state={"tok": ""}) as run:
        tok = get_token()
        run.state["tok"] = tok
        return [use(tok, i) for i in range(3)]


def crashed_token_run(url: str) -> str:
    tid = uid("hk")
    with pk.connect(url, encryption=ring("A")) as store, pytest.raises(KeyboardInterrupt):
        token_agent(store, tid, crash_at=1)
    _registry._memory.clear()  # a new process: it never redacted the token itself
    return tid


@pytest.fixture
def registered_token() -> Iterator[None]:
    yield
    pk.secrets.unregister("gh")
    _registry._memory.clear()


def test_rotation_reseals_the_handle_key_of_detected_secrets(whole_url: str, registered_token: None) -> None:
    """Before: rotate_keys walked threads() only, the handle key (a blob of the headless reserved
    thread) stayed under the retired key, and the resume failed with SecretResolutionError."""
    tid = crashed_token_run(whole_url)
    with pk.connect(whole_url, encryption=ring("A", "B")) as store:
        report = store.rotate_keys()
        assert report.threads == 1 and report.blobs_resealed >= 1, report
        again = store.rotate_keys()
        assert again.rows_resealed == again.blobs_resealed == 0 and again.blobs_skipped == report.blobs_resealed
    raw = open_backend(whole_url)
    try:
        assert key_id_of(raw.get_blobs(HANDLE_THREAD, [HANDLE_BLOB])[HANDLE_BLOB]) == "B"
    finally:
        raw.close()
    pk.secrets.register("gh", TOKEN)
    with pk.connect(whole_url, encryption=ring("B")) as store:
        assert token_agent(store, tid) == ["ok 0", "ok 1", "ok 2"]  # every use() was handed TOKEN


def test_a_handle_key_under_a_retired_key_is_an_integrity_error(local_url: str, registered_token: None) -> None:
    """A rotation of one thread leaves the store's handle key under the retired key. Before: the
    unreadable key was logged and replaced by a per-process key (it still is), and the resume failed with a SecretResolutionError that did not name the missing key."""
    tid = crashed_token_run(local_url)
    with pk.connect(local_url, encryption=ring("A", "B")) as store:
        assert store.rotate_keys(tid).rows_resealed >= 1  # one thread: the store's own blobs stay under A
    pk.secrets.register("gh", TOKEN)
    with pk.connect(local_url, encryption=ring("B")) as store:
        assert store.get_state(tid)["tok"].startswith("$CRED{github-")  # loading needs no value
        with pytest.raises(IntegrityError, match=r"not run\..*handle key.*key id 'A', which is not in the key ring"):
            token_agent(store, tid)  # the live call that would be handed the handle


def test_migrating_a_plaintext_store_seals_its_handle_key(local_url: str, registered_token: None) -> None:
    """The handle key written in plaintext is sealed by the migration, as a record is (and
    refused without encrypt_plaintext=True, as a record is)."""
    tid = uid("hkplain")
    with pk.connect(local_url) as plain, pytest.raises(KeyboardInterrupt):
        token_agent(plain, tid, crash_at=1)
    _registry._memory.clear()
    with pk.connect(local_url, encryption=ring("A"), accept_plaintext=True) as store:
        with pytest.raises(IntegrityError, match=r"'__persistkit__' blob 'k:handle-key' is not encrypted.*encrypt_plaintext=True"):
            store.rotate_keys()
        report = store.rotate_keys(encrypt_plaintext=True)
        assert report.threads == 1 and report.plaintext_sealed == report.rows_resealed + report.blobs_resealed
        assert report.blobs_resealed >= 1
    pk.secrets.register("gh", TOKEN)
    with pk.connect(local_url, encryption=ring("A")) as store:
        assert token_agent(store, tid) == ["ok 0", "ok 1", "ok 2"]


# -- tampering, moved ciphertext, keys (memory + sqlite) ----------------------------------


@pytest.fixture(params=["memory", "sqlite"])
def local_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_url(request.param, request, tmp_path_factory)


@pytest.fixture
def pair(local_url: str) -> Iterator[tuple[pk.Store, Backend]]:
    store, raw = pk.connect(local_url, encryption=ring("A")), open_backend(local_url)
    yield store, raw
    store.close()
    raw.close()


def _two_threads(store: pk.Store) -> tuple[str, str]:
    a, b = uid("a"), uid("b")
    for t in (a, b):
        run_agent(store, t, {})
    return a, b


def test_row_moved_to_another_thread_or_checkpoint_is_refused(
    pair: tuple[pk.Store, Backend],
) -> None:
    store, raw = pair
    a, b = _two_threads(store)
    src = raw.list(a, "")[0]
    dst = raw.list(b, "")[0]
    raw.rewrite(b, [CheckpointRow(b, "", dst.checkpoint_id, None, None, src.payload)], {})
    with pytest.raises(IntegrityError) as info:
        store.get_state(b)
    assert repr(b) in str(info.value) and dst.checkpoint_id in str(info.value)
    # within one thread: an older checkpoint's ciphertext put in the place of the newest
    older = raw.list(a, "")[1]
    raw.rewrite(a, [CheckpointRow(a, "", src.checkpoint_id, None, None, older.payload)], {})
    with pytest.raises(IntegrityError, match=src.checkpoint_id):
        store.history(a)


def test_blob_moved_to_another_key_is_refused(pair: tuple[pk.Store, Backend]) -> None:
    store, raw = pair
    a, b = _two_threads(store)
    (key, sealed), *_ = raw.scan_blobs(a, "", "\x7f").items()
    raw.put_blobs(a, {"v:0123456789abcdef": sealed})  # same thread, another key
    with pytest.raises(IntegrityError) as info:
        store.backend.get_blobs(a, ["v:0123456789abcdef"])
    assert "'v:0123456789abcdef'" in str(info.value) and repr(a) in str(info.value)
    raw.rewrite(b, [], {key: sealed})  # same key, another thread (b's own bytes replaced)
    with pytest.raises(IntegrityError) as info:
        store.get_state(b)
    assert repr(key) in str(info.value) and repr(b) in str(info.value)
    assert store.get_state(a)["secret_note"] == MARKER * 40


def test_flipped_bit_is_refused(pair: tuple[pk.Store, Backend]) -> None:
    store, raw = pair
    a, _ = _two_threads(store)
    row = raw.list(a, "")[0]
    bad = bytearray(row.payload)
    bad[-5] ^= 1
    raw.rewrite(a, [CheckpointRow(a, "", row.checkpoint_id, None, None, bytes(bad))], {})
    with pytest.raises(IntegrityError, match="failed authentication"):
        store.get_checkpoint(a)


def test_wrong_key_and_unknown_key_id(local_url: str) -> None:
    tid = uid()
    with pk.connect(local_url, encryption=ring("A")) as store:
        run_agent(store, tid, {})
    wrong = KeyRing({"A": KEY_B})  # right id, wrong key
    with pk.connect(local_url, encryption=wrong) as store, pytest.raises(IntegrityError) as info:
        store.get_state(tid)
    assert "failed authentication" in str(info.value)
    with (
        pk.connect(local_url, encryption=ring("B")) as store,
        pytest.raises(IntegrityError) as info,
    ):
        store.get_state(tid)
    text = str(info.value)
    assert "'A'" in text and "not in the key ring" in text and repr(tid) in text
    for key in (KEY_A, KEY_B):  # key material never appears in messages or reprs
        for form in (base64.b64encode(key).decode(), key.hex()):
            assert form not in text and form not in repr(wrong) and form not in repr(store.backend)


def test_fetch_callback_supplies_retired_keys(local_url: str) -> None:
    tid = uid()
    with pk.connect(local_url, encryption=ring("A")) as store:
        run_agent(store, tid, {})
    asked: list[str] = []

    def kms(key_id: str) -> bytes | None:
        asked.append(key_id)
        return KEY_A if key_id == "A" else None

    with pk.connect(local_url, encryption=KeyRing({"B": KEY_B}, fetch=kms)) as store:
        assert store.get_state(tid)["secret_note"] == MARKER * 40
    assert asked == ["A"]


# -- rotation details ----------------------------------------------------------------------


def test_interrupted_rotation_resumes(local_url: str) -> None:
    tids = [uid("i") for _ in range(3)]
    with pk.connect(local_url, encryption=ring("A")) as store:
        for t in tids:
            run_agent(store, t, {})
    store = pk.connect(local_url, encryption=ring("A", "B"))
    enc = store.backend
    assert isinstance(enc, EncryptedBackend)
    real = enc.inner.rewrite
    done: list[int] = []

    def crash_after_three(thread_id: str, rows: Any, blobs: Any) -> None:
        if len(done) == 3:
            raise KeyboardInterrupt("operator pressed ^C")
        done.append(1)
        real(thread_id, rows, blobs)

    enc.inner.rewrite = crash_after_three  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        store.rotate_keys(batch_size=2)
    enc.inner.rewrite = real  # type: ignore[method-assign]
    report = store.rotate_keys(batch_size=2)
    assert report.rows_skipped >= 1 and report.rows_resealed >= 1
    assert store.rotate_keys().rows_resealed == 0
    store.close()
    with pk.connect(local_url, encryption=ring("B")) as only_b:
        for t in tids:
            assert only_b.get_state(t)["secret_note"] == MARKER * 40


def test_store_wide_rotation_pages_threads_with_after(local_url: str) -> None:
    prefix = uid("page")
    tids = sorted(f"{prefix}-{i}" for i in range(5))
    with pk.connect(local_url, encryption=ring("A")) as store:
        for t in tids:
            store.update_state(t, {"note": MARKER})
    with pk.connect(local_url, encryption=ring("A", "B")) as store:
        part = store.rotate_keys(tids[1])
        assert part.threads == 1 and part.last_thread == tids[1]
        rest = store.rotate_keys(after=tids[1], batch_size=2)
        assert rest.last_thread is not None and rest.last_thread >= tids[-1]
    with pk.connect(local_url, encryption=ring("B")) as store:
        assert [store.get_state(t)["note"] for t in tids[1:]] == [MARKER] * 4
        with pytest.raises(IntegrityError):
            store.get_state(tids[0])  # before the cursor: still under A


def test_plaintext_refused_then_migrated(local_url: str) -> None:
    tid = uid("plain")
    with pk.connect(local_url) as plain:
        run_agent(plain, tid, {})
        expected = plain.get_state(tid)
    with pk.connect(local_url, encryption=ring("A")) as store:
        with pytest.raises(IntegrityError, match="accept_plaintext=True"):
            store.get_state(tid)
        with pytest.raises(IntegrityError, match="encrypt_plaintext=True"):
            store.rotate_keys(tid)
    with pk.connect(local_url, encryption=ring("A"), accept_plaintext=True) as store:
        assert store.get_state(tid) == expected
        report = store.rotate_keys(tid, encrypt_plaintext=True)
        assert report.plaintext_sealed == report.rows_resealed + report.blobs_resealed > 0
    with pk.connect(local_url, encryption=ring("A")) as store:
        assert store.get_state(tid) == expected
    raw = open_backend(local_url)
    try:
        assert not [what for what, data in raw_dump(raw, [tid]) if planted(data)]
    finally:
        raw.close()


def test_async_agent_and_rotation(local_url: str) -> None:
    tid = uid("async")

    @pk.checkpointed
    async def fetch(i: int) -> str:
        await asyncio.sleep(0)
        return f"{MARKER}-{i}"

    async def main() -> tuple[list[str], pk.RotationReport, dict[str, Any]]:
        async with (
            pk.connect(local_url, encryption=ring("A")) as store,
            pk.resume(tid, store=store) as run,
        ):
            run.state["note"] = MARKER
            out = list(await asyncio.gather(*(fetch(i) for i in range(3))))
        async with pk.connect(local_url, encryption=ring("A", "B")) as store:
            report = await store.arotate_keys(tid)
        async with pk.connect(local_url, encryption=ring("B")) as store:
            state = await store.aget_state(tid)
        return out, report, state

    out, report, state = asyncio.run(main())
    assert out == [f"{MARKER}-{i}" for i in range(3)]
    assert report.rows_resealed >= 1 and state["note"] == MARKER


# -- wiring and CLI --------------------------------------------------------------------------


def test_connect_options_are_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="not accepted inline"):
        pk.connect("memory://", encryption=base64.b64encode(KEY_A).decode())
    with pytest.raises(ConfigurationError, match="only applies together"):
        pk.connect("memory://", accept_plaintext=True)
    with pytest.raises(ConfigurationError, match="not encrypted"):
        pk.connect("memory://").rotate_keys()
    monkeypatch.setenv("PERSISTKIT_ENCRYPTION_KEYS", f"A:{base64.b64encode(KEY_A).decode()}")
    with pk.connect("memory://", encryption=True) as store:
        assert (
            isinstance(store.backend, EncryptedBackend) and store.backend.keyring.active_id == "A"
        )
    keyfile = tmp_path / "keys"
    keyfile.write_text(f"A:{KEY_A.hex()}\nB:{base64.b64encode(KEY_B).decode()}\n")
    with pk.connect("memory://", encryption=f"file:{keyfile}") as store:
        assert (
            isinstance(store.backend, EncryptedBackend) and store.backend.keyring.active_id == "B"
        )


def test_cli_keygen_and_rotate_keys(
    local_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli(["keygen", "--id", "k2027"]) == 0
    entry = capsys.readouterr().out.strip()
    kid, _, key = entry.partition(":")
    assert kid == "k2027" and len(base64.b64decode(key)) == 32
    tid = uid("cli")
    with pk.connect(local_url, encryption=ring("A")) as store:
        run_agent(store, tid, {})
    keyfile = tmp_path / "keys"
    keyfile.write_text(f"A:{base64.b64encode(KEY_A).decode()}\n{entry}\n")
    assert cli(["rotate-keys", local_url, "--thread", tid, "--keys", f"file:{keyfile}"]) == 0
    out = capsys.readouterr().out
    assert (
        "active key k2027" in out and key not in out and base64.b64encode(KEY_A).decode() not in out
    )
    monkeypatch.setenv("PERSISTKIT_ENCRYPTION_KEYS", entry)
    with pk.connect(local_url, encryption=True) as store:
        assert store.get_state(tid)["secret_note"] == MARKER * 40
    with pytest.raises(SystemExit, match="never key text"):
        cli(["rotate-keys", local_url, "--keys", "A:notallowed"])


def test_cli_rotate_keys_reports_the_store_blobs_it_resealed(
    local_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], registered_token: None
) -> None:
    """Before: ``blobs_resealed: 0`` with the handle key left under the old key."""
    tid = crashed_token_run(local_url)
    raw = open_backend(local_url)
    try:
        sealed = [k for t in (tid, HANDLE_THREAD) for k, v in raw.scan_blobs(t, "", "\x7f").items() if key_id_of(v) == "A"]
        assert HANDLE_BLOB in sealed
        keyfile = tmp_path / "keys"
        keyfile.write_text(f"A:{base64.b64encode(KEY_A).decode()}\nB:{base64.b64encode(KEY_B).decode()}\n")
        capsys.readouterr()
        assert cli(["rotate-keys", "--url", local_url, "--keys", f"file:{keyfile}", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["threads"] == 1 and report["blobs_resealed"] == len(sealed) and report["blobs_skipped"] == 0
        assert key_id_of(raw.get_blobs(HANDLE_THREAD, [HANDLE_BLOB])[HANDLE_BLOB]) == "B"
    finally:
        raw.close()


def test_import_persistkit_does_not_import_cryptography() -> None:
    import subprocess
    import sys

    code = "import sys, persistkit; assert 'cryptography' not in sys.modules, 'imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# -- the shipped conformance suites over encrypted stores -------------------------------------


class TestEncryptedBackendConformance(BackendConformance):
    @pytest.fixture(params=["memory", "sqlite"])
    def persistkit_url(
        self, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
    ) -> str:
        return make_url(request.param, request, tmp_path_factory)

    @pytest.fixture
    def open_another(self, persistkit_url: str) -> Iterator[Callable[[], Backend]]:
        opened: list[Backend] = []

        def _open() -> Backend:
            b = EncryptedBackend(open_backend(persistkit_url), ring("A", "B"))
            opened.append(b)
            return b

        yield _open
        for b in opened:
            b.close()

    def test_declares_schemes_and_flags(self, backend: Backend) -> None:
        assert isinstance(backend, EncryptedBackend)
        assert type(backend.inner).schemes and backend.native_async == backend.inner.native_async
        assert backend.url.endswith("(encrypted)")


class TestEncryptedStoreConformance(StoreConformance):
    @pytest.fixture(params=["memory", "sqlite"])
    def persistkit_url(
        self, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
    ) -> str:
        return make_url(request.param, request, tmp_path_factory)

    @pytest.fixture
    def store(self, persistkit_url: str) -> Iterator[pk.Store]:
        pk.set_testing(True)
        s = pk.connect(persistkit_url, encryption=ring("B"))
        yield s
        s.close()


def test_offloaded_blobs_are_sealed_and_rotated(s3_endpoint: str) -> None:
    primary = f"memory://{uuid.uuid4().hex[:10]}"
    blobs = f"s3://persistkit-test/enc-offload/{uuid.uuid4().hex[:10]}?endpoint_url={s3_endpoint}"
    tid = uid("off")
    with pk.connect(primary, blobs=blobs, blob_threshold=64, encryption=ring("A")) as store:
        run_agent(store, tid, {})
        expected = store.get_state(tid)
    s3 = open_backend(blobs)
    try:
        objects = s3.scan_blobs(tid, "", "\x7f")
        assert objects and all(key_id_of(v) == "A" and not planted(v) for v in objects.values())
        with pk.connect(
            primary, blobs=blobs, blob_threshold=64, encryption=ring("A", "B")
        ) as store:
            assert store.rotate_keys(tid).blobs_resealed >= 1
        with pk.connect(primary, blobs=blobs, blob_threshold=64, encryption=ring("B")) as store:
            assert store.get_state(tid) == expected
        # the rotated bytes went to fresh objects; the old ones stay until delete_thread
        assert any(key_id_of(v) == "B" for v in s3.scan_blobs(tid, "", "\x7f").values())
    finally:
        s3.close()
