"""OpenTelemetry spans and metrics, and ``logging`` lines, for runs and steps.

Off unless asked for, and free when off. :func:`opened` decides once per run, when a
``pk.resume`` block has opened its run, whether the run gets an :class:`Observer`: only
when the ``opentelemetry`` API is imported (the ``persistkit[otel]`` extra) and a real
tracer or meter provider is set (not the API's default proxy or a no-op one), or when
the ``persistkit`` logger is enabled for DEBUG. The engine keeps it as ``run.observer``
and tests it for None where a step is called and where a checkpoint is written; with
no observer nothing else of this module runs per step.

Spans: ``persistkit.run`` per block (from its open, lease wait included, to its exit)
and ``persistkit.step`` per step call, replayed or run (a child of the run's span, or
of the enclosing step's: code in a step that makes its own spans nests under it).
Events on them: ``persistkit.retry``, ``persistkit.conflict``, ``persistkit.suspended``,
``persistkit.opened`` (lease wait and reading the run). Metrics: checkpoint size and
write latency (histograms), replays, retries and conflicts (counters); a shared rate
limit's waits (histogram) and ``RateLimitedError`` refusals (counter), by limit name; a
concurrency limit's waits for a slot (histogram) and ``ConcurrencyLimitError`` refusals
(counter), by its name (never its key: a tenant id).

Nothing of a state value, an argument or a result goes into a span, a metric or a log
line: identifiers (thread, run, namespace, position, step name), statuses, counts and
sizes only. An exception is recorded by its type and its message and stack trace
passed through :func:`persistkit.secrets._scrub.scrub_error` (what a recorded error's
record would hold of them), never as raised; a step's name through ``scrub_name`` (a name
may carry a key: ``name=f"call-{key}"``).
"""

from __future__ import annotations

import contextvars
import logging
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from ..coordination import _concurrency as _slots
from ..coordination._suspend import Suspended
from ..secrets._scrub import scrub_error, scrub_name

__all__ = ["Observer", "conflicted", "opened", "retrying"]

log = logging.getLogger("persistkit")

# Attribute names: semantic, under the persistkit namespace.
THREAD = "persistkit.thread_id"
RUN = "persistkit.run_id"
NAMESPACE = "persistkit.namespace"
STATUS = "persistkit.status"
BYTES = "persistkit.checkpoint.bytes"
STEP = "persistkit.step.name"
POSITION = "persistkit.step.position"
REPLAYED = "persistkit.step.replayed"
ATTEMPT = "persistkit.step.attempt"
KIND = "persistkit.checkpoint.kind"
LIMIT = "persistkit.limit.name"
CONCURRENCY = "persistkit.concurrency.name"
_KINDS = {k: {KIND: k} for k in ("step", "suspend", "end")}  # made once: a metric's attributes per write


class RunLike(Protocol):
    """What this module reads of the engine's ``Run`` (which it cannot import)."""

    thread_id: str
    run_id: str
    namespace: str
    status: str
    replay_only: bool
    lease: Any


class StepLike(Protocol):
    name: str


class FrameLike(Protocol):
    path: str


class _Call:
    """One step call of an observed run: its span, and what the run told about it."""

    __slots__ = ("attempt", "bytes", "name", "obs", "parent", "position", "replayed", "span", "status")

    def __init__(self, obs: Observer, name: str, parent: str) -> None:
        self.obs, self.name, self.parent = obs, name, parent
        self.span: Any = None
        self.position: str | None = None
        self.replayed = False
        self.status: str | None = None
        self.bytes = 0
        self.attempt = 1

    def owns(self, obs: Observer, position: str, name: str) -> bool:
        """Whether the record at ``position`` named ``name`` is this call's own (not a child
        step's, a question asked in it, or another run's)."""
        return (
            obs is self.obs and self.position is None and name == self.name
            and position.rpartition("/")[0] == self.parent
        )


#: The step call being observed in this context (set only while a run has an observer).
_CALL: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("persistkit_telemetry_call", default=None)


# -- providers, looked up once per run -------------------------------------------------------

