"""The combination matrix's design and its feature entries (no store needed)."""

from __future__ import annotations

import itertools

import pytest

import persistkit as pk
from persistkit.testing.combination import (
    Feature,
    design,
    design_per_level,
    full_design,
    register_feature,
    registered_features,
)


@pytest.mark.parametrize("k", range(0, 16))
def test_design_covers_every_pair_both_ways_plus_all_and_none(k: int) -> None:
    names = [f"f{i}" for i in range(k)]
    combos = design(names)
    assert () in combos and (k == 0 or tuple(names) in combos)
    assert len(set(combos)) == len(combos)
    for a, b in itertools.combinations(names, 2):
        for want in itertools.product((False, True), repeat=2):
            assert any(((a in c), (b in c)) == want for c in combos), (a, b, want)
    assert len(combos) <= 9  # far below the power set: 2**k


@pytest.mark.parametrize("k", [0, 1, 2, 5, 11, 15])
@pytest.mark.parametrize("n_levels", [1, 2, 6])
def test_design_per_level_covers_pairs_and_each_feature_on_each_level(k: int, n_levels: int) -> None:
    names = [f"f{i}" for i in range(k)]
    levels = [f"store{j}" for j in range(n_levels)]
    per = design_per_level(names, levels)
    assert set(per) == set(levels)
    assert {c for rows in per.values() for c in rows} == set(design(names))  # every row runs somewhere
    for rows in per.values():
        for n in names:
            assert any(n in c for c in rows) and any(n not in c for c in rows), n
    assert design_per_level(names, levels) == per  # deterministic
    if k == 11 and n_levels == 6:
        assert sum(map(len, per.values())) <= 18 < n_levels * len(design(names))


def test_full_design_is_the_power_set() -> None:
    assert sorted(full_design(["a", "b"])) == [(), ("a",), ("a", "b"), ("b",)]
    assert len(set(full_design([f"f{i}" for i in range(6)]))) == 64


def test_the_built_in_features_are_registered_with_docs() -> None:
    features = registered_features()
    builtin = {"migration", "secret", "env_secret", "offload", "encryption", "integrity", "leases",
               "nested_migration", "result_migration"}
    assert builtin <= set(features)
    assert all(features[n].doc for n in builtin)


def test_bad_feature_entries_are_configuration_errors() -> None:
    with pytest.raises(pk.ConfigurationError, match="letters, digits"):
        Feature(name="has space", doc="x")
    with pytest.raises(pk.ConfigurationError, match="migrate="):
        Feature(name="bump", doc="x", bumps_state=True)
    with pytest.raises(pk.ConfigurationError, match=r"takes a persistkit\.testing\.combination\.Feature"):
        register_feature("migration")  # type: ignore[arg-type]
