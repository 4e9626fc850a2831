"""The shipped concurrency-limit and debounce checks (persistkit.testing.concurrency_suite) on every store."""

from __future__ import annotations

from pathlib import Path

import plain_store  # noqa: F401 -- registers plainfile://
import pytest

import persistkit as pk
from persistkit.testing.concurrency_suite import ConcurrencyConformance, DebounceConformance


class TestConcurrency(ConcurrencyConformance):
    """``persistkit_url`` comes from conftest: one fresh store per backend."""


class TestDebounce(DebounceConformance):
    pass


def test_a_store_without_leases_says_so(tmp_path: Path) -> None:
    store = pk.connect(f"plainfile://{tmp_path}/plain.json")
    with (
        pytest.raises(pk.ConfigurationError, match="needs a store with leases"),
        pk.resume("t", store=store, concurrency=("tenant", "acme", 2)),
    ):
        pass
    with (
        pytest.raises(pk.ConfigurationError, match=r"'kv' capability|lease"),
        pk.resume("t", store=store, run_id="e1", busy="debounce", debounce=(0.1, 1.0), message="m"),
    ):
        pass
