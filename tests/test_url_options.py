"""pk.connect()'s own options in the store URL (issue 18): docs/backends.md says options
work in the URL query as well as keywords, and ``?redact=false`` was refused with
"Did you mean 'redact' for 'redact'?". Each option is checked by what it does, on
every store (the query is shared with the store's own options and, for PostgreSQL
and Redis, with the driver's)."""

from __future__ import annotations

import base64
import os
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from conftest import make_url, uid

import persistkit as pk
from persistkit.backends import Backend

SECRET = "sk-proj-Zq81xLmN0pQrS2tUvW3xYz4AbC5dEf6GhI7"
MARK = "needle-" + uuid.uuid4().hex


def _with(url: str, query: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{query}"


def _raw(backend: Backend, t: str) -> bytes:
    """Every row payload and blob the store holds for thread ``t``, as stored."""
    return b"".join([r.payload for r in backend.list(t, "")] + list(backend.scan_blobs(t, "", "\x7f").values()))


def _write(store: pk.Store, t: str, text: str, *, value: Any = None) -> None:
    @pk.checkpointed(name="url.opt.step")
    def step(x: str) -> Any:
        return value if value is not None else x

    with pk.resume(t, store=store) as run:
        run.state["text"] = text
        step(text)


def test_redact_false_and_compress_threshold_in_the_url(store_url: str) -> None:
    t_on, t_off = uid("redact-on"), uid("redact-off")
    text = f"key={SECRET} {MARK} " + "filler " * 200
    with pk.connect(store_url) as plain:
        _write(plain, t_on, text)
        assert SECRET.encode() not in _raw(plain.backend, t_on)  # the default redacts
    with pk.connect(_with(store_url, "redact=false&compress_threshold=1000000")) as store:
        assert store.url == pk.connect(store_url).url  # the store sees its own options only
        _write(store, t_off, text)
        raw = _raw(store.backend, t_off)
        assert SECRET.encode() in raw and MARK.encode() in raw  # neither redacted nor compressed
        assert store.get_state(t_off)["text"] == text


def test_allow_pickle_in_the_url(local_store_url: str) -> None:
    class Opaque:  # a local class: neither registered nor importable
        def __reduce__(self) -> Any:
            return (str, ("revived",))

    with pk.connect(local_store_url) as store, pytest.raises(pk.SerializationError):
        _write(store, uid("nopickle"), "x", value=Opaque())
    with pk.connect(_with(local_store_url, "allow_pickle=true")) as store:
        t = uid("pickle")
        _write(store, t, "x", value=Opaque())
        assert store.history(t)[0].run_status == "completed"


def test_allow_modules_in_the_url(local_store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = f"pk_url_mod_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{mod}.py").write_text(
        "import dataclasses\n@dataclasses.dataclass\nclass Point:\n    x: int\n    y: int\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    point = importlib.import_module(mod).Point(1, 2)
    t, run_id = uid("modules"), uuid.uuid4().hex

    @pk.checkpointed(name="url.opt.point")
    def make() -> Any:
        return point

    def replay(store: pk.Store) -> Any:
        with pk.resume(t, store=store, run_id=run_id):
            return make()

    # What the allowlist permits is test_serde's; here: the URL's list reaches the serializer.
    with pk.connect(local_store_url) as store:
        assert store.codec.serializer.allow_modules == ()
        assert replay(store) == point  # recorded
    with pk.connect(_with(local_store_url, "allow_modules=" + quote(f"{mod},other.pkg"))) as store:
        assert store.codec.serializer.allow_modules == (mod, "other.pkg")
        assert replay(store) == point


def test_blobs_and_blob_threshold_in_the_url(
    store_url: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    blob_url = make_url("sqlite", request, tmp_path_factory)
    t = uid("blobs")
    big = MARK + "x" * 5000
    url = _with(store_url, f"blobs={quote(blob_url, safe='')}&blob_threshold=1000&compress_threshold=1000000")
    with pk.connect(url) as store:
        _write(store, t, big)
        assert store.get_state(t)["text"] == big
    with pk.connect(store_url) as primary, pk.connect(blob_url) as blobs:
        assert MARK.encode() not in _raw(primary.backend, t)  # moved out to the blob store
        assert any(MARK.encode() in v for v in blobs.backend.scan_blobs(t, "", "\x7f").values())


def test_encryption_accept_plaintext_integrity_and_witness_in_the_url(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PK_URL_ENC", "k1:" + base64.b64encode(os.urandom(32)).decode())
    key_file = tmp_path / "mac.keys"
    key_file.write_text("m1:" + base64.b64encode(os.urandom(32)).decode() + "\n")
    old, new = uid("plaintext"), uid("sealed")
    with pk.connect(store_url) as plain:
        _write(plain, old, MARK)
    enc = "encryption=env:PK_URL_ENC"
    with pk.connect(_with(store_url, enc)) as store, pytest.raises(pk.IntegrityError, match="plaintext"):
        store.get_state(old)
    with pk.connect(_with(store_url, f"{enc}&accept_plaintext=true")) as store:
        assert store.get_state(old)["text"] == MARK
        _write(store, new, MARK)
        assert MARK.encode() not in _raw(store.backend.inner, new)  # type: ignore[attr-defined]
    witness = f"file:{tmp_path}/witness.log"
    sealed = uid("integrity")
    url = _with(store_url, f"integrity={quote('file:' + str(key_file))}&witness={quote(witness)}")
    with pk.connect(url) as store:
        _write(store, sealed, MARK)
        assert store.verify(sealed).ok
    assert (tmp_path / "witness.log").stat().st_size > 0
    with pk.connect(store_url) as plain, pytest.raises(pk.ConfigurationError, match="without integrity"):
        plain.verify(sealed)


def test_a_keyword_wins_over_the_url(local_store_url: str) -> None:
    with pk.connect(_with(local_store_url, "compress_threshold=5000"), compress_threshold=77) as store:
        assert store.codec.compress_threshold == 77
    with pk.connect(_with(local_store_url, "compress_threshold=5000")) as store:
        assert store.codec.compress_threshold == 5000


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("redact=maybe", "redact='maybe' in the URL"),
        ("allow_pickle=2", "expected true or false"),
        ("compress_threshold=0", "expected a positive integer"),
        ("blob_threshold=big", "expected a positive integer"),
        ("allow_modules=not-a-module", "comma-separated module names"),
        ("blobs=bucket", "a store URL, percent-encoded"),
        ("witness=somewhere", "file:PATH or a store URL"),
        ("vault=file:/v", "pass it as a keyword"),
        ("redact=true&redact=false", "given twice"),
        ("encryption=" + quote(base64.b64encode(b"k" * 32).decode()), "key text never goes in a URL"),
    ],
)
def test_bad_values_in_the_url_are_clear_errors(store_url: str, query: str, says: str) -> None:
    with pytest.raises(pk.ConfigurationError) as err:
        pk.connect(_with(store_url, query))
    text = str(err.value)
    assert says in text, text
    if query.startswith("encryption="):
        assert base64.b64encode(b"k" * 32).decode() not in text  # key text is never echoed


def test_open_backend_says_where_connect_options_belong(local_store_url: str) -> None:
    from persistkit.backends import open_backend

    with pytest.raises(pk.ConfigurationError) as err:
        open_backend(_with(local_store_url, "redact=false"))
    assert "'redact' is an option of pk.connect()" in str(err.value)
    assert "Did you mean 'redact' for 'redact'" not in str(err.value)


@pytest.fixture(params=["memory", "sqlite"])
def local_store_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_url(request.param, request, tmp_path_factory)
