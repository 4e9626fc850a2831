"""What a prune may take from one chain (persistkit.ops._retention.doomed), record by record.

The end-to-end checks (every store, every wrapper) are the shipped RetentionConformance;
these pin the rules on hand-made records, the cases a random history rarely reaches.
"""

from __future__ import annotations

from typing import Any

from persistkit.backends import CheckpointRow
from persistkit.ops._retention import Retention, doomed, thread_expired, unfinished_run
from persistkit.state._records import Record

NOW = 1_000_000.0


def rec(n: int, run: str | None, kind: str = "step", rs: str = "running", t: float = NOW, **body: Any) -> Record:
    cid = f"{n:024x}"
    parent = f"{n - 1:024x}" if n > 1 else None
    return Record(CheckpointRow("t", "", cid, parent, run, b""), {"k": kind, "rs": rs, "t": t, **body})


def ids(*ns: int) -> set[str]:
    return {f"{n:024x}" for n in ns}


def finished_runs() -> list[Record]:
    """Two completed runs of three records each, then a third run's first step."""
    return [
        rec(1, "a"), rec(2, "a"), rec(3, "a", "end", "completed"),
        rec(4, "b"), rec(5, "b"), rec(6, "b", "end", "completed"),
    ]


def test_keep_last_never_takes_the_head() -> None:
    chain = finished_runs()
    assert doomed(chain, Retention(keep_last=2), now=NOW) == ids(1, 2, 3, 4)
    assert doomed(chain[:1], Retention(keep_last=1), now=NOW) == set()


def test_an_unfinished_run_keeps_its_records_and_its_base() -> None:
    chain = [*finished_runs(), rec(7, "c"), rec(8, "c", s="failed", rs="failed")]
    assert unfinished_run(chain) == "c"
    # the base of run c is record 6 (its first record's parent)
    assert doomed(chain, Retention(keep_last=1), now=NOW) == ids(1, 2, 3, 4, 5)
    suspended = [*finished_runs(), rec(7, "c", rs="suspended")]
    assert doomed(suspended, Retention(final_only=True), now=NOW) == ids(1, 2, 4, 5)


def test_max_age_and_keep_last_both_have_to_let_go() -> None:
    old, young = NOW - 100, NOW - 1
    chain = [rec(1, "a", t=old), rec(2, "a", t=old), rec(3, "a", t=young), rec(4, "a", "end", "completed", t=young)]
    assert doomed(chain, Retention(max_age=10), now=NOW) == ids(1, 2)
    assert doomed(chain, Retention(max_age=10, keep_last=3), now=NOW) == ids(1)
    assert doomed(chain, Retention(max_age=1000, keep_last=1), now=NOW) == set()


def test_final_only_keeps_each_finished_runs_last_record() -> None:
    assert doomed(finished_runs(), Retention(final_only=True), now=NOW) == ids(1, 2, 4, 5)


def test_a_fork_source_stays() -> None:
    assert doomed(finished_runs(), Retention(keep_last=1), forked_from=dict.fromkeys(ids(2)), now=NOW) == ids(1, 3, 4, 5)


def test_a_pending_effect_and_the_done_marks_of_kept_effects_stay() -> None:
    done = f"{2:024x}.0"
    chain = [
        rec(1, "a"),
        rec(2, "a", ac=[{"f": "m:f", "a": {}}]),  # its effect is marked done by 3
        rec(3, "a", ad=[done], dm=1),
        rec(4, "a", ac=[{"f": "m:f", "a": {}}]),  # never marked done: pending
        rec(5, "a", "end", "completed"),
    ]
    # the pending effect's record stays; record 2 goes, so its done mark may go too
    assert doomed(chain, Retention(keep_last=1), now=NOW) == ids(1, 2, 3)
    # when record 2 stays (a fork was taken from it), its done mark stays with it
    assert doomed(chain, Retention(keep_last=1), forked_from=dict.fromkeys(ids(2)), now=NOW) == ids(1)


def test_thread_ttl_spares_unfinished_threads_and_pending_effects() -> None:
    old = NOW - 100
    finished = {"": [rec(1, "a", t=old), rec(2, "a", "end", "completed", t=old)]}
    assert thread_expired(finished, Retention(thread_ttl=10), now=NOW)
    assert not thread_expired(finished, Retention(thread_ttl=1000), now=NOW)
    crashed = {"": [rec(1, "a", t=old)]}
    assert not thread_expired(crashed, Retention(thread_ttl=10), now=NOW)
    pending = {"": [rec(1, "a", ac=[{"f": "m:f", "a": {}}], t=old), rec(2, "a", "end", "completed", t=old)]}
    assert not thread_expired(pending, Retention(thread_ttl=10), now=NOW)
    young_namespace = {**finished, "sub": [rec(3, "b", "end", "completed", t=NOW)]}
    assert not thread_expired(young_namespace, Retention(thread_ttl=10), now=NOW)


def test_a_checkpoint_pruned_while_it_is_read_is_not_found(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A reader that read a checkpoint's record just before a prune deleted it and the rows its
    list links to gets NotFoundError, not a "damaged store" IntegrityError."""
    import uuid

    import pytest

    import persistkit as pk
    from persistkit import NotFoundError
    from persistkit.engine import _store_plans

    store = pk.connect(f"memory://race-{uuid.uuid4().hex[:8]}")

    @pk.checkpointed
    def say(i: int) -> str:
        pk.current_run().state["log"].append(f"line {i}")  # type: ignore[union-attr]
        return "ok"

    with pk.resume("race", store=store, state={"log": []}):
        for i in range(6):
            say(i)
    old = store.history("race")[-3].checkpoint_id
    real = _store_plans.StorePlans.read_record

    def read_then_prune(self, thread_id, namespace, checkpoint_id):  # type: ignore[no-untyped-def]
        rec = yield from real(self, thread_id, namespace, checkpoint_id)
        ids = [c.checkpoint_id for c in store.history("race")][1:]
        store.backend.prune_rows("race", "", ids)  # a prune, between the read and the walk
        return rec

    monkeypatch.setattr(_store_plans.StorePlans, "read_record", read_then_prune)
    with pytest.raises(NotFoundError, match="deleted while it was read"):
        store.get_state("race", checkpoint_id=old)