_tracer_cache: tuple[Any, Any] = (None, None)  # (provider, tracer)
_meter_cache: tuple[Any, Any] = (None, None)  # (provider, instruments)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("persistkit")
    except PackageNotFoundError:  # a checkout on PYTHONPATH
        return "0"


def _tracer() -> Any:
    """The tracer of a configured tracer provider, or None (OpenTelemetry not imported, or
    only the API's default proxy or a no-op provider): one dict lookup when unused."""
    global _tracer_cache
    api = sys.modules.get("opentelemetry.trace")
    if api is None:
        return None
    provider = api.get_tracer_provider()
    if isinstance(provider, api.ProxyTracerProvider | api.NoOpTracerProvider):
        return None
    if _tracer_cache[0] is not provider:
        _tracer_cache = (provider, provider.get_tracer("persistkit", _version()))
    return _tracer_cache[1]


class _Instruments:
    __slots__ = (
        "conflicts", "latency", "limit_waits", "rate_limited", "replays", "retries", "size", "slot_refused", "slot_waits",
    )

    def __init__(self, meter: Any) -> None:
        self.size = meter.create_histogram(
            "persistkit.checkpoint.size", unit="By", description="Bytes of a checkpoint written (row and blobs)"
        )
        self.latency = meter.create_histogram(
            "persistkit.checkpoint.write.duration", unit="s", description="Time to write one checkpoint to the store"
        )
        self.replays = meter.create_counter(
            "persistkit.step.replays", unit="{step}", description="Step calls answered from the store instead of run"
        )
        self.retries = meter.create_counter(
            "persistkit.step.retries", unit="{attempt}", description="Failed step attempts that pk.Retry tries again"
        )
        self.conflicts = meter.create_counter(
            "persistkit.conflicts", unit="{conflict}", description="Checkpoints refused because the thread's head moved"
        )
        self.limit_waits = meter.create_histogram(
            "persistkit.limit.wait.duration", unit="s", description="Time a call waited for a shared rate limit (store.limits)"
        )
        self.rate_limited = meter.create_counter(
            "persistkit.limit.rate_limited", unit="{call}", description="Calls refused with RateLimitedError (no capacity in time)"
        )
        self.slot_waits = meter.create_histogram(
            "persistkit.concurrency.wait.duration", unit="s",
            description="Time a turn waited for a slot of a concurrency limit (pk.resume(concurrency=))",
        )
        self.slot_refused = meter.create_counter(
            "persistkit.concurrency.refused", unit="{turn}",
            description="Turns refused with ConcurrencyLimitError (every slot taken: busy='reject' or busy_timeout)",
        )


def _instruments() -> _Instruments | None:
    """The instruments of a configured meter provider, or None (as :func:`_tracer`)."""
    global _meter_cache
    api = sys.modules.get("opentelemetry.metrics")
    if api is None:
        return None
    provider = api.get_meter_provider()
    if isinstance(provider, api.NoOpMeterProvider) or type(provider).__name__ == "_ProxyMeterProvider":
        return None
    if _meter_cache[0] is not provider:
        _meter_cache = (provider, _Instruments(provider.get_meter("persistkit", _version())))
    instruments: _Instruments = _meter_cache[1]
    return instruments


# -- the run ---------------------------------------------------------------------------------


def opened(run: RunLike, began: float, recorded: int) -> Observer | None:
    """Called once when a ``pk.resume`` block opened ``run`` (``began``: ``time.time()`` at
    the block's entry; ``recorded``: how many recorded steps of the run will replay).
    Logs a resume at INFO; the run's observer, or None when there is nothing to report to."""
    if recorded and log.isEnabledFor(logging.INFO):
        log.info(
            "persistkit: thread %r%s run %s resumes: %d recorded step(s) replay without running%s",
            run.thread_id, _ns(run.namespace), run.run_id, recorded,
            " (the run completed: nothing runs)" if run.replay_only else "",
        )
    try:
        tracer, instruments = _tracer(), _instruments()
        debug = log.isEnabledFor(logging.DEBUG)
        if tracer is None and instruments is None and not debug:
            return None
        return Observer(run, began, recorded, tracer, instruments, debug)
    except Exception as exc:  # a broken exporter setup must not fail (or leak the lease of) the run
        log.warning("persistkit: telemetry is off for thread %r run %s: %s", run.thread_id, run.run_id, _describe(exc))
        return None


