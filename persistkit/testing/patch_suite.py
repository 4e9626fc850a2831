"""Conformance checks for deploys while runs wait: ``pk.patched`` and the replay check.

Mix :class:`PatchConformance` into a test class that provides a ``persistkit_url``
fixture (and ``backend_options`` if the store needs options)::

    class TestMyStorePatches(PatchConformance):
        @pytest.fixture
        def persistkit_url(self) -> str:
            return "mystore://localhost/test"

It checks, through ``pk.resume`` on the store: a run recorded by old code (no patch)
finishes on the old path under new code while a new run takes the new path; the patch
id is recorded with the run's next checkpoint (``pt``) and read back by a later resume
in another ``pk.connect`` instance ("process"); and ``store.check_replay`` finds the
waiting runs with the store protocol, lists the one that would stop (step, position)
and writes nothing — the store's rows, heads, blobs and lease records are byte for
byte what they were.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from .._errors import NonDeterminismError
from ..engine._api import checkpointed, resume
from ..engine._patches import patched
from ..engine._store import Store
from ._stores import TwoStores

__all__ = ["PatchConformance", "store_bytes"]

_BODIES: list[str] = []


class _Crash(BaseException):
    """Stands for a process that dies mid-run: the block writes no end record."""


@checkpointed
def _charge(order: str) -> str:
    _BODIES.append(f"charge {order}")
    return f"charged {order}"


@checkpointed
def _refund_v1(order: str) -> str:
    _BODIES.append(f"refund_v1 {order}")
    return f"refunded {order} (v1)"


@checkpointed
def _refund_v2(order: str) -> str:
    _BODIES.append(f"refund_v2 {order}")
    return f"refunded {order} (v2)"


@checkpointed
async def _aitem(name: str) -> str:
    _BODIES.append(name)
    return name


def _agent(version: int, guarded: bool = True) -> Any:
    """The entry of version 1 (refund_v1) or 2 (refund_v2: behind pk.patched when guarded)."""

    def entry(
        thread_id: str, run_id: str, *, store: Store, crash: bool = False, crash_after_refund: bool = False
    ) -> list[str]:
        with resume(thread_id, store=store, run_id=run_id) as run:
            out = [_charge(run_id)]
            if crash:
                raise _Crash
            if version == 1 or (guarded and not patched("refund-v2")):
                out.append(_refund_v1(run_id))
            else:
                out.append(_refund_v2(run_id))
            if crash_after_refund:
                raise _Crash
            out.append(_charge(run_id + "-again"))
            run.state["out"] = out
            return out

    return entry


def store_bytes(store: Store, prefix: str) -> Any:
    """Everything the store holds for threads starting with ``prefix``, as bytes (protocol only)."""
    b = store.backend
    out: dict[str, Any] = {}
    for t in b.threads(prefix=prefix):
        head = b.head(t, "")
        rows = [(r.checkpoint_id, r.parent_id, r.run_id, bytes(r.payload)) for r in b.list(t, "")]
        out[t] = (head, rows, b.scan_blobs(t, "", "\x7f"))
    leases = b.lease_list(prefix=prefix) if b.supports_leases else []
    return out, sorted((t, ns, rec.version, rec.token, bytes(rec.data)) for t, ns, rec in leases)


class PatchConformance(TwoStores):
    """Mix into a test class that provides ``persistkit_url``."""


    def test_old_run_finishes_on_the_old_path_new_run_takes_the_new(self, stores: tuple[Store, Store]) -> None:
        old_proc, new_proc = stores
        tag = uuid.uuid4().hex[:8]
        t_old, t_new = f"patch-old-{tag}", f"patch-new-{tag}"
        with pytest.raises(_Crash):
            _agent(1)(t_old, "r-old", store=old_proc, crash_after_refund=True)
        _BODIES.clear()
        assert _agent(2)(t_old, "r-old", store=new_proc) == [
            "charged r-old", "refunded r-old (v1)", "charged r-old-again"
        ]
        assert _BODIES == ["charge r-old-again"]  # the committed steps did not run again
        _BODIES.clear()
        assert _agent(2)(t_new, "r-new", store=new_proc)[1] == "refunded r-new (v2)"
        steps = [c.step for c in old_proc.history(t_new) if c.kind == "step"]
        assert str(steps[-2]).endswith("_refund_v2")
        # the redelivery of each (another store instance) replays: same answers, nothing runs
        _BODIES.clear()
        assert _agent(2)(t_old, "r-old", store=old_proc)[1] == "refunded r-old (v1)"
        assert _agent(2)(t_new, "r-new", store=old_proc)[1] == "refunded r-new (v2)"
        assert _BODIES == []

    def test_patch_id_recorded_before_a_crash_is_read_back(self, stores: tuple[Store, Store]) -> None:
        a, b = stores
        t = f"patch-crash-{uuid.uuid4().hex[:8]}"
        seen: list[bool] = []

        def entry(store: Store, crash: bool) -> None:
            with resume(t, store=store, run_id="r"):
                _charge("x")
                seen.append(patched("p"))
                _refund_v2("x")  # the checkpoint that carries the patch id
                if crash:
                    raise _Crash
                _charge("y")

        with pytest.raises(_Crash):
            entry(a, True)
        entry(b, False)  # another instance: the id comes from the store
        assert seen == [True, True]

    def test_replay_check_lists_the_run_that_would_stop_and_writes_nothing(self, stores: tuple[Store, Store]) -> None:
        store, other = stores
        tag = uuid.uuid4().hex[:8]
        t_old, t_done, t_fresh = f"rc-{tag}-old", f"rc-{tag}-done", f"rc-{tag}-fresh"
        with pytest.raises(_Crash):
            _agent(1)(t_old, "r-old", store=store, crash_after_refund=True)  # waits past its refund
        _agent(1)(t_done, "r-done", store=store)  # completed: not checked
        with pytest.raises(_Crash):
            _agent(1)(t_fresh, "r-fresh", store=store, crash=True)  # waits before its refund
        before = store_bytes(store, f"rc-{tag}")
        _BODIES.clear()
        bad = other.check_replay(_agent(2, guarded=False), prefix=f"rc-{tag}")
        assert not bad.ok and _BODIES == []
        got = {r.thread_id: (r.run_id, r.outcome, r.position) for r in bad.runs}
        assert got == {t_old: ("r-old", "stops", "1"), t_fresh: ("r-fresh", "continues", "1")}
        good = other.check_replay(_agent(2), prefix=f"rc-{tag}")
        assert good.ok, good
        assert [r.thread_id for r in good.needing("refund-v2")] == [t_old]
        assert _BODIES == [] and store_bytes(store, f"rc-{tag}") == before

    def test_replay_check_names_step_and_position(self, stores: tuple[Store, Store]) -> None:
        store, other = stores
        tag = uuid.uuid4().hex[:8]
        t = f"rcs-{tag}"

        def v1(thread_id: str, run_id: str, *, store: Store, crash: bool = False) -> None:
            with resume(thread_id, store=store, run_id=run_id):
                _charge("a")
                _refund_v1("a")
                if crash:
                    raise _Crash
                _charge("b")

        def v2(thread_id: str, run_id: str, *, store: Store) -> None:
            with resume(thread_id, store=store, run_id=run_id):
                _charge("a")
                if patched("refund-v2"):
                    _refund_v2("a")
                else:
                    _refund_v1("a")
                _charge("b")

        def v2_unguarded(thread_id: str, run_id: str, *, store: Store) -> None:
            with resume(thread_id, store=store, run_id=run_id):
                _charge("a")
                _refund_v2("a")
                _charge("b")

        with pytest.raises(_Crash):
            v1(t, "r1", store=store, crash=True)
        before = store_bytes(store, t)
        _BODIES.clear()
        report = other.check_replay(v2_unguarded, threads=[t])
        (run,) = report.runs
        assert (run.thread_id, run.run_id, run.status, run.outcome) == (t, "r1", "running", "stops")
        assert (run.position, run.error_type) == ("1", "NonDeterminismError")
        assert run.step is not None and run.step.endswith("_refund_v2")
        assert run.error is not None and "pk.patched" in run.error
        report = other.check_replay(v2, threads=[t])
        (run,) = report.runs
        assert report.ok and (run.outcome, run.position, run.old_patches) == ("continues", "2", ("refund-v2",))
        assert _BODIES == [] and store_bytes(store, t) == before
        areport = asyncio.run(other.acheck_replay(v2_unguarded, threads=[t]))
        assert [(r.outcome, r.position) for r in areport.runs] == [("stops", "1")]
        assert store_bytes(store, t) == before
        with pytest.raises(NonDeterminismError, match="at step position 1"):
            v2_unguarded(t, "r1", store=other)  # the real resume stops where the check said
