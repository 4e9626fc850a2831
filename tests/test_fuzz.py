"""Hardened decoding: corrupt stored records give a value or a PersistkitError, never anything else.

``fuzz_records.py`` is the target: it edits one stored row or blob of a genuine
store and runs every read path. Hypothesis drives it here with a bounded
budget; when atheris is installed (``python3 dev.py test`` installs it where a
wheel exists), a coverage-guided run with a bounded number of inputs follows.
The serializer alone is fuzzed in ``test_serde.py``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import fuzz_records
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

HERE = Path(__file__).parent


def test_every_record_survives_every_mutation_kind() -> None:
    """Each stored row and blob, each kind of mutation, at a few places: a systematic sweep."""
    for selector in range(len(fuzz_records._TARGETS)):
        for how in range(6):
            for where in (3, 333):
                fuzz_records.check(selector, how, where, b'"}\x00')


@given(
    st.integers(0, 10_000),
    st.integers(0, 255),
    st.integers(0, 65_535),
    st.binary(max_size=12),
)
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_mutations(selector: int, how: int, where: int, extra: bytes) -> None:
    fuzz_records.check(selector, how, where, extra)


def test_the_harness_can_fail() -> None:
    """A read path that raised anything but PersistkitError would fail the harness."""
    original = fuzz_records.exercise

    def broken(store: object, focus: str | None) -> None:
        raise KeyError("not a PersistkitError")

    fuzz_records.exercise = broken  # type: ignore[assignment]
    try:
        with pytest.raises(KeyError):
            fuzz_records.check(0, 0, 0, b"x")
    finally:
        fuzz_records.exercise = original


@pytest.mark.skipif(importlib.util.find_spec("atheris") is None, reason="atheris is not installed")
def test_atheris_bounded_run(tmp_path: Path) -> None:
    runs = os.environ.get("PERSISTKIT_FUZZ_RUNS", "1500")
    proc = subprocess.run(
        # a fixed seed: the same inputs on every run, so CI fails only when code changes
        [sys.executable, str(HERE / "fuzz_records.py"), f"-runs={runs}", "-seed=20261123", "-max_total_time=60",
         f"-artifact_prefix={tmp_path}/"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=HERE,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_out_of_range_creation_time_is_a_serialization_error() -> None:
    """Found by the random mutations: a stored time far outside datetime's range."""
    import persistkit as pk
    from persistkit.backends import CheckpointRow
    from persistkit.codec._pipeline import Codec
    from persistkit.state._records import Record

    codec = Codec()
    row = CheckpointRow("t", "", "0" * 24, None, None, codec.pack_tree({"k": "update", "t": 1e20, "ch": {}}))
    with pytest.raises(pk.SerializationError, match="out of range"):
        Record.decode(codec, row).public(codec)


def test_list_ref_without_its_tip_is_refused_on_decode() -> None:
    """Found by atheris: a list ref that lost its "l" key reached the loader (KeyError)."""
    import persistkit as pk
    from persistkit.backends import CheckpointRow
    from persistkit.codec._pipeline import Codec
    from persistkit.state._records import Record

    codec = Codec()
    for ref in ({"n": 1, "g": 1, "x": "0" * 24}, {"l": 3, "n": 1, "g": 1}, {"l": None, "n": -1, "g": 1}):
        body = {"k": "update", "t": 1.0, "ch": {"log": ref}}
        row = CheckpointRow("t", "", "0" * 24, None, None, codec.pack_tree(body))
        with pytest.raises(pk.SerializationError, match="malformed"):
            Record.decode(codec, row)


@pytest.mark.parametrize("kind", [[], {}, 1, None, "nope"])
def test_unhashable_or_unknown_kind_is_refused_on_decode(kind: object) -> None:
    """A stored kind that is a list or object raised TypeError (unhashable) instead of SerializationError."""
    import persistkit as pk
    from persistkit.backends import CheckpointRow
    from persistkit.codec._pipeline import Codec
    from persistkit.state._records import Record

    codec = Codec()
    row = CheckpointRow("t", "", "0" * 24, None, None, codec.pack_tree({"k": kind, "t": 1.0, "ch": {}}))
    with pytest.raises(pk.SerializationError, match="unknown kind"):
        Record.decode(codec, row)
