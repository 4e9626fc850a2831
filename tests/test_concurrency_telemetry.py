"""A concurrency limit's waits for a slot and its refusals as OpenTelemetry metrics (#40).

The SDK's in-memory reader is installed as the global meter provider for one test. The
metrics carry the limit's name, never its key (a tenant id)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk.metrics")

from opentelemetry.metrics import _internal as metrics_internal
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import persistkit as pk


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


def test_slot_waits_and_refusals_are_metrics_by_limit_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    reader = InMemoryMetricReader()
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER", MeterProvider(metric_readers=[reader]))
    name, tenant = f"tenant-{uuid.uuid4().hex[:6]}", "acme-secret-id"
    store = pk.connect(f"memory://{name}")
    with (
        pk.resume("a", store=store, concurrency=(name, tenant, 1)),
        pytest.raises(pk.ConcurrencyLimitError),
        pk.resume("b", store=store, busy="reject", concurrency=(name, tenant, 1)),
    ):
        pass
    with pk.resume("c", store=store, concurrency=(name, tenant, 1)):
        pass
    [waits] = _points(reader, "persistkit.concurrency.wait.duration")
    assert dict(waits.attributes) == {"persistkit.concurrency.name": name} and waits.count == 2
    [refused] = _points(reader, "persistkit.concurrency.refused")
    assert dict(refused.attributes) == {"persistkit.concurrency.name": name} and refused.value == 1
    assert tenant not in repr(reader.get_metrics_data())
