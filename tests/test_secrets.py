"""Secrets become handles: detectors, registration, resolvers, the vault, lazy Secret types, no leaks."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import uid
from hypothesis import given, settings
from hypothesis import strategies as st

import persistkit as pk
from persistkit.secrets import _redact as _secrets


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    yield
    for name in ("openai", "db", "envkey", "lazy"):
        pk.secrets.unregister(name)
    pk.secrets.configure(vault=None, detect=True, detectors=(), resolver=None)


def red(text: str) -> str:
    return pk.secrets.Redactor().redact_text(text)


# -- detectors: true positives ---------------------------------------------------------------

TRUE_POSITIVES = [
    ("openai", "key=sk-proj-Zq81xLmN0pQrS2tUvW3xYz4AbC5dEf6GhI7 end", "sk-proj-Zq81xLmN0pQrS2tUvW3xYz4AbC5dEf6GhI7"),
    ("openai", "sk-Tx9Lq2Wm4Rn6Bv8Cz0Dy1Ex3Fw5Gu7Ht9Ks2Mp", "sk-Tx9Lq2Wm4Rn6Bv8Cz0Dy1Ex3Fw5Gu7Ht9Ks2Mp"),
    ("anthropic", "ANTHROPIC_API_KEY=sk-ant-api03-Hq7Kd9Lm2Np4Rs6Tv8Wx0Yz1Ab3", "sk-ant-api03-Hq7Kd9Lm2Np4Rs6Tv8Wx0Yz1Ab3"),
    ("aws_access_key", "id AKIAIOSFODNN7EXAMPLE here", "AKIAIOSFODNN7EXAMPLE"),
    ("aws_access_key", "ASIAZ7QX3MPL4TRW9KVE", "ASIAZ7QX3MPL4TRW9KVE"),
    ("aws_secret_key", "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
    ("aws_secret_key", '{"SecretAccessKey": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}', "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
    ("github", "token ghp_R8sT2uV4wX6yZ8aB0cD2eF4gH6iJ8kL0mN2p", "ghp_R8sT2uV4wX6yZ8aB0cD2eF4gH6iJ8kL0mN2p"),
    ("github", "gho_R8sT2uV4wX6yZ8aB0cD2eF4gH6iJ8kL0mN2p", "gho_R8sT2uV4wX6yZ8aB0cD2eF4gH6iJ8kL0mN2p"),
    ("github", "github_pat_11ABCDEFG0Zq8Wx7Ve6Ut5_Sr4Qp3On2Ml1", "github_pat_11ABCDEFG0Zq8Wx7Ve6Ut5_Sr4Qp3On2Ml1"),
    ("slack", "xoxb-2468013579-1357924680-Zx9Yw8Vu7Ts6", "xoxb-2468013579-1357924680-Zx9Yw8Vu7Ts6"),
    ("slack", "xapp-1-A0123456789-1234567890-abcdef", "xapp-1-A0123456789-1234567890-abcdef"),
    ("google_api_key", "AIzaSyQ7w8E9r0T1y2U3i4O5p6A7s8D9f0G1h2J", "AIzaSyQ7w8E9r0T1y2U3i4O5p6A7s8D9f0G1h2J"),
    ("stripe", "sk_live_51Hq2Wx3Ec4Rv5Tb6Yn7Um8Ik9Ol0", "sk_live_51Hq2Wx3Ec4Rv5Tb6Yn7Um8Ik9Ol0"),
    ("stripe", "rk_live_51Hq2Wx3Ec4Rv5Tb6Yn7Um8Ik9Ol0", "rk_live_51Hq2Wx3Ec4Rv5Tb6Yn7Um8Ik9Ol0"),
    ("jwt", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjMifQ.c2lnbmF0dXJlLXBhcnQ", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjMifQ.c2lnbmF0dXJlLXBhcnQ"),
    ("bearer", "Authorization: Bearer Tk4Hq8Zm2Xn6Cv0Bl3Kj7Gf1Ds5Ap9", "Tk4Hq8Zm2Xn6Cv0Bl3Kj7Gf1Ds5Ap9"),
    ("authorization", "Authorization: Basic YWxhZGRpbjpvcGVuc2VzYW1l", "YWxhZGRpbjpvcGVuc2VzYW1l"),
    ("private_key", "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBg\n-----END PRIVATE KEY-----", "MIIEvQIBADANBg"),
    ("private_key", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk (cut", "b3BlbnNzaC1rZXk"),
    ("url_password", "redis://:p4ssw0rd-x@cache:6379/0", "p4ssw0rd-x"),
]


@pytest.mark.parametrize(("kind", "text", "secret"), TRUE_POSITIVES)
def test_detector_true_positives(kind: str, text: str, secret: str) -> None:
    out = red(text)
    assert secret not in out
    assert f"$CRED{{{kind}-" in out


def test_bearer_and_url_keep_their_context() -> None:
    out = red("postgresql://alice:Tr0ub4dor-horse@db.internal:5432/app")
    assert out.startswith("postgresql://alice:$CRED{url_password-") and out.endswith("@db.internal:5432/app")
    assert red("Authorization: Bearer Tk4Hq8Zm2Xn6Cv0Bl3Kj7Gf1").startswith("Authorization: Bearer $CRED{bearer-")


FALSE_POSITIVES = [
    "ask-me-anything about the task-list and disk-usage",
    "sha1 3f786850e387550fdab836ed7e6dc881de23001b and commit 9fceb02d0ae598e95dc970b74767f19372d61af8",
    "https://example.com/path?x=1 and user@example.com",
    "ssh://git@github.com/org/repo.git",
    "the bearer of bad news",
    "pk_test_1234567890abcdef is a publishable test key",
    "AKIA is a prefix; AKIAshort",
    "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkq\n-----END PUBLIC KEY-----",
    "uuid 123e4567-e89b-12d3-a456-426614174000",
    "a base64 blob Qm9vT2xlc3NTZWNyZXRLZXlGb3JUZXN0aW5nMTIz without a keyword",
    "eyJ is how JSON starts in base64",
    "http://localhost:8080/api",
]


@pytest.mark.parametrize("text", FALSE_POSITIVES)
def test_detector_false_positives(text: str) -> None:
    assert red(text) == text


def test_redaction_is_idempotent_and_handles_are_stable_in_a_process() -> None:
    text = "k=sk-Tx9Lq2Wm4Rn6Bv8Cz0Dy1Ex3Fw5Gu7Ht9Ks2Mp"
    once = red(text)
    assert red(once) != once or "$CRED{$}" not in red(once)
    assert red(text) == once  # same secret, same handle
    assert pk.secrets.resolve(once) == text  # this process remembers what it redacted


def test_handle_tag_is_keyed_not_a_plain_hash() -> None:
    import hashlib

    secret = "postgresql://u:hunter22@h/db"
    out = red(secret)
    tag = out.split("url_password-")[1].split("}")[0]
    for algo in ("sha256", "sha1", "md5", "blake2b"):
        assert tag not in hashlib.new(algo, b"hunter22").hexdigest()


def test_extra_detectors() -> None:
    pk.secrets.configure(detectors=[("acme", r"acme_[0-9a-f]{16}")])
    assert "$CRED{acme-" in red("token acme_0123456789abcdef")
    with pytest.raises(pk.ConfigurationError):
        pk.secrets.configure(detectors=[("bad", "(")])


def test_extra_detectors_match_whole_strings_in_stored_records(local_store: pk.Store) -> None:
    """An extra pattern is matched against each stored string, as redaction applies it:
    one anchored to a whole string, or matching across a newline (an escape in the
    JSON), used to pass the first pass (run over the JSON text) and be stored."""
    pk.secrets.configure(detectors=[("acme", r"^ACME-[0-9]{8}$"), ("pair", r"user one\spass two")])

    @pk.checkpointed
    def echo(value: str) -> str:
        return value

    tid = uid("extra")
    with pk.resume(tid, store=local_store) as run:
        run.state["key"] = "ACME-12345678"
        run.state["note"] = "user one\npass two"
        echo("ACME-87654321")
    stored = b"".join(
        local_store.codec.open(row.payload) for row in local_store.backend.list(tid, "")
    )
    for clear in (b"ACME-1", b"ACME-8", b"pass two"):
        assert clear not in stored
    assert b"$CRED{acme-" in stored and b"$CRED{pair-" in stored
    with pk.resume(tid, store=local_store) as run:
        assert run.state["key"] == "ACME-12345678"  # the handles resolve in this process


def test_detection_can_be_turned_off_but_registered_values_still_go() -> None:
    pk.secrets.register("db", "correct-horse-battery")
    pk.secrets.configure(detect=False)
    assert red("sk-Tx9Lq2Wm4Rn6Bv8Cz0Dy1Ex3Fw5Gu7Ht9Ks2Mp and correct-horse-battery") == (
        "sk-Tx9Lq2Wm4Rn6Bv8Cz0Dy1Ex3Fw5Gu7Ht9Ks2Mp and $CRED{db}"
    )


# -- registration and resolvers -----------------------------------------------------------


def test_register_value_and_resolver(local_store: pk.Store) -> None:
    pk.secrets.register("db", "correct-horse-battery")
    assert red('say "correct-horse-battery"') == 'say "$CRED{db}"'
    calls: list[int] = []

    def fetch() -> str:
        calls.append(1)
        return "from-the-kms-123"

    pk.secrets.register("lazy", resolver=fetch)
    assert not calls  # not called until used
    assert pk.secrets.resolve("x $CRED{lazy} y") == "x from-the-kms-123 y"
    assert red("from-the-kms-123") == "$CRED{lazy}"  # learned once resolved
    with pytest.raises(pk.ConfigurationError):
        pk.secrets.register("db")
    with pytest.raises(pk.ConfigurationError):
        pk.secrets.register("db", "abc")  # too short to redact safely


def test_from_env(monkeypatch: pytest.MonkeyPatch, local_store: pk.Store) -> None:
    monkeypatch.setenv("PK_TEST_KEY", "env-secret-value-77")
    pk.secrets.from_env("envkey", "PK_TEST_KEY")
    thread = uid("env")
    with pk.resume(thread, store=local_store) as run:
        run.state["cfg"] = "key is env-secret-value-77"
    monkeypatch.setenv("PK_TEST_KEY", "rotated-value-88")  # resolved at the point of use
    state = local_store.get_state(thread)
    assert state["cfg"] == "key is $CRED{envkey}"  # inspection: handles stay handles
    assert pk.secrets.resolve(state)["cfg"] == "key is rotated-value-88"


def test_callable_resolver() -> None:
    pk.secrets.configure(resolver=lambda name: "v-" + name if name.startswith("ext") else None)
    assert pk.secrets.resolve("$CRED{ext1}") == "v-ext1"
    with pytest.raises(pk.SecretResolutionError) as info:
        pk.secrets.resolve("$CRED{nobody}")
    assert info.value.handle == "nobody" and "$CRED{nobody}" in str(info.value)


def test_failing_resolver_is_a_clear_error() -> None:
    def broken() -> str:
        raise RuntimeError("kms down: token=sk-Tx9Lq2Wm4Rn6Bv8Cz0Dy1Ex3Fw5Gu7Ht9Ks2Mp")

    pk.secrets.register("lazy", resolver=broken)
    with pytest.raises(pk.SecretResolutionError, match=r"\$CRED\{lazy\}") as info:
        pk.secrets.resolve("$CRED{lazy}")
    assert "sk-Tx9" not in str(info.value)


def test_literal_handle_text_cannot_inject_a_secret(local_store: pk.Store) -> None:
    pk.secrets.register("db", "correct-horse-battery")
    thread = uid("inject")
    with pk.resume(thread, store=local_store) as run:
        run.state["msg"] = "please print $CRED{db} for me"
    assert local_store.get_state(thread)["msg"] == "please print $CRED{db} for me"


# -- Secret types ------------------------------------------------------------------------------


def test_secret_repr_and_reveal() -> None:
    s = pk.Secret("sk-very-secret-value", name="openai")
    assert "very" not in repr(s) and "very" not in str(s) and "very" not in f"{s!r} {s}"
    assert s.reveal() == "sk-very-secret-value"
    with pytest.raises(TypeError):
        import pickle

        pickle.dumps(s)


def test_secret_in_state_is_lazy(local_store: pk.Store) -> None:
    pk.secrets.register("openai", resolver=lambda: "resolved-at-use")
    thread = uid("lazy")
    with pk.resume(thread, store=local_store) as run:
        run.state["key"] = pk.Secret("the-original-val", name="openai")
    loaded = local_store.get_state(thread)["key"]
    assert isinstance(loaded, pk.Secret) and loaded.name == "openai"
    assert loaded.reveal() == "resolved-at-use"


def test_unresolved_secret_raises_naming_the_handle(local_store: pk.Store) -> None:
    thread = uid("unres")
    with pk.resume(thread, store=local_store) as run:
        run.state["key"] = pk.Secret("no-one-knows-me-1", name="orphan")
    _secrets._memory.clear()
    loaded = local_store.get_state(thread)["key"]
    with pytest.raises(pk.SecretResolutionError) as info:
        loaded.reveal()
    assert info.value.handle == "orphan" and "no-one" not in str(info.value)


def test_pydantic_fields(local_store: pk.Store) -> None:
    from pydantic import SecretStr

    class Creds(pk.State):
        api: pk.Secret[str] | None = None
        token: SecretStr | None = None
        note: str = ""

    thread = uid("pyd")
    with pk.resume(thread, store=local_store, state=Creds) as run:
        run.state.api = pk.Secret("api-value-123456", name="api")
        run.state.token = SecretStr("token-value-98765")
        run.state.note = "url postgresql://u:pw-in-a-note@h/db"
    raw = repr(local_store.history(thread))
    assert "token-value" not in raw and "api-value" not in raw
    state = local_store.get_state(thread, state=Creds)
    assert state.api is not None and state.token is not None
    assert state.api.reveal() == "api-value-123456"
    assert isinstance(state.token, SecretStr) and state.token.get_secret_value() == "token-value-98765"
    assert state.note.startswith("url postgresql://u:$CRED{url_password-")  # inspection: a handle
    assert pk.secrets.resolve(state).note == "url postgresql://u:pw-in-a-note@h/db"
    plain = Creds.model_validate({"api": "plain", "token": "t"}).api
    assert plain is not None and plain.reveal() == "plain"


# -- vault -------------------------------------------------------------------------------------


def test_vault_round_trip_and_wrong_key(tmp_path: Path) -> None:
    key = pk.secrets.FileVault.generate_key()
    v = pk.secrets.FileVault(tmp_path / "v.json", key=key)
    v.put("a", "value-a")
    v.put("b", b"\x00bytes")
    again = pk.secrets.FileVault(tmp_path / "v.json", key=key)
    assert again.get("a") == "value-a" and again.get("b") == b"\x00bytes" and again.get("c") is None
    assert b"value-a" not in (tmp_path / "v.json").read_bytes()
    other = pk.secrets.FileVault(tmp_path / "v.json", key=pk.secrets.FileVault.generate_key())
    with pytest.raises(pk.IntegrityError):
        other.get("a")
    with pytest.raises(pk.ConfigurationError):
        pk.secrets.FileVault(tmp_path / "x.json", key=b"short")


def test_vault_resolves_in_another_process(tmp_path: Path) -> None:
    key = pk.secrets.FileVault.generate_key()
    db = tmp_path / "s.db"
    script = textwrap.dedent(
        f"""
        import sys, persistkit as pk
        vault = pk.secrets.FileVault({str(tmp_path / 'v.json')!r}, key={key!r})
        store = pk.connect("sqlite:///{db}", vault=vault)
        if sys.argv[1] == "write":
            with pk.resume("t", store=store) as run:
                run.state["k"] = "use sk-Tx9Lq2Wm4Rn6Bv8Cz0Dy1Ex3Fw5Gu7Ht9Ks2Mp now"
        else:
            print(pk.secrets.resolve(store.get_state("t"), store=store)["k"])
        """
    )
    env_path = str(Path(pk.__file__).parent.parent)
    run = [sys.executable, "-c", script]
    subprocess.run([*run, "write"], check=True, env={"PYTHONPATH": env_path}, timeout=60)
    out = subprocess.run([*run, "read"], check=True, env={"PYTHONPATH": env_path}, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "use sk-Tx9Lq2Wm4Rn6Bv8Cz0Dy1Ex3Fw5Gu7Ht9Ks2Mp now"
    assert b"sk-Tx9" not in db.read_bytes()


# -- no leaks -----------------------------------------------------------------------------------


def test_error_messages_are_scrubbed() -> None:
    err = pk.ConfigurationError("bad url postgresql://u:hunter2-pass@h/db with sk-Tx9Lq2Wm4Rn6Bv8Cz0Dy1Ex3Fw5Gu7Ht9Ks2Mp")
    assert "hunter2-pass" not in str(err) and "sk-Tx9" not in str(err)
    assert "$CRED{url_password}" in str(err) and "$CRED{openai}" in str(err)
    ser = pk.SerializationError("cannot encode ghp_R8sT2uV4wX6yZ8aB0cD2eF4gH6iJ8kL0mN2p", path="state.x")
    assert "ghp_" not in str(ser)
    conflict = pk.ConflictError(thread_id="t-AKIAIOSFODNN7EXAMPLE")
    assert "AKIAIOSFODNN7EXAMPLE" not in str(conflict)
    pk.secrets.register("db", "correct-horse-battery")
    assert "correct-horse" not in str(pk.NotFoundError("thread correct-horse-battery"))


def test_store_repr_hides_url_password() -> None:
    store = pk.connect("memory://pw-test")
    assert "hunter" not in pk.secrets.scrub("redis://:hunter2222@h:6379")
    assert "Store" in repr(store)
    store.close()


def test_replayed_error_keeps_handles(local_store: pk.Store) -> None:
    @pk.checkpointed
    def failing() -> None:
        raise ValueError("rejected sk-Tx9Lq2Wm4Rn6Bv8Cz0Dy1Ex3Fw5Gu7Ht9Ks2Mp")

    @pk.checkpointed
    def after() -> int:
        return 1

    thread = uid("err")
    with pk.resume(thread, store=local_store, run_id="r1"):
        with pytest.raises(ValueError, match="sk-Tx9"):  # the live error is the user's own
            failing()
        after()
    with pk.resume(thread, store=local_store, run_id="r1"):
        with pytest.raises(ValueError) as info:
            failing()
        after()
    assert "sk-Tx9" not in str(info.value) and "$CRED{openai-" in str(info.value)
    for cp in local_store.history(thread):
        assert "sk-Tx9" not in repr(cp)


def test_cli_prints_handles(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from persistkit.__main__ import main

    url = f"sqlite:///{tmp_path}/cli.db"
    store = pk.connect(url)
    with pk.resume("t", store=store) as run:
        run.state["k"] = "key sk-Tx9Lq2Wm4Rn6Bv8Cz0Dy1Ex3Fw5Gu7Ht9Ks2Mp"  # resolvable in this process
    store.close()
    assert main(["state", url, "t"]) == 0
    out = capsys.readouterr().out
    assert "sk-Tx9" not in out and "$CRED{openai-" in out


def test_import_does_not_load_heavy_modules() -> None:
    code = "import sys, persistkit; print(sorted(m for m in ('pydantic', 'cryptography', 'tempfile') if m in sys.modules))"
    env_path = str(Path(pk.__file__).parent.parent)
    out = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": env_path}, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- the cheap first pass over stored bytes ------------------------------------------------------


@pytest.mark.parametrize(("kind", "text", "secret"), TRUE_POSITIVES)
def test_first_pass_lets_every_true_positive_through(kind: str, text: str, secret: str) -> None:
    from persistkit.secrets._redact import _may_match_builtin

    for tree in ({"x": text}, [1, text, "tail"], {"k": "step", "r": {"nested": [text]}}):
        data = json.dumps(tree).encode()
        assert _may_match_builtin(data), (kind, data)
        assert _may_match_builtin(json.dumps(tree, ensure_ascii=True).encode())
    # and the whole path a stored record takes redacts it
    assert secret.encode() not in pk.Store(pk.backends.memory.MemoryBackend()).codec.dump_tree({"x": text})


@given(st.sampled_from(TRUE_POSITIVES), st.text(max_size=60), st.text(max_size=60))
@settings(max_examples=300, deadline=None)
def test_first_pass_is_a_superset_of_the_detectors(case: tuple[str, str, str], before: str, after: str) -> None:
    from persistkit.secrets._redact import _may_match_builtin

    text = before + " " + case[1] + " " + after
    if red(text) != text:  # whatever the detectors would rewrite, the first pass must not skip
        assert _may_match_builtin(json.dumps({"m": text}).encode())


def test_every_builtin_detector_has_a_true_positive_here() -> None:
    """The first pass gates token detectors on their prefixes: a new detector without a
    case in TRUE_POSITIVES would not be checked against its gate."""
    assert {d.kind for d in pk.secrets.DETECTORS} <= {kind for kind, _, _ in TRUE_POSITIVES}


@pytest.mark.parametrize(("kind", "text", "secret"), TRUE_POSITIVES)
@pytest.mark.parametrize("before", ["\n", "\t", "\r", '"', "\\", "\x00", "\u2028", "é", "😀"])
def test_a_secret_right_after_an_escaped_character_is_redacted(kind: str, text: str, secret: str, before: str) -> None:
    """In JSON bytes a token after an escaped newline follows the letter "n" (found by a
    review: such keys were stored in the clear); the first pass must still let it through."""
    from persistkit.secrets._redact import _may_match_builtin

    value = "see" + before + secret + before + "done"
    if red(value) == value:
        return  # this detector needs its keyword context (e.g. "Bearer "): not this case
    store = pk.Store(pk.backends.memory.MemoryBackend())
    for ascii_only in (False, True):
        assert _may_match_builtin(json.dumps({"m": value}, ensure_ascii=ascii_only).encode()), (kind, before)
    assert secret.encode() not in store.codec.dump_tree({"m": value, "l": [value]})


@given(st.lists(st.sampled_from(["sk-", "sk_live_", "ghp_", "github_pat_", "xoxb-", "xapp-1-", "AKIA", "AIza",
                                 "A", "a", "Z", "9", "_", "-", " ", "\n", "\t", '"', ".", "proj-", "x" * 8,
                                 "Q" * 16, "0" * 20]), max_size=30))
@settings(max_examples=400, deadline=None)
def test_first_pass_is_a_superset_on_token_like_text(parts: list[str]) -> None:
    from persistkit.secrets._redact import _may_match_builtin

    text = "".join(parts)
    if red(text) != text:
        assert _may_match_builtin(json.dumps({"m": text}).encode()), text
        assert _may_match_builtin(json.dumps({"m": text}, ensure_ascii=False).encode()), text


def test_first_pass_skips_ordinary_records() -> None:
    from persistkit.secrets._redact import _may_match_builtin

    body = {
        "k": "step", "p": "0/3", "n": "my_agent_module.research_step_with_a_long_name", "s": "completed",
        "a": "x:2ce43957ceedb95b", "t": 1763900000.5,
        "ch": {"messages": {"l": "0193a4c2b1d0e0f0a1b2c3d4", "n": 4, "g": 1}, "doc": {"b": "v:" + "ab" * 16}},
        "sg": {"messages": {"p": None, "s": 3, "i": [{"role": "user", "content": "Summarize https://example.com/a for me " * 20}]}},
    }
    assert not _may_match_builtin(json.dumps(body).encode())


def test_a_secret_in_the_newest_list_item_does_not_rewrite_the_list_at_the_next_run() -> None:
    """The next run compares the live newest item with what this process encodes, not with
    the stored (redacted) tree: a secret there used to rewrite the whole list at each run."""
    import base64
    import random

    store = pk.connect("memory://")
    key = "sk-proj-Hq7Kd9Lm2Np4Rs6Tv8Wx0Yz1Ab3Cd5Ef7Gh9JkQ2Zx"

    @pk.checkpointed(name="relist.step")
    def step(i: int) -> str:
        return base64.b64encode(random.Random(i).randbytes(1500)).decode() + f" key {key}"

    for r in range(5):
        with pk.resume("relist", store=store) as run:
            run.state.setdefault("messages", []).append(step(r))
    sizes = [len(row.payload) for row in reversed(store.backend.list("relist", ""))]
    assert max(sizes) < 1.5 * sizes[0], sizes  # O(change): no checkpoint carries the whole list
    messages = pk.secrets.resolve(store.get_state("relist"))["messages"]
    assert [m.endswith(f"key {key}") for m in messages] == [True] * 5
    store.close()
