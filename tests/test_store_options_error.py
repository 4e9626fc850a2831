"""A store opened without an option its records need is a configuration mistake, not damage.

Encrypted, integrity-sealed and offloaded records read through a store opened
without ``encryption=``, ``integrity=`` or ``blobs=`` are a ``pk.StoreOptionsError``
(a ``SerializationError`` and a ``ConfigurationError``) naming the option, with none
of the damaged-record advice (fork, delete, restore a backup): following that advice
on a healthy thread loses data. Also here: one secret held by several environment
variables is stored under the name other processes most likely have too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_url, uid

import persistkit as pk

KEY = bytes(range(32))
SECRET = "sk-proj-Zq81xLmN0pQrS2tUvW3xYz4AbC5dEf6GhI7Jk"


@pytest.fixture
def own_url(store_url: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """``store_url``, with a schema of its own on PostgreSQL: these tests leave threads sealed
    with keys (or offloaded to blob stores) that other tests lack, and a test that verifies
    the session's whole shared schema would meet them."""
    if store_url.startswith("postgres"):
        return make_url("postgres", request, tmp_path_factory, isolated=True)
    return store_url


@pytest.mark.parametrize("option", ["integrity", "encryption", "blobs"])
def test_a_store_opened_without_its_options_names_the_option(
    option: str, own_url: str, tmp_path: Path, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    kwargs: dict[str, object] = {
        "integrity": {"integrity": {"m": KEY}},
        "encryption": {"encryption": {"k": KEY}},
        "blobs": {"blobs": make_url("sqlite", request, tmp_path_factory), "blob_threshold": 64},
    }[option]
    tid = uid("opts")
    with pk.connect(own_url, **kwargs) as writer, pk.resume(tid, store=writer) as run:  # type: ignore[arg-type]
        run.state["text"] = "x" * 4096
    with pk.connect(own_url) as bare:
        with pytest.raises(pk.StoreOptionsError) as info:
            bare.get_state(tid)
        assert isinstance(info.value, pk.ConfigurationError) and isinstance(info.value, pk.SerializationError)
        message = str(info.value)
        assert f"{option}=" in message and tid in message, message
        assert "Ways forward" not in message and "fork" not in message and "delete" not in message, message
    with pk.connect(own_url, **kwargs) as writer:  # type: ignore[arg-type]
        assert writer.get_state(tid)["text"] == "x" * 4096  # nothing was damaged


def test_a_sealed_and_encrypted_store_opened_with_integrity_only_names_encryption(own_url: str) -> None:
    """Encryption wraps integrity: the integrity layer meets the encryption envelope, which
    is a missing option (encryption=), not a record without a tag (tampering)."""
    both: dict[str, object] = {"integrity": {"m": KEY}, "encryption": {"k": KEY}}
    tid = uid("both")
    with pk.connect(own_url, **both) as writer, pk.resume(tid, store=writer) as run:  # type: ignore[arg-type]
        run.state["text"] = "x" * 4096
    with pk.connect(own_url, integrity={"m": KEY}) as half:
        for read in (lambda: half.get_state(tid), lambda: list(half.history(tid))):
            with pytest.raises(pk.StoreOptionsError) as info:
                read()
            message = str(info.value)
            assert "encryption=" in message and tid in message, message
            assert "Ways forward" not in message and "forged" not in message, message
    with pk.connect(own_url, **both) as writer:  # type: ignore[arg-type]
        assert writer.get_state(tid)["text"] == "x" * 4096


def test_one_value_in_several_variables_is_named_by_the_usual_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in ("AA_OPENAI_KEY", "LLM_API_KEY", "OPENAI_API_KEY", "ZZ_OPENAI_KEY"):
        monkeypatch.setenv(variable, SECRET)
    tid = uid("dup")
    with pk.connect(f"sqlite:///{tmp_path}/dup.db") as store, pk.resume(tid, store=store) as run:
        run.state["note"] = f"key {SECRET} here"
    raw = (tmp_path / "dup.db").read_bytes()
    assert SECRET.encode() not in raw
    with pk.connect(f"sqlite:///{tmp_path}/dup.db") as store:
        assert store.get_state(tid)["note"] == "key $CRED{env:OPENAI_API_KEY} here"


def test_an_unresolved_secret_str_reads_as_set_not_empty() -> None:
    from persistkit.secrets._redact import _lazy_secret_str, default_redactor

    lazy = _lazy_secret_str("str", "env:PK_TEST_NOWHERE_API_KEY", default_redactor())
    assert repr(lazy) == "SecretStr('**********')" and str(lazy) == "**********"
    with pytest.raises(pk.SecretResolutionError):
        lazy.get_secret_value()
