"""Issue 13, items 4 and 6: the high-entropy rule on recorded errors and metadata, the AWS
pairing rule in state and results, and a secret scan that is linear and not repeated
for an unchanged value."""

from __future__ import annotations

import base64
import contextlib
import random
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import uid
from hypothesis import given, settings
from hypothesis import strategies as st
from test_secret_scan import read_everything

import persistkit as pk
from persistkit.secrets import _detect
from persistkit.secrets import _redact as _secrets
from persistkit.secrets._entropy import random_spans

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import redact_corpus

OPENAI = "sk-proj-Zq81xLmN0pQrS2tUvW3xYz4AbC5dEf6GhI7"
AWS_ID = "AKIAZ7QX3MPL4TRW9KVE"
AWS_SECRET = "Tq8v2WmZ4Rn6Bx9Cz0Dy1Ex3Fw5Gu7Ht9Ks2Mp/E"
CLEAN = redact_corpus.clean(seed=11, per_kind=60)
SECRETS = {k: v for k, v in redact_corpus.secrets(seed=12, per_kind=40).items() if not k.startswith("hex")}


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    yield
    pk.secrets.unregister("plumbus")
    pk.secrets.configure(vault=None, detect=True, detectors=(), resolver=None)


def needles(secret: str) -> list[bytes]:
    raw = secret.encode()
    return [raw, base64.b64encode(raw), raw.replace(b"/", b"\\/")]


def assert_absent(blobs: list[bytes], secrets: list[str], where: str) -> None:
    assert blobs
    for secret in secrets:
        for needle in needles(secret):
            assert not any(needle in b for b in blobs), f"{where}: {secret!r} stored"


# -- item 4: errors and metadata -------------------------------------------------------------


def one_of_each(seed: int) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(v) for v in SECRETS.values()]


def test_a_random_secret_in_an_error_or_metadata_is_never_stored(store_url: str) -> None:
    """The issue's case (an AWS secret key with no keyword next to an OpenAI key, in an
    exception message) and one generated secret of every format, in an exception's
    message, args and notes, in the run's end error and in run metadata."""
    planted = [AWS_SECRET, *one_of_each(7)]
    store = pk.connect(store_url, compress_threshold=1 << 30)
    thread = uid("entropy")

    @pk.checkpointed
    def call(i: int) -> None:
        exc = RuntimeError(f"upstream rejected key {OPENAI} and {planted[i]}")
        exc.add_note(f"retry with {planted[-1 - i]}")
        raise exc

    try:
        with pytest.raises(ValueError), pk.resume(thread, store=store, metadata={"who": f"token {planted[0]}", "n": 1}):
            for i in range(len(planted)):
                with contextlib.suppress(RuntimeError):
                    call(i)
            raise ValueError(f"giving up on {planted[1]}", planted[2])
        assert_absent(read_everything(store, store_url), [OPENAI, *planted], store_url.split(":")[0])
        # Recorded errors keep their words and name what was there.
        failed = [cp for cp in store.history(thread) if cp.error is not None]
        text = repr(failed)
        assert "upstream rejected key $CRED{openai-" in text and "$CRED{high_entropy-" in text
    finally:
        store.close()


def test_a_hex_secret_is_left_to_patterns_and_ids_stay_readable(local_store: pk.Store) -> None:
    """Ids and digests in a recorded error are not rewritten (the rule skips hexadecimal)."""
    thread = uid("ids")
    ids = ["123e4567-e89b-12d3-a456-426614174000", "9fceb02d0ae598e95dc970b74767f19372d61af8", "/srv/app/models/user_profile.py"]

    @pk.checkpointed
    def call() -> None:
        raise KeyError(f"no row {ids[0]} at commit {ids[1]} in {ids[2]}")

    with pk.resume(thread, store=local_store), pytest.raises(KeyError):
        call()
    text = repr([cp.error for cp in local_store.history(thread)])
    assert all(i in text for i in ids)


def test_entropy_rule_false_positives_and_recall() -> None:
    """What bench/bench_redact.py prints, held to a floor (seeded corpora, not timings)."""
    clean = [s for v in CLEAN.values() for s in v]
    fp = sum(1 for s in clean if random_spans(s)) / len(clean)
    rng = random.Random(5)
    found = [bool(random_spans(redact_corpus.in_sentence(rng, s))) for v in SECRETS.values() for s in v]
    assert fp <= 0.01, fp
    assert sum(found) / len(found) >= 0.95