class Observer:
    """What one observed run reports: its span, its step spans, metrics and DEBUG lines.

    Made by :func:`opened`; the engine calls :meth:`call_sync`/:meth:`call_async` around
    a step call, :meth:`replayed` and :meth:`wrote` when a step replays or a checkpoint
    lands, and :meth:`end` when the block exits."""

    __slots__ = ("debug", "ids", "instruments", "run_span", "token", "tracer", "written")

    def __init__(
        self, run: RunLike, began: float, recorded: int, tracer: Any, instruments: _Instruments | None, debug: bool
    ) -> None:
        self.tracer, self.instruments, self.debug = tracer, instruments, debug
        self.ids = {THREAD: run.thread_id, RUN: run.run_id, NAMESPACE: run.namespace}
        self.written = 0  # bytes of the checkpoints this run wrote
        self.run_span: Any = None
        self.token: Any = None
        if tracer is None:
            return
        from opentelemetry import context, trace

        attrs: dict[str, Any] = {
            **self.ids, "persistkit.run.recorded_steps": recorded, "persistkit.run.replay_only": run.replay_only,
        }
        span = tracer.start_span("persistkit.run", attributes=attrs, start_time=int(began * 1e9))
        opening: dict[str, Any] = {"persistkit.open.seconds": max(0.0, time.time() - began)}
        if run.lease is not None:
            opening["persistkit.lease.token"] = run.lease.token
        span.add_event("persistkit.opened", opening)
        self.run_span = span
        self.token = context.attach(trace.set_span_in_context(span))

    def end(self, run: RunLike, exc: BaseException | None) -> None:
        """The block exited (``exc``: what it raised, or None); ``run.status`` is final."""
        span = self.run_span
        if span is None:
            return
        from opentelemetry import context

        context.detach(self.token)
        try:
            span.set_attributes({STATUS: run.status, BYTES: self.written})
            _outcome(span, exc, failed=run.status == "failed")
            span.end()
        except Exception as error:  # never hide the block's own outcome behind an exporter's error
            log.warning("persistkit: the span of thread %r run %s: %s", run.thread_id, run.run_id, _describe(error))

    # -- step calls --------------------------------------------------------------------------

    def call_sync(self, call: Callable[..., Any], step: StepLike, frame: FrameLike, *rest: Any) -> Any:
        """``call(step, frame, *rest)`` (the engine's step call) inside the step's span."""
        c, tokens = self._enter(step.name, frame.path)
        try:
            result = call(step, frame, *rest)
        except BaseException as exc:
            self._leave(c, tokens, exc)
            raise
        self._leave(c, tokens, None)
        return result

    async def call_async(self, call: Callable[..., Awaitable[Any]], step: StepLike, frame: FrameLike, *rest: Any) -> Any:
        c, tokens = self._enter(step.name, frame.path)
        try:
            result = await call(step, frame, *rest)
        except BaseException as exc:
            self._leave(c, tokens, exc)
            raise
        self._leave(c, tokens, None)
        return result

    def _enter(self, name: str, parent: str) -> tuple[_Call, tuple[Any, Any]]:
        c = _Call(self, name, parent)
        attached = None
        if self.tracer is not None:
            from opentelemetry import context, trace

            c.span = self.tracer.start_span("persistkit.step", attributes={**self.ids, STEP: scrub_name(name)})
            attached = context.attach(trace.set_span_in_context(c.span))
        return c, (_CALL.set(c), attached)

    def _leave(self, c: _Call, tokens: tuple[Any, Any], exc: BaseException | None) -> None:
        _CALL.reset(tokens[0])
        if self.debug:
            how = "replayed" if c.replayed else "ran"
            log.debug(
                "persistkit: thread %r run %s step %r at %s %s: %s%s", self.ids[THREAD], self.ids[RUN], scrub_name(c.name),
                c.position or "(nothing recorded)", how, c.status or _unrecorded(exc),
                f", {c.bytes} bytes written" if c.bytes else "",
            )
        span = c.span
        if span is None:
            return
        from opentelemetry import context

        context.detach(tokens[1])
        told: dict[str, Any] = {REPLAYED: c.replayed, STATUS: c.status or _unrecorded(exc), ATTEMPT: c.attempt}
        if c.position is not None:
            told[POSITION] = c.position
        if c.bytes:
            told[BYTES] = c.bytes
        span.set_attributes(told)  # one call: the SDK takes its lock once
        _outcome(span, exc, failed=c.status == "failed")
        span.end()

    # -- what the run tells ------------------------------------------------------------------

    def replayed(self, position: str, name: str, failed: bool) -> None:
        """The record at ``position`` replayed (its recorded result or error is returned)."""
        if self.instruments is not None:
            self.instruments.replays.add(1, {STEP: scrub_name(name)})
        c = _CALL.get()
        if c is not None and c.owns(self, position, name):
            c.position, c.replayed, c.status = position, True, "failed" if failed else "completed"

    def wrote(self, payload: bytes, blobs: Mapping[str, bytes], body: Mapping[str, Any], seconds: float) -> None:
        """A checkpoint of this run landed: ``payload`` and ``blobs`` written in ``seconds``."""
        size = len(payload) + sum(map(len, blobs.values()))
        self.written += size
        suspended = body.get("s") == "suspended"
        kind = "end" if body["k"] == "end" else "suspend" if suspended else "step"
        if self.instruments is not None:
            self.instruments.size.record(size, _KINDS[kind])
            self.instruments.latency.record(seconds, _KINDS[kind])
        if kind != "step":
            if suspended:
                self._event("persistkit.suspended", {POSITION: str(body.get("p")), STEP: scrub_name(str(body.get("n")))})
                c = _CALL.get()  # a pk.suspend inside a step: that step's position is its parent's
                step_at = str(body.get("p")).rpartition("/")[0]
                if c is not None and c.obs is self and c.position is None and step_at and step_at.rpartition("/")[0] == c.parent:
                    c.position = step_at
            return
        c = _CALL.get()
        if c is not None and "dm" not in body and "q" not in body and c.owns(self, body["p"], body["n"]):
            c.position, c.status, c.bytes = body["p"], body["s"], size

    def _event(self, name: str, attrs: dict[str, Any]) -> None:
        """An event on the innermost span of this run: the current step's, else the run's."""
        c = _CALL.get()
        span = c.span if c is not None and c.obs is self and c.span is not None else self.run_span
        if span is not None:
            span.add_event(name, attrs)


