"""A shared rate limit's waits and refusals as OpenTelemetry metrics (docs/flow-control.md).

The SDK's in-memory reader is installed as the global meter provider for one test; the
limit's clock is a fake one, so the recorded waits are exact and no test reads the wall clock.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk.metrics")

from opentelemetry.metrics import _internal as metrics_internal
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import persistkit as pk
from persistkit.testing.limits_suite import FakeClock


def _points(reader: InMemoryMetricReader, metric: str) -> list[Any]:
    data = reader.get_metrics_data()
    if data is None:
        return []
    return [
        p
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == metric
        for p in m.data.data_points
    ]


def test_waits_and_refusals_are_metrics_by_limit_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    reader = InMemoryMetricReader()
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER", MeterProvider(metric_readers=[reader]))
    name = f"otel-{uuid.uuid4().hex[:8]}"
    with FakeClock().install(pk.connect(f"memory://{name}")) as store:
        store.limits.set(name, rate="2/s", burst=1)
        store.limits.acquire(name)  # no wait
        store.limits.acquire(name)  # half a second
        with pytest.raises(pk.RateLimitedError):
            store.limits.acquire(name, timeout=0.1)
    [waits] = _points(reader, "persistkit.limit.wait.duration")
    assert dict(waits.attributes) == {"persistkit.limit.name": name}
    assert waits.count == 2 and waits.sum == pytest.approx(0.5)
    [refused] = _points(reader, "persistkit.limit.rate_limited")
    assert dict(refused.attributes) == {"persistkit.limit.name": name} and refused.value == 1


def test_no_provider_records_nothing_and_draws_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER", None)
    name = f"otel-{uuid.uuid4().hex[:8]}"
    with FakeClock().install(pk.connect(f"memory://{name}")) as store:
        store.limits.set(name, rate="2/s", burst=1)
        assert store.limits.acquire(name).waited == 0
        assert store.limits.acquire(name).waited == pytest.approx(0.5)