# -- item 4: state and results keep pattern + context, plus the AWS pairing ---------------------


@pytest.mark.parametrize("where", ["state", "result", "dict"])
def test_aws_secret_key_with_an_access_key_id_in_the_same_record(store_url: str, where: str) -> None:
    store = pk.connect(store_url, compress_threshold=1 << 30)
    thread = uid("pair")

    @pk.checkpointed
    def creds() -> Any:
        if where == "dict":
            return {"id": AWS_ID, "key": AWS_SECRET, "region": "eu-west-1"}
        return f"use {AWS_ID} / {AWS_SECRET}" if where == "result" else None

    try:
        with pk.resume(thread, store=store) as run:
            if where == "state":
                run.state["notes"] = [f"id {AWS_ID}", f"then {AWS_SECRET} (rotated)"]
            got = creds()
        assert where == "state" or AWS_SECRET in str(got)  # live values stay live
        assert_absent(read_everything(store, store_url), [AWS_ID, AWS_SECRET], where)
    finally:
        store.close()


def test_a_bare_40_character_value_without_an_access_key_id_is_kept_in_state(local_store: pk.Store) -> None:
    thread = uid("nopair")
    value = f"version tag {AWS_SECRET} and sha 9fceb02d0ae598e95dc970b74767f19372d61af8"
    with pk.resume(thread, store=local_store) as run:
        run.state["note"] = value
    _secrets._memory.clear()
    local_store.codec.reveal = False
    assert local_store.get_state(thread)["note"] == value


# -- properties --------------------------------------------------------------------------------

_FRAGMENTS = st.sampled_from(
    [a for d in _detect.BUILTIN for a in d.anchors]
    + ["Bearer ", "AUTHORIZATION: basic ", "aws_secret_access_key=", "https://u:", "@h", "\n", " ", "\"", "'", "=", ":", "/", "-", "_"]
)
_TOKENS = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_.", min_size=0, max_size=60)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_FRAGMENTS, _TOKENS), max_size=12))
def test_anchored_matching_finds_what_the_regex_finds(parts: list[str]) -> None:
    """The linear, anchor-driven search (``_detect.matches``) finds exactly the matches
    a scan of the pattern at every position finds."""
    text = "".join(parts)
    for det in _detect.BUILTIN:
        assert [m.span() for m in _detect.matches(det, text)] == [m.span() for m in det.regex.finditer(text)], det.kind


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([s for v in CLEAN.values() for s in v]), min_size=1, max_size=4), st.sampled_from([" ", "\n", ", ", "; "]))
def test_redacting_clean_text_is_the_identity(parts: list[str], sep: str) -> None:
    text = sep.join(parts)
    red = pk.secrets.Redactor()
    assert red.redact_text(text) == text
    assert red.redact_text(text, people=True) == text


_VENDOR = st.sampled_from(["sk-proj-", "sk-ant-api03-", "ghp_", "xoxb-", "AIza", "sk_live_", "AKIA"])


@settings(max_examples=200, deadline=None)
@given(_VENDOR, st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", min_size=40, max_size=60), st.sampled_from(["", " ", "\n", "key=", "(", "\""]))
def test_a_generated_vendor_token_never_survives_redaction(prefix: str, body: str, before: str) -> None:
    token = prefix + (body[:16] if prefix == "AKIA" else body[:35] if prefix == "AIza" else body)
    red = pk.secrets.Redactor()
    for people in (False, True):
        assert token not in red.redact_text(f"{before}{token} tail", people=people)


# -- item 6: linear, and not repeated for an unchanged value -------------------------------------


class _Counting:
    """Wraps a compiled pattern and counts the calls the scan makes on it."""

    def __init__(self, rx: re.Pattern[str]) -> None:
        self.rx, self.calls, self.full = rx, 0, 0
        self.groupindex, self.pattern = rx.groupindex, rx.pattern

    def match(self, text: str, pos: int = 0) -> re.Match[str] | None:
        self.calls += 1
        return self.rx.match(text, pos)

    def finditer(self, text: str) -> Iterator[re.Match[str]]:
        self.full += 1
        return self.rx.finditer(text)