# -- rare events: logged at INFO whether or not the run is observed ------------------------------


def retrying(run: Any, position: str, name: str, state: Any) -> None:
    """tenacity's ``before_sleep`` of a step with ``pk.Retry``: attempt ``state.attempt_number``
    failed and the step is tried again."""
    exc = state.outcome.exception() if state.outcome is not None else None
    attempt = int(state.attempt_number)
    if log.isEnabledFor(logging.INFO):
        log.info(
            "persistkit: thread %r run %s step %r at %s: attempt %d failed (%s); pk.Retry tries again",
            run.thread_id, run.run_id, scrub_name(name), position, attempt, _describe(exc),
        )
    obs = _observing(run)
    if obs is None:
        return
    if obs.instruments is not None:
        obs.instruments.retries.add(1, {STEP: scrub_name(name)})
    c = _CALL.get()
    if c is not None and c.obs is obs:
        c.attempt = attempt + 1
    obs._event("persistkit.retry", {ATTEMPT: attempt, POSITION: position, **_exception_attrs(exc)})


def conflicted(run: Any, body: Mapping[str, Any], error: BaseException) -> None:
    """A checkpoint of ``run`` was refused: another writer moved the thread's head."""
    what = f"step {scrub_name(str(body.get('n')))!r} at {body.get('p')}" if body["k"] == "step" else "the run's end record"
    if log.isEnabledFor(logging.INFO):
        log.info(
            "persistkit: thread %r%s run %s: %s was not written, the thread's head moved (ConflictError)",
            run.thread_id, _ns(run.namespace), run.run_id, what,
        )
    obs = _observing(run)
    if obs is None:
        return
    c = _CALL.get()  # the refused record was this step call's own: its position is known
    if c is not None and body["k"] == "step" and c.owns(obs, str(body["p"]), str(body["n"])):
        c.position = str(body["p"])
    if obs.instruments is not None:
        obs.instruments.conflicts.add(1, {KIND: str(body["k"])})
    found = getattr(error, "found", None)
    obs._event("persistkit.conflict", {"persistkit.conflict.found_version": found if isinstance(found, int) else -1})


