"""store.prune(namespace=...) sweeps only what no namespace of the thread refers to.

Values are stored once per thread (content-addressed) and shared by its namespaces, so a
prune of one namespace must still see the references of the others before it sweeps."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import BACKENDS, make_url, uid

import persistkit as pk


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[pk.Store]:
    # isolated: store.prune reads the oldest record of every thread of the store (forks)
    with pk.connect(make_url(request.param, request, tmp_path_factory, isolated=True)) as store:
        if not store.backend.supports_prune:
            pytest.skip(f"depends on the prune capability of the {request.param} store (issue 23: not there yet)")
        yield store


def test_prune_of_one_namespace_keeps_the_values_of_the_others(store: pk.Store) -> None:
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


def test_a_later_prune_keeps_the_lists_an_earlier_one_rooted(store: pk.Store) -> None:
    """The first prune roots the kept checkpoint's list (its segments' rows go); a second prune
    that deletes nothing of that chain must still count the root as needed."""
    t = uid("ns")
    items = [str(j) * 3000 for j in range(3)]
    for i in range(3):
        store.update_state(t, {"l": items[: i + 1]}, namespace="a")
    assert store.prune(pk.Retention(keep_last=1), thread_id=t).lists_rooted == 1
    store.update_state(t, {"x": 1}, namespace="b")
    store.update_state(t, {"x": 2}, namespace="b")
    assert store.prune(pk.Retention(keep_last=1), thread_id=t).checkpoints == 1
    assert store.prune(pk.Retention(keep_last=1), thread_id=t, namespace="b").checkpoints == 0
    assert store.get_state(t, namespace="a") == {"l": items}
