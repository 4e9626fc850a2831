"""``$PERSISTKIT_INTEGRITY_KEYS`` / ``$PERSISTKIT_ENCRYPTION_KEYS`` mean the same to
``pk.connect(url)`` and to the CLI (issue 34, 3): with one set, a store opened without
``integrity=`` / ``encryption=`` is sealed with its keys; ``False`` / ``?integrity=false``
turns that off. A record without a tag read with integrity on names the likely cause first
(written without integrity), not tampering.
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from conftest import uid

import persistkit as pk
from persistkit._cli import main

INTEGRITY = "m1:" + base64.b64encode(bytes(range(32))).decode()
ENCRYPTION = "e1:" + base64.b64encode(bytes(range(32, 64))).decode()


def _write(url: str, tid: str, **options: object) -> None:
    with pk.connect(url, **options) as store, pk.resume(tid, store=store) as run:  # type: ignore[arg-type]
        run.state["n"] = 1


def test_connect_and_the_cli_read_the_key_variables_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url, tid = f"sqlite:///{tmp_path}/agent.db", uid("sealed")
    monkeypatch.setenv("PERSISTKIT_INTEGRITY_KEYS", INTEGRITY)
    monkeypatch.setenv("PERSISTKIT_ENCRYPTION_KEYS", ENCRYPTION)
    _write(url, tid)  # no integrity=, no encryption=: the variables seal it
    with pk.connect(url, integrity=False, encryption=False) as plain, pytest.raises(pk.StoreOptionsError):
        plain.get_state(tid)  # it is sealed: a plain open cannot read it
    with pk.connect(url) as store:
        assert store.verify(tid).ok and store.get_state(tid)["n"] == 1
    assert main(["state", "--url", url, tid]) == 0  # the CLI opens it the same way
    assert '"n": 1' in capsys.readouterr().out


def test_an_untagged_record_names_the_likely_cause_first_and_false_opts_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url, tid = f"sqlite:///{tmp_path}/agent.db", uid("plain")
    _write(url, tid)  # written without integrity, no variable set
    monkeypatch.setenv("PERSISTKIT_INTEGRITY_KEYS", INTEGRITY)
    with pk.connect(url) as store, pytest.raises(pk.IntegrityError) as info:
        store.get_state(tid)
    text = str(info.value)
    assert text.index("Most likely it was written by a store opened without integrity") < text.index("forged")
    assert "$PERSISTKIT_INTEGRITY_KEYS" in text and "integrity=False" in text and "copy_from" in text
    assert main(["state", "--url", url, tid]) == 1  # the CLI agrees: same store, same refusal
    assert "Most likely it was written by a store opened without integrity" in capsys.readouterr().err
    for opened in (pk.connect(url, integrity=False), pk.connect(f"{url}?integrity=false")):
        with opened as store:
            assert store.get_state(tid)["n"] == 1
    assert main(["state", "--url", f"{url}?integrity=false", tid]) == 0