def limit_waited(name: str, seconds: float) -> None:
    """A draw from the rate limit ``name`` went ahead after ``seconds`` of waiting (persistkit/flow)."""
    instruments = _instruments()
    if instruments is not None:
        instruments.limit_waits.record(seconds, {LIMIT: name})


def limit_refused(name: str) -> None:
    """A draw from the rate limit ``name`` raised RateLimitedError (persistkit/flow)."""
    if log.isEnabledFor(logging.INFO):
        log.info("persistkit: rate limit %r had no capacity in time (RateLimitedError)", name)
    instruments = _instruments()
    if instruments is not None:
        instruments.rate_limited.add(1, {LIMIT: name})


def concurrency_waited(name: str, seconds: float) -> None:
    """A turn took a slot of the concurrency limit ``name`` after ``seconds`` (coordination/_concurrency)."""
    instruments = _instruments()
    if instruments is not None:
        instruments.slot_waits.record(seconds, {CONCURRENCY: name})


def concurrency_refused(name: str) -> None:
    """A turn raised ConcurrencyLimitError for the concurrency limit ``name``."""
    if log.isEnabledFor(logging.INFO):
        log.info("persistkit: concurrency limit %r had no free slot (ConcurrencyLimitError)", name)
    instruments = _instruments()
    if instruments is not None:
        instruments.slot_refused.add(1, {CONCURRENCY: name})


def _slot_measured(name: str, waited: float | None) -> None:
    if waited is None:
        concurrency_refused(name)
    else:
        concurrency_waited(name, waited)


_slots.on_wait = _slot_measured  # coordination/_concurrency tells us of each wait (it cannot import us)


# -- helpers ---------------------------------------------------------------------------------


def _observing(run: Any) -> Observer | None:
    """The run's telemetry observer, or None: ``run.observer``, or the one a wrapper in its
    place (the crash matrix's watch: ``testing/_crash_watch``) passes the calls on to."""
    obs = run.observer
    while obs is not None and not isinstance(obs, Observer):
        obs = getattr(obs, "inner", None)
    return obs


def _ns(namespace: str) -> str:
    return f" (namespace {namespace!r})" if namespace else ""


def _unrecorded(exc: BaseException | None) -> str:
    """The status of a step call that recorded nothing of its own."""
    if exc is None:
        return "completed"
    return "suspended" if isinstance(exc, Suspended) else "error"


def _describe(exc: BaseException | None) -> str:
    return "no exception" if exc is None else f"{_type_name(exc)}: {scrub_error(str(exc))}"


def _type_name(exc: BaseException) -> str:
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _exception_attrs(exc: BaseException | None) -> dict[str, str]:
    """The OpenTelemetry ``exception.*`` attributes of ``exc``, its text scrubbed of secrets."""
    if exc is None:
        return {}
    stack = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {
        "exception.type": _type_name(exc),
        "exception.message": scrub_error(str(exc)),
        "exception.stacktrace": scrub_error(stack),
    }


def _outcome(span: Any, exc: BaseException | None, *, failed: bool) -> None:
    """Span status ERROR, with the exception (scrubbed), for a failure; a suspension
    (``pk.Suspended``) is no error."""
    if exc is not None and _unrecorded(exc) == "suspended":
        return
    if exc is None and not failed:
        return
    from opentelemetry.trace import Status, StatusCode

    if exc is not None:
        span.add_event("exception", _exception_attrs(exc))
        span.set_status(Status(StatusCode.ERROR, f"{_type_name(exc)}: {scrub_error(str(exc))}"))
    else:
        span.set_status(Status(StatusCode.ERROR, "the run failed"))
