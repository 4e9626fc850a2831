"""The combination matrix as a conformance suite: features x crash position x new process.

Subclass :class:`CombinationConformance` and provide a ``persistkit_url``
fixture (a fresh, isolated store), as for ``StoreConformance``::

    from persistkit.testing import CombinationConformance

    class TestMyStoreInCombination(CombinationConformance):
        @pytest.fixture
        def persistkit_url(self):
            return "mystore://localhost/test"

Every combination of ``combination.design()`` over the features is crashed at
every step position (in flight and just committed) by a version-1 process and
resumed by version-2 code in a new process, then checked in a third (see
``persistkit.testing.combination``). Optional fixtures: ``persistkit_blob_url``
(the second store for offloaded values; default a SQLite file, or ``memory://``
for a ``memory://`` store) and ``persistkit_crosses_processes`` (default: every
store but ``memory://``; a store that does not cross processes runs every job
inline, crashing by an exception). Class attributes choose the features
(``combination_features``), modules that register more of them
(``combination_modules``), the agent's length (``combination_steps``) and the
number of jobs run at once (``combination_parallel``). ``combination_url(url, combo)``
may give each combination its own store (default: all share ``persistkit_url``), for a
store whose cost grows with what it holds.

``PERSISTKIT_MATRIX_ONLY=c2,c5`` (combination ids, as a failure report names
them) runs only those combinations, to reproduce one failure quickly.

Which combinations run on a store is ``combination_design(names, url)``: ``design(names)``
(every pair of features both ways), unless a subclass parametrized over several stores
spreads them (``design_per_level``: every pair somewhere, every feature on and off on each
store). ``PERSISTKIT_MATRIX=every-store`` runs ``design(names)`` on every store whatever the
subclass says; ``PERSISTKIT_MATRIX=full`` runs every combination (the power set, 2**k: a
nightly-style run, hours).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from . import combination_features  # noqa: F401 - registers the built-in features
from .combination import Case, case_to_json, design, full_design, registered_features

__all__ = ["CombinationConformance"]


def _cases(
    url: str,
    blob_url: str,
    root: Path,
    combos: list[tuple[str, ...]],
    steps: int,
    inline: bool,
    combo_url: Callable[[str, str], str] = lambda url, combo: url,
) -> list[Case]:
    tag = uuid.uuid4().hex[:10]
    only = {c.strip() for c in os.environ.get("PERSISTKIT_MATRIX_ONLY", "").split(",") if c.strip()}
    cases = []
    for n, combo in enumerate(combos):
        cid = f"c{n}"
        if only and cid not in only:
            continue
        shapes: list[tuple[int | None, str | None]] = [(None, None)]
        shapes += [(k, when) for k in range(steps) for when in ("in", "after")]
        for k, when in shapes:
            case_id = f"{cid}-ref" if k is None else f"{cid}-{when}-{k}"
            d = root / case_id
            d.mkdir(parents=True)
            cases.append(
                Case(
                    id=case_id,
                    combo=cid,
                    features=combo,
                    thread=f"pk-matrix-{tag}-{case_id}",
                    dir=str(d),
                    url=combo_url(url, cid),
                    blob_url=blob_url,
                    steps=steps,
                    crash_at=k,
                    when=when,
                    inline=inline,
                    reference=None if k is None else f"{cid}-ref",
                )
            )
    return cases


def _read(case: Case, name: str) -> Any:
    p = case.path(name)
    return json.loads(p.read_text()) if p.exists() else None


def _judge(case: Case, status: dict[str, str], ref: Case | None) -> list[str]:
    """What is wrong with one crash case (empty: it kept the replay contract)."""
    problems: list[str] = []
    crash_status = "crashed" if case.inline else "killed"
    for phase, want in (("write", crash_status), ("resume", "ok"), ("check", "ok")):
        got = status.get(phase)
        if got != want:
            err = case.path(f"{phase}.error")
            detail = f":\n{err.read_text()}" if err.exists() else ""
            problems.append(f"{phase} job: {got or 'not run'} (expected {want}){detail}")
            return problems
    effects = Counter(int(x) for x in case.path("effects.log").read_text().split())
    assert case.crash_at is not None
    want_effects = {i: 1 for i in range(case.steps + 1)}  # + the later run's step
    if case.when == "in":
        want_effects[case.crash_at] = 2  # in flight at the crash: run again, and only once more
    if dict(effects) != want_effects:
        problems.append(f"side effects per step {dict(sorted(effects.items()))}, expected {want_effects}")
    resumed = _read(case, "resume.json")
    if ref is not None:
        ref_write, ref_read = _read(ref, "write.json"), _read(ref, "resume.json")
        if ref_write is None or ref_read is None:
            problems.append(f"the reference {ref.id} did not finish: {ref.dir}")
        else:
            if resumed["outputs"] != ref_write["outputs"]:
                problems.append(f"the run returned {resumed['outputs']}, the crash-free run {ref_write['outputs']}")
            if resumed["state"] != ref_read["state"]:
                problems.append(f"final state {resumed['state']}\n  differs from the crash-free run's {ref_read['state']}")
    problems += (_read(case, "check.json") or {}).get("problems", [])
    return problems


class _Server:
    """The fork server of ``_combination_agent`` (one per test class: frameworks imported once)."""

    def __init__(self, modules: list[str], log: Path) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        cmd = [sys.executable, "-m", "persistkit.testing._combination_agent", "--serve", json.dumps(modules)]
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, env=env
        )

    def run(self, plan_path: Path) -> tuple[dict[str, dict[str, str]] | None, str]:
        """The plan's results (None if its process failed) and its log."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"plan": str(plan_path), "env": dict(os.environ)}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        log_path, out_path = Path(f"{plan_path}.log"), Path(f"{plan_path}.out")
        log = log_path.read_text() if log_path.exists() else ""
        if not line.startswith("done ") or not out_path.exists():
            return None, log + f"\n(server answered {line!r}, exit {self.proc.poll()})"
        results: dict[str, dict[str, str]] = json.loads(out_path.read_text())
        return results, log

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


