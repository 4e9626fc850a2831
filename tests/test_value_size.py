"""Large values (issue 34, 3): a step result of 50 MB was accepted without a word.

Above 1 MiB serialized a value gets a ``pk.LargeValueWarning`` once per step (none when
the store offloads large values with ``blobs=``); ``pk.connect(max_value_bytes=...)``, also
a URL option, refuses a larger step result or state value with ``pk.ValueTooLargeError``
before any of it is written, and the step is recorded as failed (it ran: a resume replays
the error instead of running it again, as for any result that cannot be stored).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from conftest import make_url, uid

import persistkit as pk
from persistkit.codec import _sizes


class Notes(pk.State, name="tests.value_size.Notes"):
    text: str = ""
    log: list[str] = []


@pytest.fixture(params=["memory", "sqlite", "postgres", "redis"])
def url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_url(request.param, request, tmp_path_factory)


@pytest.mark.parametrize("where", ["keyword", "url"])
def test_a_result_above_max_value_bytes_is_refused_and_not_run_again(url: str, where: str) -> None:
    store = pk.connect(url, max_value_bytes=10_000) if where == "keyword" else pk.connect(
        f"{url}{'&' if '?' in url else '?'}max_value_bytes=10000")
    tid, ran = uid("size"), []

    @pk.checkpointed
    def fetch(n: int) -> str:
        ran.append(n)
        return "x" * n

    with pk.resume(tid, store=store, run_id="r1"):
        assert fetch(9_000) == "x" * 9_000  # under the limit: stored as usual
    with pytest.raises(pk.ValueTooLargeError) as info, pk.resume(tid, store=store, run_id="r2"):
        fetch(20_000)
    err = info.value
    assert (err.size, err.limit) == (20_002, 10_000) and isinstance(err, pk.SerializationError)
    text = str(err)
    assert "fetch" in text and "max_value_bytes=10000" in text and "nothing of it was written" in text
    assert "blobs=" in text
    # nothing of the value reached the store: the step is recorded as failed (it ran)
    failed = [cp for cp in store.history(tid, run_id="r2") if cp.kind == "step"]
    assert [(cp.step.rsplit(".", 1)[-1], cp.status) for cp in failed if cp.step] == [("fetch", "failed")]
    assert "max_value_bytes=10000" in (failed[0].error or "")
    with pytest.raises(pk.ValueTooLargeError), pk.resume(tid, store=store, run_id="r2"):
        fetch(20_000)
    assert ran == [9_000, 20_000]  # the redelivery replays the error, the step does not run again
    store.close()


def test_a_state_value_above_max_value_bytes_is_refused_at_the_commit_and_not_run_again(url: str) -> None:
    """State is sized when the step's checkpoint is made (the size of bytes made anyway; the
    check before a step's body serializes nothing): the step ran, so it is recorded as failed
    and a resume replays the error, as for any state that cannot be stored."""
    store = pk.connect(url, max_value_bytes=10_000)
    tid, ran = uid("size-state"), []

    @pk.checkpointed
    def step() -> int:
        ran.append(1)
        pk.current_run().state.text = "y" * 20_000  # type: ignore[union-attr]
        return 1

    for _ in range(2):
        with pytest.raises(pk.ValueTooLargeError, match=r"run.state.text is 20002 bytes serialized"), \
                pk.resume(tid, store=store, state=Notes, run_id="r1"):
            step()
    assert ran == [1]
    assert not any(cp.kind == "step" and cp.status == "completed" for cp in store.history(tid))
    store.close()


def test_max_value_bytes_must_be_a_positive_size(tmp_path: Any) -> None:
    for bad in (0, -1, "10", 1.5):
        with pytest.raises(pk.ConfigurationError, match="max_value_bytes"):
            pk.connect("memory://", max_value_bytes=bad)
    with pytest.raises(pk.ConfigurationError, match=r"max_value_bytes=.*positive integer"):
        pk.connect("memory://?max_value_bytes=ten")


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_large_result_is_warned_about_once_per_step(
    kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_sizes, "_warned", set())
    store = pk.connect(make_url(kind, request, tmp_path_factory))
    big = _sizes.LARGE_VALUE_BYTES + 10

    @pk.checkpointed
    def report(i: int) -> str:
        return "r" * big

    @pk.checkpointed
    def summary() -> str:
        return "s" * big

    @pk.checkpointed
    def small() -> str:
        return "ok"

    with warnings.catch_warnings(record=True) as seen, pk.resume(uid("warn"), store=store):
        warnings.simplefilter("always")
        for i in range(3):
            report(i)
        summary()
        small()
    large = [w for w in seen if issubclass(w.category, pk.LargeValueWarning)]
    assert len(large) == 2, [str(w.message) for w in large]  # once for report, once for summary
    text = str(large[0].message)
    assert ".report' at position 0" in text and "1.0 MiB" in text and "blobs=" in text and "max_value_bytes" in text
    store.close()


def test_no_warning_when_large_values_are_offloaded(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_sizes, "_warned", set())
    store = pk.connect(make_url("sqlite", request, tmp_path_factory), blobs=make_url("memory", request, tmp_path_factory))

    @pk.checkpointed
    def report() -> str:
        return "r" * (_sizes.LARGE_VALUE_BYTES + 10)

    with warnings.catch_warnings():
        warnings.simplefilter("error", pk.LargeValueWarning)
        with pk.resume(uid("offloaded"), store=store):
            report()
    store.close()
