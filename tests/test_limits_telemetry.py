"""A shared rate limit's waits and refusals as OpenTelemetry metrics (docs/flow-control.md).

The SDK's in-memory reader is installed as the global meter provider for one test; the
limit's clock is a fake one, so the recorded waits are exact and no test reads the wall clock.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest

pytest.importorskip("opentelemetry.sdk.metrics")

from opentelemetry.metrics import _internal as metrics_internal

import persistkit as pk
from persistkit.testing.limits_suite import FakeClock

pytest_plugins = ["otel_capture"]  # the otel fixture

if TYPE_CHECKING:
    from otel_capture import Otel


def test_waits_and_refusals_are_metrics_by_limit_name(otel: Otel) -> None:
    name = f"otel-{uuid.uuid4().hex[:8]}"
    with FakeClock().install(pk.connect(f"memory://{name}")) as store:
        store.limits.set(name, rate="2/s", burst=1)
        store.limits.acquire(name)  # no wait
        store.limits.acquire(name)  # half a second
        with pytest.raises(pk.RateLimitedError):
            store.limits.acquire(name, timeout=0.1)
    [waits] = otel.points("persistkit.limit.wait.duration")
    assert dict(waits.attributes) == {"persistkit.limit.name": name}
    assert waits.count == 2 and waits.sum == pytest.approx(0.5)
    [refused] = otel.points("persistkit.limit.rate_limited")
    assert dict(refused.attributes) == {"persistkit.limit.name": name} and refused.value == 1


def test_no_provider_records_nothing_and_draws_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER", None)
    name = f"otel-{uuid.uuid4().hex[:8]}"
    with FakeClock().install(pk.connect(f"memory://{name}")) as store:
        store.limits.set(name, rate="2/s", burst=1)
        assert store.limits.acquire(name).waited == 0
        assert store.limits.acquire(name).waited == pytest.approx(0.5)
