"""What ``pk.resume(concurrency=..., busy="debounce", ...)`` adds around a block, in the order
the block meets it (the engine calls one hook at each point; ``_concurrency`` and
``_debounce`` hold the logic):

1. :meth:`Gate.before_sync` — before the thread's lease: a debounced turn sends its message
   and joins a live leader's burst (``pk.Debounced``: the block does not run).
2. the thread's lease and the run open (``_turns``), under ``busy="queue"`` for a debounced turn.
3. :meth:`Gate.opened_sync` — a debounce leader gathers the burst until it went quiet; then a
   concurrency slot is taken (``ConcurrencyLimitError`` under ``"reject"`` or past ``busy_timeout``).
4. :meth:`Gate.entered_sync` — at the block's first step position, the leader takes the batch
   (or a resumed run replays it): ``run.messages``.
5. :meth:`Gate.exit_sync` — the slot is given up when the block ends (after its end record).

A hook that raises gives up what the gate and the thread's lease hold, so the engine's
``__enter__`` needs no cleanup of its own for them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._errors import ConfigurationError
from .._io import Plan
from ..backends._capabilities import require
from . import _concurrency as C
from . import _debounce as D
from ._hooks import Holding, let_go_async, let_go_sync

if TYPE_CHECKING:
    from ..engine._run import Run

__all__ = ["Gate", "make_gate"]

#: The position of a debounced turn's batch: the block's first step position.
POSITION = "0"


def make_gate(
    busy: object,
    concurrency: object,
    debounce: object,
    message: object,
    run_id: str | None,
    ttl: float,
    timeout: float | None,
) -> tuple[Gate | None, object]:
    """The gate of a ``pk.resume`` (None without either option) and the thread-lease policy
    to use (``busy="debounce"`` queues for the lease)."""
    window = D.check_debounce(busy, debounce, message, run_id)
    lease_busy = "queue" if window is not None else busy
    spec = C.check_concurrency(concurrency, lease_busy)
    if spec is None and window is None:
        return None, busy
    return Gate(spec, window, message, str(lease_busy), ttl, timeout), lease_busy


class Gate:
    __slots__ = ("busy", "held", "message", "seq", "since", "spec", "timeout", "ttl", "window")

    def __init__(
        self,
        spec: C.Concurrency | None,
        window: tuple[float, float] | None,
        message: Any,
        busy: str,
        ttl: float,
        timeout: float | None,
    ) -> None:
        self.spec, self.window, self.message, self.busy = spec, window, message, busy
        self.ttl, self.timeout = ttl, timeout
        self.held: C.Held | None = None
        self.seq = 0
        self.since = time.monotonic()

    def _deadline(self) -> float | None:
        return None if self.timeout is None else self.since + self.timeout

    def _leads(self, run: Run, holding: Holding | None) -> bool:
        # a run that replays (finished), was resumed past its batch, or shares an enclosing lease gathers nothing
        return (
            self.window is not None
            and self.message is not None
            and holding is not None
            and holding.beat is not None
            and not run.replay_only
            and POSITION not in run._index
        )

    def _check(self, run: Run, run_id: str) -> Callable[[], Plan[bool]]:
        """What ``_turns`` asks when the thread's newest run is another turn's, unfinished: was
        this turn's message taken meanwhile (``pk.Debounced``)? Then it need not wait for that run."""

        def taken() -> Plan[bool]:
            return D.taken(run.codec, run.thread_id, run.namespace, run_id, self.seq, POSITION)

        return taken

    # -- sync -----------------------------------------------------------------------------------

    def before_sync(self, run: Run, run_id: str | None) -> None:
        self.since = time.monotonic()
        if (
            self.window is None or self.message is None
        ):  # no message: a turn continued (an answer, a retry)
            return
        assert run_id is not None
        require(run.store.backend, "kv", "pk.resume(busy='debounce')")
        self.seq = run.store.run_sync(
            D.send(run.codec, run.thread_id, run.namespace, run_id, self.message)
        )
        run.store.run_sync(
            D.join(run.codec, run.thread_id, run.namespace, run_id, self.seq, POSITION)
        )
        run.turn_check = self._check(run, run_id)

    def opened_sync(self, run: Run, holding: Holding | None) -> None:
        try:
            if self._leads(run, holding):
                assert self.window is not None and holding is not None
                run.store.run_sync(
                    D.lead(
                        run.codec,
                        run.thread_id,
                        run.namespace,
                        run.run_id,
                        self.seq,
                        POSITION,
                        holding.lease,
                        *self.window,
                    )
                )
            if self.spec is not None and not run.replay_only:
                self.held = C.take_sync(
                    run.store,
                    self.spec,
                    holding,
                    self.busy,
                    self.ttl,
                    self._deadline(),
                    self.timeout,
                )
        except BaseException:
            self.exit_sync(run.store)
            let_go_sync(run.store, holding)
            raise

    def entered_sync(self, run: Run, holding: Holding | None, child: Callable[[], str]) -> None:
        if self.window is None:
            return
        try:
            position = child()
            _first(position)
            rec = (
                run.lookup(position, D.STEP) if position in run._index or run.replay_only else None
            )
            if rec is not None:
                run.messages = run.replay(rec)
                return
            values = run.store.run_sync(
                D.take_batch(run.codec, run.thread_id, run.namespace, run.run_id, position)
            )
            run.step_sync(position, D.STEP, None, result=values)
            run.messages = values
        except BaseException:
            self.exit_sync(run.store)
            let_go_sync(run.store, holding)
            raise

    def exit_sync(self, store: Any) -> None:
        held, self.held = self.held, None
        C.let_go_sync(store, held)

    # -- async ----------------------------------------------------------------------------------

    async def before_async(self, run: Run, run_id: str | None) -> None:
        self.since = time.monotonic()
        if self.window is None or self.message is None:
            return
        assert run_id is not None
        require(run.store.backend, "kv", "pk.resume(busy='debounce')")
        self.seq = await run.store.run_async(
            D.send(run.codec, run.thread_id, run.namespace, run_id, self.message)
        )
        await run.store.run_async(
            D.join(run.codec, run.thread_id, run.namespace, run_id, self.seq, POSITION)
        )
        run.turn_check = self._check(run, run_id)

    async def opened_async(self, run: Run, holding: Holding | None) -> None:
        try:
            if self._leads(run, holding):
                assert self.window is not None and holding is not None
                await run.store.run_async(
                    D.lead(
                        run.codec,
                        run.thread_id,
                        run.namespace,
                        run.run_id,
                        self.seq,
                        POSITION,
                        holding.lease,
                        *self.window,
                    )
                )
            if self.spec is not None and not run.replay_only:
                self.held = await C.take_async(
                    run.store,
                    self.spec,
                    holding,
                    self.busy,
                    self.ttl,
                    self._deadline(),
                    self.timeout,
                )
        except BaseException:
            await self.exit_async(run.store)
            await let_go_async(run.store, holding)
            raise

    async def entered_async(
        self, run: Run, holding: Holding | None, child: Callable[[], str]
    ) -> None:
        if self.window is None:
            return
        try:
            position = child()
            _first(position)
            rec = (
                run.lookup(position, D.STEP) if position in run._index or run.replay_only else None
            )
            if rec is not None:
                run.messages = run.replay(rec)
                return
            values = await run.store.run_async(
                D.take_batch(run.codec, run.thread_id, run.namespace, run.run_id, position)
            )
            await run.step_async(position, D.STEP, None, result=values)
            run.messages = values
        except BaseException:
            await self.exit_async(run.store)
            await let_go_async(run.store, holding)
            raise

    async def exit_async(self, store: Any) -> None:
        held, self.held = self.held, None
        await C.let_go_async(store, held)


def _first(position: str) -> None:
    if position != POSITION:  # the engine calls entered_* on a fresh frame: never happens
        raise ConfigurationError(
            f"busy='debounce': the batch must be the block's first step, found {position!r}"
        )
