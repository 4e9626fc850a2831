"""store.prune(namespace=...) sweeps only what no namespace of the thread refers to.

Values are stored once per thread (content-addressed) and shared by its namespaces, so a
prune of one namespace must still see the references of the others before it sweeps."""

from __future__ import annotations

import pytest
from conftest import make_url, uid

import persistkit as pk


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_prune_of_one_namespace_keeps_the_values_of_the_others(
    kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with pk.connect(make_url(kind, request, tmp_path_factory)) as store:
        t = uid("ns")
        big = "x" * 5000  # stored as a value (blob), not inline
        store.update_state(t, {"v": big, "w": "old " * 2000}, namespace="a")
        store.update_state(t, {"v": "y"}, namespace="a")
        store.update_state(t, {"v": big, "w": "old " * 2000}, namespace="b")
        report = store.prune(pk.Retention(keep_last=1), thread_id=t, namespace="a")
        assert report.checkpoints == 1
        assert store.get_state(t, namespace="b") == {"v": big, "w": "old " * 2000}
        assert store.get_state(t, namespace="a") == {"v": "y", "w": "old " * 2000}
        assert len(store.history(t, namespace="b")) == 1
