"""OpenTelemetry spans and metrics, and the ``persistkit`` logger (persistkit/ops/_telemetry.py).

Spans and metrics are read from the SDK's in-memory exporter and reader, installed as
the global providers for one test (the API reads module globals; monkeypatch restores
them). Nothing here measures time: the cost when off is bench/bench_telemetry.py's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from opentelemetry import trace
from opentelemetry.metrics import _internal as metrics_internal
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import persistkit as pk

pytest_plugins = ["otel_capture"]  # the otel and no_otel fixtures

if TYPE_CHECKING:
    from otel_capture import Otel

#: A key the secret scanner detects (an OpenAI-style project key): it must reach no span or log.
SECRET = "sk-proj-Zq81xLmN0pQrS2tUvW3xYz4AbC5dEf6GhI7"
#: A state value: state never goes to telemetry, secret or not.
STATE_VALUE = "state-value-7f3c1b"


@pytest.fixture
def store() -> Iterator[pk.Store]:
    s = pk.connect("memory://telemetry")
    yield s
    s.close()


@pk.checkpointed
def leaf(i: int) -> int:
    return i * 10


@pk.checkpointed
def parent(i: int) -> int:
    return leaf(i) + 1


@pk.checkpointed
def measure(text: str) -> int:
    return len(text)


class Crash(BaseException):
    """Stands for the process dying: the run stays unfinished."""


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


# -- spans -------------------------------------------------------------------------------------


def test_a_run_has_a_span_and_each_step_a_child_span(otel: Otel, store: pk.Store) -> None:
    with pk.resume("t-run", store=store, namespace="tenant-a") as run:
        run.state["note"] = STATE_VALUE
        assert parent(1) == 11
        assert leaf(2) == 20
    run_span = otel.run_span()
    ids = {"persistkit.thread_id": "t-run", "persistkit.run_id": run.run_id, "persistkit.namespace": "tenant-a"}
    assert ids.items() <= attrs(run_span).items()
    assert attrs(run_span)["persistkit.status"] == "completed"
    assert attrs(run_span)["persistkit.run.recorded_steps"] == 0
    assert [e.name for e in run_span.events] == ["persistkit.opened"]
    assert run_span.status.status_code is StatusCode.UNSET

    by_position = {attrs(s)["persistkit.step.position"]: s for s in otel.steps()}
    assert sorted(by_position) == ["0", "0/0", "1"]
    for pos, name in (("0", "parent"), ("0/0", "leaf"), ("1", "leaf")):
        a = attrs(by_position[pos])
        assert ids.items() <= a.items()
        assert (a["persistkit.step.name"], a["persistkit.step.replayed"], a["persistkit.status"]) == (name, False, "completed")
        assert a["persistkit.step.attempt"] == 1
        assert a["persistkit.checkpoint.bytes"] > 0
    # the child step's span is a child of its parent step's, which is a child of the run's
    assert by_position["0/0"].parent.span_id == by_position["0"].context.span_id
    assert by_position["0"].parent.span_id == run_span.context.span_id
    assert by_position["1"].parent.span_id == run_span.context.span_id
    steps_bytes = sum(attrs(s)["persistkit.checkpoint.bytes"] for s in otel.steps())
    assert attrs(run_span)["persistkit.checkpoint.bytes"] > steps_bytes  # and the end record

    # metrics: three step checkpoints and the end record, each sized and timed
    assert otel.count("persistkit.checkpoint.size") == 4
    assert otel.count("persistkit.checkpoint.write.duration") == 4
    assert otel.total("persistkit.step.replays") == 0
    assert STATE_VALUE not in otel.everything()


def test_a_resumed_run_marks_its_replayed_steps(
    otel: Otel, store: pk.Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="persistkit")
    with pytest.raises(Crash), pk.resume("t-crash", store=store) as first:
        leaf(1)
        leaf(2)
        raise Crash
    otel.spans.clear()
    with pk.resume("t-crash", store=store) as again:
        leaf(1)
        leaf(2)
        leaf(3)
    assert again.run_id == first.run_id
    run_span = otel.run_span()
    assert attrs(run_span)["persistkit.run.recorded_steps"] == 2
    seen = sorted(
        (attrs(s)["persistkit.step.position"], attrs(s)["persistkit.step.replayed"], "persistkit.checkpoint.bytes" in attrs(s))
        for s in otel.steps()
    )
    assert seen == [("0", True, False), ("1", True, False), ("2", False, True)]
    assert otel.total("persistkit.step.replays") == 2
    resumed = [r.getMessage() for r in caplog.records if "resumes" in r.getMessage()]
    assert len(resumed) == 1
    assert "'t-crash'" in resumed[0] and first.run_id in resumed[0] and "2 recorded step(s)" in resumed[0]


def test_the_first_run_of_the_crash_was_traced_as_unfinished(otel: Otel, store: pk.Store) -> None:
    with pytest.raises(Crash), pk.resume("t-crash2", store=store):
        leaf(1)
        raise Crash
    run_span = otel.run_span()
    assert attrs(run_span)["persistkit.status"] == "running"  # not ended: it resumes later
    assert run_span.status.status_code is StatusCode.ERROR


def test_a_failed_step_has_status_error_and_its_exception_scrubbed(
    otel: Otel, store: pk.Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="persistkit")

    @pk.checkpointed
    def call_model(api_key: str, prompt: str) -> str:
        raise ValueError(f"the model refused the key {api_key}")

    with pytest.raises(ValueError), pk.resume("t-fail", store=store) as run:
        run.state["note"] = STATE_VALUE
        call_model(SECRET, prompt=STATE_VALUE)
    (step,) = otel.steps()
    assert attrs(step)["persistkit.status"] == "failed"
    assert step.status.status_code is StatusCode.ERROR
    (exc_event,) = [e for e in step.events if e.name == "exception"]
    event = dict(exc_event.attributes or {})
    assert event["exception.type"] == "ValueError"
    assert "the model refused the key" in event["exception.message"]
    assert "$CRED" in event["exception.message"]  # the key's handle, not the key
    assert otel.run_span().status.status_code is StatusCode.ERROR
    assert attrs(otel.run_span())["persistkit.status"] == "failed"
    exported = otel.everything()
    assert SECRET not in exported and STATE_VALUE not in exported
    assert SECRET not in caplog.text and STATE_VALUE not in caplog.text


#: The planted secrets of issue #33: a bare AWS secret beside its key id (redacted in the
#: stored error by the pair rule), an OpenAI key and a Bearer token.
AWS_ID, AWS_SECRET = "AKIAQ3EGRSNV6XKZ4T2M", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzq9Lm3Tv8X"
OPENAI_KEY = "sk-proj-" + "Zq8vN3xT5kLm2Wp9Rb7Yc4Hd6Fg1Js0A"
BEARER = "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ0ZWxlbWV0cnkifQ.c2lnbmF0dXJlLWhlcmUtMTIzNDU2"


def test_telemetry_and_logs_carry_no_secret_the_store_would_redact(
    otel: Otel, store: pk.Store, caplog: pytest.LogCaptureFixture
) -> None:
    """The same planted secrets in an exception message and in a step's name: the stored
    error redacts them, and so must the spans (event, stack trace, status), the metrics and
    the DEBUG and INFO lines."""
    caplog.set_level(logging.DEBUG, logger="persistkit")
    planted = (AWS_SECRET, OPENAI_KEY, BEARER.partition(" ")[2])

    @pk.checkpointed(name=f"call-{OPENAI_KEY}")
    def call(n: int) -> int:
        raise RuntimeError(f"upstream refused {AWS_ID} {AWS_SECRET} with {BEARER} (key {OPENAI_KEY})")

    with pytest.raises(RuntimeError), pk.resume("t-planted", store=store, run_id="r"):
        call(1)
    stored = store.history("t-planted")[0]
    assert stored.error is not None
    for secret in planted:
        assert secret not in str(stored.error) and secret not in str(stored.step)
    exported = otel.everything()
    for secret in planted:
        assert secret not in exported, secret
        assert secret not in caplog.text, secret
    (step,) = otel.steps()
    assert attrs(step)["persistkit.step.name"].startswith("call-$CRED{")
    assert step.status.description is not None and "$CRED{" in step.status.description


def test_a_retried_step_reports_each_retry(
    otel: Otel, store: pk.Store, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="persistkit")
    monkeypatch.setattr("persistkit._retry._TESTING", True)
    calls = []

    @pk.checkpointed(retry=pk.Retry(attempts=5))
    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError(f"reset by peer ({SECRET})")
        return "ok"

    with pk.resume("t-retry", store=store):
        assert flaky() == "ok"
    (step,) = otel.steps()
    assert attrs(step)["persistkit.step.attempt"] == 3
    assert attrs(step)["persistkit.status"] == "completed"
    retries = [dict(e.attributes or {}) for e in step.events if e.name == "persistkit.retry"]
    assert [r["persistkit.step.attempt"] for r in retries] == [1, 2]
    assert all(r["exception.type"] == "ConnectionError" for r in retries)
    assert step.status.status_code is StatusCode.UNSET
    assert otel.total("persistkit.step.retries") == 2
    lines = [r.getMessage() for r in caplog.records if "tries again" in r.getMessage()]
    assert len(lines) == 2 and "attempt 1 failed (ConnectionError" in lines[0]
    assert SECRET not in otel.everything() and SECRET not in caplog.text


def test_a_conflict_is_an_event_a_count_and_a_log_line(
    otel: Otel, store: pk.Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="persistkit")
    with pytest.raises(pk.ConflictError), pk.resume("t-conflict", store=store, busy=None) as mine:
        leaf(1)
        with pk.resume("t-conflict", store=store, busy=None, run_id="other"):  # moves the head
            leaf(5)
        leaf(2)  # its checkpoint is refused
    assert otel.total("persistkit.conflicts") == 1
    refused = [s for s in otel.steps() if attrs(s)["persistkit.run_id"] == mine.run_id and attrs(s)["persistkit.step.name"] == "leaf"]
    last = max(refused, key=lambda s: s.start_time or 0)
    assert "persistkit.conflict" in [e.name for e in last.events]
    assert last.status.status_code is StatusCode.ERROR
    assert attrs(last)["persistkit.step.position"] == "1"  # the refused record's position
    assert any("head moved" in r.getMessage() and mine.run_id in r.getMessage() for r in caplog.records)


def test_a_suspension_is_an_event_and_no_error(otel: Otel, store: pk.Store) -> None:
    with pk.resume("t-ask", store=store) as run:
        leaf(1)
        pk.suspend({"question": "go on?"})
    assert run.status == "suspended"
    run_span = otel.run_span()
    assert attrs(run_span)["persistkit.status"] == "suspended"
    assert run_span.status.status_code is StatusCode.UNSET
    (event,) = [e for e in run_span.events if e.name == "persistkit.suspended"]
    assert dict(event.attributes or {})["persistkit.step.position"] == "1"
    assert otel.count("persistkit.checkpoint.size") == 2  # the step, the question

    store.answer("t-ask", "yes")
    otel.spans.clear()
    with pk.resume("t-ask", store=store):
        leaf(1)
        assert pk.suspend({"question": "go on?"}) == "yes"
    assert [attrs(s)["persistkit.step.replayed"] for s in otel.steps()] == [True]
    assert attrs(otel.run_span())["persistkit.status"] == "completed"


def test_a_suspension_inside_a_step(otel: Otel, store: pk.Store) -> None:
    @pk.checkpointed
    def ask() -> str:
        return str(pk.suspend("approve?"))

    with pk.resume("t-ask-step", store=store):
        ask()
    (step,) = otel.steps()
    assert attrs(step)["persistkit.status"] == "suspended"
    # the question's record (at 0/0) is not the step's, but tells the step's position
    assert attrs(step)["persistkit.step.position"] == "0"
    assert step.status.status_code is StatusCode.UNSET
    assert [e.name for e in step.events] == ["persistkit.suspended"]


def test_async_runs_and_concurrent_steps(otel: Otel, store: pk.Store) -> None:
    @pk.checkpointed
    async def fetch(i: int) -> int:
        await asyncio.sleep(0)
        return i

    @pk.checkpointed
    async def both() -> int:
        a, b = await asyncio.gather(fetch(1), fetch(2))
        return a + b

    async def main() -> None:
        async with pk.resume("t-async", store=store):
            assert await both() == 3

    asyncio.run(main())
    spans = {attrs(s)["persistkit.step.position"]: s for s in otel.steps()}
    assert sorted(spans) == ["0", "0/0", "0/1"]
    for child in ("0/0", "0/1"):
        assert spans[child].parent.span_id == spans["0"].context.span_id
        assert attrs(spans[child])["persistkit.checkpoint.bytes"] > 0
    assert spans["0"].parent.span_id == otel.run_span().context.span_id
    assert attrs(otel.run_span())["persistkit.status"] == "completed"

    otel.spans.clear()

    async def again() -> None:
        async with pk.resume("t-async", store=store, run_id="second"):
            await both()

    asyncio.run(again())
    assert {attrs(s)["persistkit.step.replayed"] for s in otel.steps()} == {False}


# -- off ---------------------------------------------------------------------------------------


def test_nothing_is_created_without_a_provider(no_otel: None, store: pk.Store, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="persistkit")
    with pk.resume("t-off", store=store) as run:
        assert run.observer is None
        leaf(1)
    assert run.observer is None


def test_a_no_op_provider_is_off(monkeypatch: pytest.MonkeyPatch, store: pk.Store) -> None:
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", trace.NoOpTracerProvider())
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER", metrics_internal.NoOpMeterProvider())
    with pk.resume("t-noop", store=store) as run:
        assert run.observer is None


def test_metrics_only(monkeypatch: pytest.MonkeyPatch, store: pk.Store) -> None:
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)  # see the otel fixture
    reader = InMemoryMetricReader()
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER", MeterProvider(metric_readers=[reader]))
    with pk.resume("t-metrics", store=store) as run:
        assert run.observer is not None
        leaf(1)
    from otel_capture import Otel  # the plugin's module (pytest_plugins above), imported by now

    assert Otel(InMemorySpanExporter(), reader).count("persistkit.checkpoint.size") == 2


# -- logging -----------------------------------------------------------------------------------


def test_debug_logs_each_step_and_never_a_value(no_otel: None, store: pk.Store, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="persistkit")
    with pytest.raises(Crash), pk.resume("t-log", store=store) as run:
        run.state["note"] = STATE_VALUE
        leaf(1)
        raise Crash
    assert run.observer is not None and run.observer.tracer is None  # DEBUG only: no spans
    with pk.resume("t-log", store=store):
        leaf(1)
        measure(STATE_VALUE)  # an argument: never logged
    steps = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG and " step " in r.getMessage()]
    assert len(steps) == 3
    assert "step 'leaf' at 0 ran: completed" in steps[0]
    assert "step 'leaf' at 0 replayed: completed" in steps[1]
    assert STATE_VALUE not in caplog.text


def test_info_does_not_log_steps(no_otel: None, store: pk.Store, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="persistkit")
    with pk.resume("t-info", store=store) as run:
        leaf(1)
    assert run.observer is None  # INFO alone costs the step path nothing
    assert not [r for r in caplog.records if r.name.startswith("persistkit")]


def test_off_nothing_of_telemetry_runs_per_step(no_otel: None, store: pk.Store) -> None:
    """The work, not the time: with telemetry off, the calls into ops/_telemetry do not
    grow with the number of steps (the decision is taken once, at the run's open)."""
    import sys

    from persistkit.ops import _telemetry

    def calls_for(steps: int) -> int:
        seen = 0

        def profile(frame: Any, event: str, arg: Any) -> None:
            nonlocal seen
            if event == "call" and frame.f_code.co_filename == _telemetry.__file__:
                seen += 1

        sys.setprofile(profile)
        try:
            with pk.resume(f"t-cost-{steps}", store=store):
                for i in range(steps):
                    leaf(i)
        finally:
            sys.setprofile(None)
        return seen

    few, many = calls_for(2), calls_for(40)
    assert few == many
    assert few > 0  # the once-per-run decision is seen: the profile hook works


def test_a_broken_provider_turns_telemetry_off_for_the_run(
    monkeypatch: pytest.MonkeyPatch, store: pk.Store, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(TracerProvider):
        def get_tracer(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"exporter misconfigured ({SECRET})")

    monkeypatch.setattr(trace, "_TRACER_PROVIDER", Broken())
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER", None)
    with pk.resume("t-broken", store=store) as run:
        assert run.observer is None
        leaf(1)
    assert run.status == "completed"
    assert "telemetry is off" in caplog.text and SECRET not in caplog.text


def test_async_retry_failure_and_sleep(
    otel: Otel, store: pk.Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="persistkit")
    monkeypatch.setattr("persistkit._retry._TESTING", True)
    calls = []

    @pk.checkpointed(retry=pk.Retry(attempts=3))
    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 2:
            raise TimeoutError("slow model")
        return "ok"

    @pk.checkpointed
    async def broken() -> None:
        raise KeyError(SECRET)

    async def main() -> None:
        async with pk.resume("t-async-more", store=store) as run:
            assert await flaky() == "ok"
            with pytest.raises(KeyError):
                await broken()
            await pk.asleep(3600)  # a durable timer: the run suspends
        assert run.status == "suspended"

    asyncio.run(main())
    spans = {attrs(s)["persistkit.step.name"].rpartition(".")[2]: s for s in otel.steps()}
    assert attrs(spans["flaky"])["persistkit.step.attempt"] == 2
    assert [e.name for e in spans["flaky"].events] == ["persistkit.retry"]
    assert spans["broken"].status.status_code is StatusCode.ERROR
    assert attrs(spans["broken"])["persistkit.status"] == "failed"
    run_span = otel.run_span()
    assert "persistkit.suspended" in [e.name for e in run_span.events]
    assert attrs(run_span)["persistkit.status"] == "suspended"
    assert otel.total("persistkit.step.retries") == 1
    assert any("tries again" in r.getMessage() for r in caplog.records)
    assert SECRET not in otel.everything() and SECRET not in caplog.text
