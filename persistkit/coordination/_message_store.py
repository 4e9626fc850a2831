"""``pk.Store``'s methods for messages into runs, events out of them and stopping them (and
async twins): ``send``, ``messages``, ``get_event``, ``cancel``. The plans are ``_inbox`` and
``_cancel``; inside a run, ``pk.receive`` and ``pk.set_event`` are ``_receive``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._errors import ConfigurationError
from ..backends._capabilities import require
from . import _inbox as I

if TYPE_CHECKING:
    from .._io import Plan
    from ..backends._protocol import Backend
    from ..codec._pipeline import Codec
    from ._children import ChildInfo

__all__ = ["MessageStore"]


_MAX_ID = 512  # engine/_store.py's MAX_ID_LENGTH (not imported: the engine imports this module)


def _thread(value: object) -> str:
    if not isinstance(value, str) or not value.strip() or "\x00" in value or len(value) > _MAX_ID:
        raise ConfigurationError(
            f"thread_id must be a non-empty str without NUL, at most {_MAX_ID} characters, got {value!r:.80}"
        )
    return value


def _namespace(value: object) -> str:
    if not isinstance(value, str) or "\x00" in value or len(value) > _MAX_ID:
        raise ConfigurationError(f"namespace must be a str without NUL, at most {_MAX_ID} characters, got {value!r:.80}")
    return value


def _seconds(value: object, what: str) -> float:
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
        raise ConfigurationError(f"{what} must be seconds >= 0 (or None: do not wait), got {value!r}")
    return float(value)


def _limit(limit: object) -> int | None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ConfigurationError(f"limit must be a positive int or None, got {limit!r}")
    return limit


class MessageStore:
    """Sending messages to runs and reading their events (mixed into ``pk.Store``)."""

    if TYPE_CHECKING:
        backend: Backend
        codec: Codec

        def _check_open(self) -> None: ...
        def run_sync(self, plan: Plan[Any]) -> Any: ...
        async def run_async(self, plan: Plan[Any]) -> Any: ...

    def _inbox(self, what: str) -> None:
        self._check_open()
        require(self.backend, "kv", what)

    def send(self, thread_id: str, message: Any, *, topic: str = "", key: str | None = None, namespace: str = "") -> int:
        """Send ``message`` to the runs of ``thread_id``: the next ``pk.receive(topic)`` of a
        run of the thread returns it, in the order messages were sent; one that nobody
        receives yet (no run, a finished one, a run busy elsewhere) is kept for the thread's
        next receive of ``topic``, in this turn or a later one. ``key`` makes it idempotent:
        a key sent before stores nothing and returns the number its message got (sent twice,
        received once). Returns the message's number in its topic (1, 2, ...).
        It starts no run: a run suspended in ``pk.receive`` goes on at its next resume
        (``store.due()`` lists it once the message is there). Any process may send."""
        self._inbox("store.send")
        plan = I.send_plan(
            self.codec, _thread(thread_id), _namespace(namespace), I.check_topic(topic), message, I.check_key(key)
        )
        seq: int = self.run_sync(plan)
        return seq

    async def asend(
        self, thread_id: str, message: Any, *, topic: str = "", key: str | None = None, namespace: str = ""
    ) -> int:
        self._inbox("store.asend")
        plan = I.send_plan(
            self.codec, _thread(thread_id), _namespace(namespace), I.check_topic(topic), message, I.check_key(key)
        )
        seq: int = await self.run_async(plan)
        return seq

    def messages(
        self, thread_id: str, *, topic: str = "", namespace: str = "", limit: int | None = None
    ) -> list[I.Message]:
        """The messages sent to ``thread_id`` on ``topic``, oldest first, received ones included
        (``received``): what an operator or a UI shows of the thread's inbox."""
        self._inbox("store.messages")
        plan = I.messages_plan(self.codec, _thread(thread_id), _namespace(namespace), I.check_topic(topic), _limit(limit))
        found: list[I.Message] = self.run_sync(plan)
        return found

    async def amessages(
        self, thread_id: str, *, topic: str = "", namespace: str = "", limit: int | None = None
    ) -> list[I.Message]:
        self._inbox("store.amessages")
        plan = I.messages_plan(self.codec, _thread(thread_id), _namespace(namespace), I.check_topic(topic), _limit(limit))
        found: list[I.Message] = await self.run_async(plan)
        return found

    def get_event(
        self, thread_id: str, key: str, *, wait: float | None = None, default: Any = None, namespace: str = ""
    ) -> Any:
        """The newest value a run of ``thread_id`` set for event ``key`` (``pk.set_event``),
        waiting up to ``wait`` seconds for one to be set; ``default`` if there is none."""
        self._inbox("store.get_event")
        plan = I.get_event_plan(
            self.codec, _thread(thread_id), _namespace(namespace), _event(key), _seconds(wait, "wait"), default
        )
        return self.run_sync(plan)

    async def aget_event(
        self, thread_id: str, key: str, *, wait: float | None = None, default: Any = None, namespace: str = ""
    ) -> Any:
        self._inbox("store.aget_event")
        plan = I.get_event_plan(
            self.codec, _thread(thread_id), _namespace(namespace), _event(key), _seconds(wait, "wait"), default
        )
        return await self.run_async(plan)


    def cancel(self, thread_id: str, run_id: str | None = None, *, namespace: str = "") -> str:
        """Stop run ``run_id`` of ``thread_id`` (None: the run live or unfinished on the thread).
        A live run (it holds the thread's lease) is asked to stop: at its next step boundary
        ``pk.RunCancelledError`` is raised inside it (its ``finally`` blocks and a saga's
        compensations run; a long step may look at ``pk.cancelled()``), and it ends with
        status ``cancelled``; returns ``"requested"``. A run in this process is told at once,
        one in another process at its lease's next renewal (every ``lease_ttl / 3`` s, 10 s
        by default). A run nobody runs (suspended, or its process died) is ended now with an
        end record of status ``cancelled`` (no code runs; its committed steps stay); returns
        ``"cancelled"``. Either way a redelivery of the run runs nothing. The stop reaches every
        unfinished child run it started (``pk.start``, ``on_parent_close="cancel"``), recursively,
        whatever process runs them."""
        from ._child_stop import cancel_tree_sync

        return cancel_tree_sync(self, _thread(thread_id), _run_id(run_id), _namespace(namespace))

    async def acancel(self, thread_id: str, run_id: str | None = None, *, namespace: str = "") -> str:
        from ._child_stop import cancel_tree_async

        return await cancel_tree_async(self, _thread(thread_id), _run_id(run_id), _namespace(namespace))

    def children(self, thread_id: str, *, run_id: str | None = None, namespace: str | None = None) -> list[ChildInfo]:
        """The child runs that runs of ``thread_id`` started (``pk.start``; of ``run_id`` only, when
        given), oldest first, each with its status now: what ``persistkit show`` draws as the tree."""
        from ._children import children_plan

        self._inbox("store.children")
        ns = None if namespace is None else _namespace(namespace)
        found: list[ChildInfo] = self.run_sync(children_plan(self.codec, _thread(thread_id), ns, _run_id(run_id)))
        return found

    async def achildren(
        self, thread_id: str, *, run_id: str | None = None, namespace: str | None = None
    ) -> list[ChildInfo]:
        from ._children import children_plan

        self._inbox("store.achildren")
        ns = None if namespace is None else _namespace(namespace)
        found: list[ChildInfo] = await self.run_async(children_plan(self.codec, _thread(thread_id), ns, _run_id(run_id)))
        return found


def _run_id(value: object) -> str | None:
    return None if value is None else _thread(value)


def _event(key: object) -> str:
    checked = I.check_key(key, "an event key")
    if checked is None:
        raise ConfigurationError("an event key must be a non-empty str, got None")
    return checked