class CombinationConformance:
    """Features in combination, crashed at every position, resumed in a new process.

    Needs a ``persistkit_url`` fixture.
    """

    #: Feature names (None: every registered feature whose ``requires`` are importable).
    combination_features: ClassVar[tuple[str, ...] | None] = None
    #: Modules that register more features (imported here and in the agent processes).
    combination_modules: ClassVar[tuple[str, ...]] = ()
    combination_steps: ClassVar[int] = 3
    combination_parallel: ClassVar[int] = 4

    @pytest.fixture
    def persistkit_crosses_processes(self, persistkit_url: str) -> bool:
        return not persistkit_url.startswith("memory:")

    @pytest.fixture
    def persistkit_blob_url(self, persistkit_url: str, tmp_path: Path, persistkit_crosses_processes: bool) -> str:
        if not persistkit_crosses_processes:
            return f"memory://matrix-blobs-{uuid.uuid4().hex[:10]}"
        return f"sqlite:///{tmp_path}/matrix-blobs.db"

    @pytest.fixture(scope="class")
    @classmethod
    def _combination_server(cls, tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Server | None]:
        if not hasattr(os, "fork"):
            yield None  # each plan in its own interpreter instead
            return
        server = _Server(list(cls.combination_modules), tmp_path_factory.mktemp("matrix") / "server.log")
        yield server
        server.close()

    def combination_url(self, url: str, combo: str) -> str:
        """The store URL of combination ``combo`` (``"c0"``, ``"c1"``...): ``url`` itself,
        unless a subclass gives each combination its own store."""
        return url

    def combination_design(self, names: list[str], url: str) -> list[tuple[str, ...]]:
        """The combinations run on ``url`` (default ``design(names)``); see the module docstring."""
        return design(names)

    def _combinations(self, url: str) -> list[tuple[str, ...]]:
        names = self.combination_names()
        mode = os.environ.get("PERSISTKIT_MATRIX", "")
        if mode == "full":
            return full_design(names)
        if mode == "every-store":
            return design(names)
        if mode:
            raise AssertionError(f"PERSISTKIT_MATRIX={mode!r}: expected 'every-store', 'full' or nothing")
        return self.combination_design(names, url)

    def combination_names(self) -> list[str]:
        import importlib
        import importlib.util

        for module in self.combination_modules:
            importlib.import_module(module)
        features = registered_features()
        names = list(self.combination_features) if self.combination_features is not None else list(features)
        unknown = [n for n in names if n not in features]
        if unknown:
            raise AssertionError(f"combination_features names unknown features {unknown}; known: {sorted(features)}")
        missing = {n: m for n in names for m in features[n].requires if importlib.util.find_spec(m) is None}
        if missing and self.combination_features is not None:
            pytest.fail(f"features {sorted(missing)} need modules that are not installed: {missing}")
        return [n for n in names if n not in missing]

    def test_features_in_combination_survive_a_crash_at_every_position(
        self,
        persistkit_url: str,
        persistkit_blob_url: str,
        persistkit_crosses_processes: bool,
        tmp_path: Path,
        _combination_server: _Server | None,
    ) -> None:
        combos = self._combinations(persistkit_url)
        cases = _cases(
            persistkit_url, persistkit_blob_url, tmp_path / "matrix", combos, self.combination_steps,
            inline=not persistkit_crosses_processes, combo_url=self.combination_url,
        )
        plan = {
            "modules": list(self.combination_modules),
            "cases": [case_to_json(c) for c in cases],
            "inline": not persistkit_crosses_processes,
            "parallel": self.combination_parallel,
        }
        plan_path = tmp_path / "plan.json"
        plan_path.write_text(json.dumps(plan))
        if _combination_server is not None:
            found, log = _combination_server.run(plan_path)
        else:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
            cmd = [sys.executable, "-m", "persistkit.testing._combination_agent", str(plan_path)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
            found = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
            log = proc.stderr
        print(log)  # the phases' timings (shown by pytest -s or on failure)
        assert found is not None, f"the matrix driver failed:\n{log[-4000:]}"
        statuses = found
        by_id = {c.id: c for c in cases}
        failures: list[str] = []
        for case in cases:
            if case.crash_at is None:
                st = statuses[case.id]
                if st.get("write") != "ok" or st.get("resume") != "ok":
                    errs = [case.path(f"{p}.error") for p in ("write", "resume")]
                    detail = "".join(e.read_text() for e in errs if e.exists())
                    failures.append(f"{case.id} [{'+'.join(case.features) or 'base'}] reference: {st}\n{detail}")
                continue
            problems = _judge(case, statuses[case.id], by_id.get(case.reference or ""))
            if problems:
                failures.append(
                    f"{case.id} [{'+'.join(case.features) or 'base'}] crash {case.when} step {case.crash_at}, "
                    f"thread {case.thread}:\n  " + "\n  ".join(problems)
                )
        if failures:
            legend = "\n".join(f"  c{n} = {'+'.join(c) or 'base'}" for n, c in enumerate(combos))
            pytest.fail(
                f"{len(failures)} of {len(cases)} matrix cases broke the replay contract on {persistkit_url}\n"
                f"combinations:\n{legend}\n(rerun some with PERSISTKIT_MATRIX_ONLY=c<n>; evidence under {tmp_path})\n\n"
                + "\n\n".join(failures[:40]),
                pytrace=False,
            )
