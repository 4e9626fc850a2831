"""OpenTelemetry's SDK as a test sees it: the in-memory span exporter and metric reader,
installed as the global providers for one test (the API reads module globals; monkeypatch
restores them). Imported by the telemetry tests after ``pytest.importorskip`` of the SDK:
``from otel_capture import Otel, no_otel, otel``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.metrics import _internal as metrics_internal
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

__all__ = ["Otel", "no_otel", "otel"]


@dataclass
class Otel:
    spans: InMemorySpanExporter
    reader: InMemoryMetricReader

    def finished(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if name is None or s.name == name]

    def steps(self) -> list[ReadableSpan]:
        return self.finished("persistkit.step")

    def run_span(self) -> ReadableSpan:
        (span,) = self.finished("persistkit.run")
        return span

    def points(self, metric: str) -> list[Any]:
        data = self.reader.get_metrics_data()
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

    def total(self, metric: str) -> int:
        return sum(p.value for p in self.points(metric))

    def count(self, metric: str) -> int:
        return sum(p.count for p in self.points(metric))

    def everything(self) -> str:
        """All exported spans and metrics as text (to look for what must not be there)."""
        data = self.reader.get_metrics_data()
        return "\n".join(s.to_json() for s in self.spans.get_finished_spans()) + (data.to_json() if data else "")


@pytest.fixture
def otel(monkeypatch: pytest.MonkeyPatch) -> Iterator[Otel]:
    # the CrewAI tests set OTEL_SDK_DISABLED for the whole session (CrewAI's own telemetry):
    # the SDK's providers made under it make no spans
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER", MeterProvider(metric_readers=[reader]))
    yield Otel(spans, reader)
    provider.shutdown()


@pytest.fixture
def no_otel(monkeypatch: pytest.MonkeyPatch) -> None:
    """No provider configured: the API's defaults (a proxy tracer and meter provider)."""
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER", None)