def test_the_scan_of_random_text_runs_patterns_only_at_anchors() -> None:
    """Linear with a small constant on any text: each built-in pattern runs only at
    occurrences of its anchors (a few per MB of random text), never at every position."""
    rng = random.Random(3)
    texts = {
        "base64": base64.b64encode(rng.randbytes(300_000)).decode(),
        "base64url": base64.urlsafe_b64encode(rng.randbytes(300_000)).decode(),
        "random": "".join(chr(rng.randrange(32, 127)) for _ in range(400_000)),
    }
    for label, text in texts.items():
        counted = []
        try:
            for det in _detect.BUILTIN:
                det.regex  # noqa: B018 - compile
                c = _Counting(det._compiled[0])
                det._compiled[0] = c  # type: ignore[call-overload]
                counted.append((det, c))
            pk.secrets.Redactor().redact_text(text)
        finally:
            for det, c in counted:
                det._compiled[0] = c.rx
        for det, c in counted:
            occurrences = sum(text.lower().count(a.lower()) if det.ignore_case else text.count(a) for a in det.anchors)
            assert c.calls <= 5 * occurrences, (label, det.kind, c.calls, occurrences)
            if det.locate != "search":
                assert c.full == 0, (label, det.kind)


@pytest.mark.parametrize("kind", ["base64", "english"])
def test_an_unchanged_value_is_not_scanned_again(local_store: pk.Store, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    rng = random.Random(4)
    if kind == "base64":
        big = base64.b64encode(rng.randbytes(200_000)).decode() + " eyJ sk- AKIA"
    else:
        big = " ".join(rng.choice(["The", "agent", "Reads", "a", "secret", "bearer", "of", "news"]) for _ in range(40_000))
    scans: list[str] = []
    real_walk, real_candidates = _secrets.Redactor._walk, _secrets._candidates

    def walk(self: _secrets.Redactor, node: Any, *args: Any, **kw: Any) -> Any:
        if type(node) is str and len(node) > 100_000:  # the big value (at any nesting)
            scans.append("walk")
        return real_walk(self, node, *args, **kw)

    def candidates(data: bytes) -> Any:
        if len(data) > 100_000:
            scans.append("first pass")
        return real_candidates(data)

    monkeypatch.setattr(_secrets.Redactor, "_walk", walk)
    monkeypatch.setattr(_secrets, "_candidates", candidates)

    @pk.checkpointed
    def step(i: int) -> int:
        return i

    with pk.resume(uid("unchanged"), store=local_store) as run:
        run.state["doc"] = big
        for i in range(6):
            step(i)
    # one first pass (and, for the English text that names a secret, one walk), not one per step
    assert scans.count("first pass") == 1, scans
    assert scans.count("walk") == (1 if kind == "english" else 0), scans


def test_a_newly_registered_secret_is_redacted_from_a_value_scanned_before(local_store: pk.Store) -> None:
    thread = uid("regen")
    value = ("filler text " * 600) + " plumbus-Fleeb-9931-dinglebop"

    @pk.checkpointed
    def step(i: int) -> int:
        return i

    with pk.resume(thread, store=local_store) as run:
        run.state["doc"] = value
        step(0)
        pk.secrets.register("plumbus", "plumbus-Fleeb-9931-dinglebop")
        step(1)
    local_store.codec.reveal = False
    assert local_store.get_state(thread)["doc"].endswith("$CRED{plumbus}")


def test_typed_values_are_not_text_for_the_new_rules(local_store: pk.Store) -> None:
    """Bytes (stored as base64), in metadata and next to an access key id, come back exact:
    the entropy rule and the AWS pairing apply to text, not to encoded scalars."""
    thread = uid("typed")
    blob = bytes(random.Random(9).randbytes(30))  # base64: 40 characters, both cases
    with pk.resume(thread, store=local_store, metadata={"raw": blob, "note": "plain"}) as run:
        run.state["pair"] = {"id": f"key id {AWS_ID}", "payload": blob}
    _secrets._memory.clear()
    state = local_store.get_state(thread)
    assert state["pair"]["payload"] == blob
    assert all(cp.metadata.get("raw") == blob for cp in local_store.history(thread))
