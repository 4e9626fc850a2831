"""The combination matrix's design and its feature entries (no store needed)."""

from __future__ import annotations

import itertools

import pytest

import persistkit as pk
from persistkit.testing.combination import Feature, design, register_feature, registered_features


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
