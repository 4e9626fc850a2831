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
        assert info.value.option == option  # what the CLI picks its hint by
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


_STACKS = {
    "blobs+encryption": {"encryption": {"k": KEY}},
    "blobs+integrity": {"integrity": {"m": KEY}},
    "blobs+encryption+integrity": {"encryption": {"k": KEY}, "integrity": {"m": KEY}},
}


@pytest.mark.parametrize("stack", list(_STACKS))
def test_an_offloaded_and_sealed_store_opened_without_blobs_names_blobs(
    stack: str, own_url: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """Encryption and integrity wrap offload: without blobs= they meet offload's pointer where
    their own envelope belongs, which is a missing option (blobs=), not a forged record."""
    import asyncio
    import base64

    from persistkit._cli import main

    sealed = _STACKS[stack]
    blobs = {"blobs": make_url("sqlite", request, tmp_path_factory), "blob_threshold": 64}
    tid = uid("offl")
    with pk.connect(own_url, **blobs, **sealed) as writer, pk.resume(tid, store=writer) as run:  # type: ignore[arg-type]
        run.state["text"] = "x" * 4096

    def names_blobs(info: pytest.ExceptionInfo[pk.StoreOptionsError]) -> None:
        message = str(info.value)
        assert "blobs=" in message and tid in message, message
        assert "Ways forward" not in message and "forged" not in message and "fork" not in message, message

    async def aread(store: pk.Store) -> None:
        await store.aget_state(tid)

    with pk.connect(own_url, **sealed) as half:  # type: ignore[arg-type]
        reads = (lambda: half.get_state(tid), lambda: list(half.history(tid)), lambda: asyncio.run(aread(half)))
        for read in reads:
            with pytest.raises(pk.StoreOptionsError) as info:
                read()
            names_blobs(info)
        with pytest.raises(pk.StoreOptionsError) as info, pk.resume(tid, store=half):
            pass
        names_blobs(info)
        if "encryption" in sealed:  # sealing offload's pointer as if it were plaintext would lose the record
            with pytest.raises(pk.StoreOptionsError) as info:
                half.rotate_keys(tid, encrypt_plaintext=True)
            names_blobs(info)
        if "integrity" in sealed:
            with pytest.raises(pk.StoreOptionsError) as info:
                half.verify(tid)  # a missing option, not a broken record
            names_blobs(info)
    if "integrity" in sealed and not own_url.startswith("memory://"):  # the command line, too
        for option, var in (("integrity", "PERSISTKIT_INTEGRITY_KEYS"), ("encryption", "PERSISTKIT_ENCRYPTION_KEYS")):
            if option in sealed:
                kid = "m" if option == "integrity" else "k"
                monkeypatch.setenv(var, f"{kid}:{base64.b64encode(KEY).decode()}")
            else:
                monkeypatch.delenv(var, raising=False)
        assert main(["verify", "--url", own_url, "--thread", tid]) == 1
        assert "StoreOptionsError" in (err := capsys.readouterr().err) and "?blobs=" in err and "problem" not in err, err
    with pk.connect(own_url, **blobs, **sealed) as writer:  # type: ignore[arg-type]
        assert writer.get_state(tid)["text"] == "x" * 4096  # nothing was damaged
        if "integrity" in sealed:
            assert writer.verify(tid).ok


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
