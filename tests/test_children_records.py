"""Child-run records written before #39's fixes still replay (the conformance suite,
persistkit/testing/children_suite.py, checks the current ones on every store).

Before, a child's run id was ``<parent run id>:<position>`` (no digest of the parent's thread)
and the ``pk.start`` record kept no digest of the arguments. A resumed parent must get the same
handle from such a record (the run id comes from the record, not from today's derivation), must
not compare arguments it has no digest of, and must still refuse another agent there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import persistkit as pk
from persistkit.coordination import _children as C
from persistkit.engine._run import Run
from persistkit.state._records import Record
from persistkit.testing.children_suite import RAN, _Crash, echoes, research


def _start_record(store: pk.Store) -> Record:
    rows = store.backend.list("sup", "")
    return next(r for r in (Record.decode(store.codec, row) for row in rows) if r.body.get("n") == C.START)


def _written_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """Record as the code before #39 did: the old run id, no arguments digest on pk.start."""
    monkeypatch.setattr(C, "child_run_id", lambda run_id, position, *_: f"{run_id}:{position}")
    monkeypatch.setattr(Run, "arguments", lambda self, args, kwargs: None)


def test_a_start_recorded_before_replays_to_the_same_handle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = pk.connect(f"sqlite:///{tmp_path}/old.db")
    queue: list[dict[str, Any]] = []
    with monkeypatch.context() as m:
        _written_before(m)
        with pytest.raises(_Crash), pk.resume("sup", store=store, run_id="r1"):
            old = pk.start(research, "old/a", executor=queue.append)
            raise _Crash("the parent's process dies here")
    assert (old.run_id, old.thread_id) == ("r1:0", "sup~r1:0")
    assert "a" not in _start_record(store).body  # no digest of the arguments, as before
    with (
        pytest.raises(pk.NonDeterminismError, match=r"now starts .*:echoes"),
        pk.resume("sup", store=store, run_id="r1"),
    ):
        pk.start(echoes, "old/a", executor=queue.append)  # another agent: still refused
    with pk.resume("sup", store=store, run_id="r1") as run:
        # no digest to compare the arguments with: the recorded handle, as before
        h = pk.start(research, "old/a", executor=queue.append)
        assert h == old and h.run_id == "r1:0"
        assert pk.run_child(queue[0], store=store) == "OLD/A!"
        assert h.result() == "OLD/A!"
    assert run.status == "completed" and RAN["old/a"] == 1
    assert [(k.child.run_id, k.status) for k in store.children("sup")] == [("r1:0", "completed")]
    store.close()


def test_a_start_records_the_digest_its_replay_compares(tmp_path: Path) -> None:
    """Today's record keeps the arguments' digest (``a``) beside the handle: a resumed parent
    compares it without reading anything from the store."""
    store = pk.connect(f"sqlite:///{tmp_path}/new.db")
    with pytest.raises(_Crash), pk.resume("sup", store=store, run_id="r1") as run:
        h = pk.start(research, "new/a", executor=lambda spec: None)
        raise _Crash("the parent's process dies here")
    assert str(_start_record(store).body["a"]).startswith("x:")
    assert h.run_id == C.child_run_id("r1", "0", "sup", run.namespace) != "r1:0"
    reads: list[str] = []
    backend = store.backend
    real = backend.kv_get

    def counted(*args: Any, **kwargs: Any) -> Any:
        reads.append("kv_get")
        return real(*args, **kwargs)

    backend.kv_get = counted  # type: ignore[method-assign]
    with (
        pytest.raises(pk.NonDeterminismError, match="other arguments"),
        pk.resume("sup", store=store, run_id="r1"),
    ):
        pk.start(research, "new/b", executor=lambda spec: None)
    assert reads == []  # the check reads no link
    store.close()
