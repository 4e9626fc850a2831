"""A concurrency limit's waits for a slot and its refusals as OpenTelemetry metrics (#40).

The SDK's in-memory reader is installed as the global meter provider for one test. The
metrics carry the limit's name, never its key (a tenant id)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest

pytest.importorskip("opentelemetry.sdk.metrics")


import persistkit as pk

pytest_plugins = ["otel_capture"]  # the otel fixture

if TYPE_CHECKING:
    from otel_capture import Otel


def test_slot_waits_and_refusals_are_metrics_by_limit_name(otel: Otel) -> None:
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
    [waits] = otel.points("persistkit.concurrency.wait.duration")
    assert dict(waits.attributes) == {"persistkit.concurrency.name": name} and waits.count == 2
    [refused] = otel.points("persistkit.concurrency.refused")
    assert dict(refused.attributes) == {"persistkit.concurrency.name": name} and refused.value == 1
    assert tenant not in repr(otel.reader.get_metrics_data())
