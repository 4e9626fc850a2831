"""THE SCAN: plant one secret of every detected format everywhere persistkit stores
things, run an agent on every store, then read every byte the store holds and
look for the secrets in plain text and in the usual encodings."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import uid

import persistkit as pk
from persistkit.secrets import _redact as _secrets

# One value per format. The secret part (what must never be stored) is the
# second item; the first is the text it is planted as.
PLANTED: dict[str, tuple[str, str]] = {
    "openai": ("sk-proj-Zq81xLmN0pQrS2tUvW3xYz4AbC5dEf6GhI7", "sk-proj-Zq81xLmN0pQrS2tUvW3xYz4AbC5dEf6GhI7"),
    "openai_legacy": ("sk-Tx9Lq2Wm4Rn6Bv8Cz0Dy1Ex3Fw5Gu7Ht9Ks2Mp", "sk-Tx9Lq2Wm4Rn6Bv8Cz0Dy1Ex3Fw5Gu7Ht9Ks2Mp"),
    "anthropic": ("sk-ant-api03-Hq7Kd9Lm2Np4Rs6Tv8Wx0Yz1Ab3Cd5Ef7Gh9Jk", "sk-ant-api03-Hq7Kd9Lm2Np4Rs6Tv8Wx0Yz1Ab3Cd5Ef7Gh9Jk"),
    "aws_id": ("AKIAZ7QX3MPL4TRW9KVE", "AKIAZ7QX3MPL4TRW9KVE"),
    "aws_secret": (
        "aws_secret_access_key = Qm9vT2xlc3NTZWNyZXRLZXlGb3JUZXN0aW5nMTIz",
        "Qm9vT2xlc3NTZWNyZXRLZXlGb3JUZXN0aW5nMTIz",
    ),
    "github": ("ghp_R8sT2uV4wX6yZ8aB0cD2eF4gH6iJ8kL0mN2p", "ghp_R8sT2uV4wX6yZ8aB0cD2eF4gH6iJ8kL0mN2p"),
    "github_pat": (
        "github_pat_11ABCDEFG0Zq8Wx7Ve6Ut5_Sr4Qp3On2Ml1Kj0Ih9Gf8Ed7Cb6Az5Yx4Wv3Ut2Sr1Qp0On9Ml8Kj7",
        "github_pat_11ABCDEFG0Zq8Wx7Ve6Ut5_Sr4Qp3On2Ml1Kj0Ih9Gf8Ed7Cb6Az5Yx4Wv3Ut2Sr1Qp0On9Ml8Kj7",
    ),
    "slack": ("xoxb-2468013579-1357924680-Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk", "xoxb-2468013579-1357924680-Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk"),
    "google": ("AIzaSyQ7w8E9r0T1y2U3i4O5p6A7s8D9f0G1h2J", "AIzaSyQ7w8E9r0T1y2U3i4O5p6A7s8D9f0G1h2J"),
    "stripe": ("sk_live_51Hq2Wx3Ec4Rv5Tb6Yn7Um8Ik9Ol0", "sk_live_51Hq2Wx3Ec4Rv5Tb6Yn7Um8Ik9Ol0"),
    "jwt": (
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJwbGFudGVkLXVzZXIifQ.Vq3Xk9Lp2Wm4Rn6Bv8Cz0Dy1Ex3Fw5Gu7Ht9Ks2Mp",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJwbGFudGVkLXVzZXIifQ.Vq3Xk9Lp2Wm4Rn6Bv8Cz0Dy1Ex3Fw5Gu7Ht9Ks2Mp",
    ),
    "bearer": ("Authorization: Bearer Tk4Hq8Zm2Xn6Cv0Bl3Kj7Gf1Ds5Ap9", "Tk4Hq8Zm2Xn6Cv0Bl3Kj7Gf1Ds5Ap9"),
    "pem": (
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAq7PlantedKeyBodyLineOne0123456789abcdefgh\n"
        "PlantedKeyBodyLineTwo9876543210ZYXWVUTSRQPONMLKJIH\n-----END RSA PRIVATE KEY-----",
        "MIIEowIBAAKCAQEAq7PlantedKeyBodyLineOne0123456789abcdefgh",
    ),
    "url_password": ("postgresql://alice:Tr0ub4dor-horse-battery@db.internal:5432/app", "Tr0ub4dor-horse-battery"),
    "registered": ("my registered value: plumbus-Fleeb-9931-dinglebop", "plumbus-Fleeb-9931-dinglebop"),
    "typed": ("(a pk.Secret)", "typed-secret-Schleem-4417"),
}
EVERYTHING = "\n".join(text for text, _ in PLANTED.values())


def encodings(secret: str) -> Iterator[tuple[str, bytes]]:
    raw = secret.encode()
    yield "plain", raw
    yield "json", json.dumps(secret)[1:-1].encode()
    yield "hex", raw.hex().encode()
    yield "HEX", raw.hex().upper().encode()
    yield "url", urllib.parse.quote(secret, safe="").encode()
    yield "url+", urllib.parse.quote_plus(secret).encode()
    for pad in range(3):
        for name, enc in (("b64", base64.b64encode), ("b64url", base64.urlsafe_b64encode)):
            full = enc(b"\0" * pad + raw)
            # Only the characters fully determined by the secret's own bytes.
            start = -(-pad // 3) * 4 if pad else 0
            end = ((pad + len(raw)) // 3) * 4
            yield f"{name}@{pad}", full[start:end]


def assert_clean(blobs: list[bytes], where: str) -> None:
    assert blobs, f"{where}: nothing read from the store"
    for label, (_, secret) in PLANTED.items():
        for enc_name, needle in encodings(secret):
            for blob in blobs:
                assert needle not in blob, f"{where}: planted {label} found as {enc_name}"


# -- reading every byte a store holds ---------------------------------------------------


def _flatten(obj: Any, out: list[bytes], seen: set[int]) -> None:
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, bytes | bytearray | memoryview):
        out.append(bytes(obj))
    elif isinstance(obj, str):
        out.append(obj.encode("utf-8", "surrogatepass"))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(k, out, seen)
            _flatten(v, out, seen)
    elif isinstance(obj, list | tuple | set | frozenset):
        for v in obj:
            _flatten(v, out, seen)
    elif hasattr(obj, "__dataclass_fields__") or hasattr(obj, "__slots__") or hasattr(obj, "__dict__"):
        names = list(getattr(obj, "__dataclass_fields__", ())) or list(getattr(obj, "__dict__", {}))
        for n in names:
            _flatten(getattr(obj, n, None), out, seen)


def read_everything(store: pk.Store, url: str) -> list[bytes]:
    kind = url.split(":", 1)[0]
    out: list[bytes] = []
    if kind == "memory":
        data = store.backend._data  # type: ignore[attr-defined]
        _flatten({"heads": data.heads, "rows": data.rows, "blobs": data.blobs}, out, set())
    elif kind == "sqlite":
        path = Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:////") else Path(url[len("sqlite:///") :])
        for suffix in ("", "-wal", "-shm"):
            p = Path(str(path) + suffix)
            if p.exists():
                out.append(p.read_bytes())
    elif kind.startswith("postgres"):
        import psycopg

        schema = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["schema"][0]
        base = url.split("?", 1)[0]
        with psycopg.connect(base) as conn:
            tables = [r[0] for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
            )]
            assert tables
            for table in tables:
                for row in conn.execute(f'SELECT * FROM "{schema}"."{table}"'):
                    _flatten(list(row), out, set())
    elif kind == "redis":
        import redis

        prefix = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["prefix"][0]
        client = redis.Redis.from_url(url.split("?", 1)[0])
        for key in client.scan_iter(match=prefix.replace("*", r"\*") + "*"):
            out.append(key)
            t = client.type(key).decode()
            if t == "string":
                out.append(client.get(key) or b"")
            elif t == "hash":
                _flatten(client.hgetall(key), out, set())
            elif t == "list":
                _flatten(client.lrange(key, 0, -1), out, set())
            elif t == "set":
                _flatten(client.smembers(key), out, set())
            elif t == "zset":
                _flatten(client.zrange(key, 0, -1, withscores=False), out, set())
            elif t == "stream":
                _flatten(client.xrange(key), out, set())
            else:
                raise AssertionError(f"unexpected redis type {t}")
        client.close()
    elif kind == "s3":
        import boto3

        parts = urllib.parse.urlsplit(url)
        endpoint = urllib.parse.parse_qs(parts.query)["endpoint_url"][0]
        client = boto3.client("s3", endpoint_url=endpoint)
        prefix = parts.path.lstrip("/")
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=parts.netloc, Prefix=prefix)
        for page in pages:
            for obj in page.get("Contents", []):
                out.append(obj["Key"].encode())
                got = client.get_object(Bucket=parts.netloc, Key=obj["Key"])
                out.append(got["Body"].read())
                _flatten(got.get("Metadata", {}), out, set())
    elif kind == "dynamodb":
        import boto3

        parts = urllib.parse.urlsplit(url)
        endpoint = urllib.parse.parse_qs(parts.query)["endpoint_url"][0]
        client = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
        for page in client.get_paginator("scan").paginate(TableName=parts.netloc):
            for item in page["Items"]:  # every attribute of every item: keys, ids, values, chunks
                _flatten(item, out, set())
        client.close()
    else:
        raise AssertionError(url)
    return out


# -- the agent -----------------------------------------------------------------------------


@pytest.fixture
def vault(tmp_path: Path) -> pk.secrets.FileVault:
    return pk.secrets.FileVault(tmp_path / "vault.json", key=pk.secrets.FileVault.generate_key())


@pytest.fixture(autouse=True)
def _registered() -> Iterator[None]:
    pk.secrets.register("planted", PLANTED["registered"][1])
    yield
    pk.secrets.unregister("planted")


@pk.checkpointed
def call_llm(prompt: str, key: str) -> dict[str, Any]:
    return {"answer": f"I used {key} to answer {prompt}", "echo": EVERYTHING}


@pk.checkpointed
def flaky_tool(key: str) -> None:
    raise ValueError(f"tool rejected the request: {EVERYTHING}")


@pk.checkpointed
def fetch_typed() -> pk.Secret[str]:
    return pk.Secret(PLANTED["typed"][1], name="typed-planted")


def agent(run: pk.Run) -> dict[str, Any]:
    run.state["notes"] = EVERYTHING
    run.state.setdefault("messages", []).append({"role": "user", "content": EVERYTHING})
    run.state["typed"] = pk.Secret(PLANTED["typed"][1], name="typed-planted")
    out = call_llm(EVERYTHING, PLANTED["openai"][0])
    with contextlib.suppress(ValueError):  # recorded as a failed step; the run goes on
        flaky_tool(PLANTED["stripe"][0])
    typed = fetch_typed()
    run.state["messages"].append({"role": "assistant", "content": out["answer"]})
    return {"out": out, "typed": typed}


def test_no_planted_secret_reaches_any_store(store_url: str, vault: pk.secrets.FileVault) -> None:
    thread = uid("scan")
    # No compression: compressed bytes would hide plain text from the raw scan.
    store = pk.connect(store_url, vault=vault, compress_threshold=1 << 30)
    try:
        with pk.resume(thread, store=store, metadata={"note": EVERYTHING, "key": PLANTED["github"][0]}) as run:
            first = agent(run)
        assert PLANTED["openai"][0] in first["out"]["answer"]  # the live run sees live values
        blobs = read_everything(store, store_url)
        assert_clean(blobs, store_url.split(":", 1)[0])

        # History and the CLI-facing views carry handles, never values.
        for cp in store.history(thread):
            text = repr(cp)
            for _, secret in PLANTED.values():
                assert secret not in text
    finally:
        store.close()

    # A new process knows nothing it redacted before: forget, reopen, replay.
    _secrets._memory.clear()
    store = pk.connect(store_url, vault=vault, compress_threshold=1 << 30)
    try:
        with pk.resume(thread, store=store, run_id=run.run_id) as again:
            second = agent(again)
        assert again.replayed and not again.executed
        assert second["out"]["answer"] == first["out"]["answer"]  # the vault gave the key back
        assert second["out"]["echo"] == EVERYTHING
        assert second["typed"].reveal() == PLANTED["typed"][1]
        state = store.get_state(thread)
        assert state["notes"] != EVERYTHING and "$CRED{" in state["notes"]  # inspection: handles
        state = pk.secrets.resolve(state, store=store)
        assert state["notes"] == EVERYTHING
        assert state["typed"].reveal() == PLANTED["typed"][1]
        assert_clean(read_everything(store, store_url), store_url.split(":", 1)[0] + " after replay")
    finally:
        store.close()


def test_without_vault_detected_secrets_come_back_as_handles(local_store: pk.Store) -> None:
    thread = uid("novault")
    with pk.resume(thread, store=local_store) as run:
        run.state["notes"] = "key " + PLANTED["openai"][0]
    _secrets._memory.clear()  # as if in a new process
    notes = local_store.get_state(thread)["notes"]
    assert notes.startswith("key $CRED{openai-") and PLANTED["openai"][0] not in notes
    with pytest.raises(pk.SecretResolutionError) as info:
        pk.secrets.resolve(notes)
    assert "$CRED{openai-" in str(info.value) and PLANTED["openai"][0] not in str(info.value)
    # Storing the unresolved handle again keeps it a handle (not escaped into plain text).
    with pk.resume(thread, store=local_store) as run:
        run.state["notes2"] = run.state["notes"]
    state = local_store.get_state(thread)
    assert state["notes2"] == notes


def test_scan_helpers_find_what_they_look_for() -> None:
    # The scan must be able to fail: each encoding of a value is found in a blob holding it.
    secret = PLANTED["openai"][1]
    for name, needle in encodings(secret):
        assert len(needle) >= 8, name
    for pad in range(3):
        blob = base64.b64encode(b"xx"[:pad] + secret.encode() + b"tail")
        with pytest.raises(AssertionError):
            assert_clean([blob], "probe")
    with pytest.raises(AssertionError):
        assert_clean([urllib.parse.quote(PLANTED["pem"][1]).encode()], "probe")
    assert os.environ is not None


def test_scan_sees_secrets_when_redaction_is_off(tmp_path: Path) -> None:
    # Proves the raw SQLite scan can fail: with redact=False the planted text is in the file.
    url = f"sqlite:///{tmp_path}/off.db"
    store = pk.connect(url, redact=False, compress_threshold=1 << 30)
    try:
        with pk.resume(uid("off"), store=store) as run:
            agent(run)
        with pytest.raises(AssertionError, match="planted"):
            assert_clean(read_everything(store, url), "redaction off")
    finally:
        store.close()
