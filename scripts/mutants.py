#!/usr/bin/env python3
"""Plant defects persistkit really had (CHANGELOG.md) one at a time in a scratch copy, and see
which test tier catches each (docs/testing.md, "Planted defects").

    python3 dev.py mutants                 every defect, both tiers
    python3 dev.py mutants list            the defects and where each is planted
    python3 dev.py mutants M1 M3 --tier quick

Each defect is the fix reverted by hand in today's code (the code moved since the fix: the
revert restores the old behaviour, not the old text). The copy is a ``git worktree`` of
HEAD under /tmp/mutants-<id>-<pid> (the checkout is never touched, nor is uncommitted work
planted); the tests run from the copy with ``PYTHONPATH`` pointing there first, so they
and every child process they start import the planted code, not the checkout's.

Tiers:

* ``quick``: the whole quick tier (``PERSISTKIT_TIER=quick``, two workers, ``-x``): caught
  when any test fails.
* ``ci``: the test files of the CI suite that the fix added or named (``Mutant.ci_tests``),
  every service required, ``-x``. Running the whole CI suite per defect (12 x 30+ minutes)
  is what ``--tier ci-full`` does, for a night.

Prints a markdown table; ``--out FILE`` writes it too.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = ROOT / ".venv" / "bin" / "python"
REQUIRE = "postgres,redis,s3,dynamodb,rabbitmq,queues,chromium,mcp"


@dataclass(frozen=True)
class Mutant:
    id: str
    defect: str  # the CHANGELOG entry, in a line
    path: str  # the file planted
    fixed: str | tuple[str, ...]  # the text of the fix in today's code (each must occur exactly once)
    planted: str | tuple[str, ...]  # what replaces each: the defect again
    ci_tests: tuple[str, ...]  # the CI suite's tests that the fix added or names
    ci_k: str = ""  # a -k expression narrowing them (one store's cases)


MUTANTS = [
    Mutant(
        "M1",
        "a restore replaced a plain list the code had put in an untyped state: "
        "`run.state['notes'].append(step(i))` appended, after a crash, to a list no longer in the state",
        "persistkit/engine/_restore.py",
        ("                if type(live) is list:  # a plain list the code put there (e.g. by setdefault)\n"
         "                    live[:] = loader.list_items(name, ref)\n"
         "                    continue\n",
         "        elif type(live) is list and isinstance(value, list):\n            live[:] = value\n"),
        ("", ""),
        ("tests/test_engine.py", "tests/test_crash_matrix.py"),
    ),
    Mutant(
        "M2",
        "a recorded step failure the caller handled ran again after a crash right after it "
        "(recorded twice)",
        "persistkit/engine/_cursor.py",
        "        if not (body.get(\"ru\") or body.get(\"u\")):\n            return False\n",
        "",
        ("tests/test_handled_failure.py",),
    ),
    Mutant(
        "M3",
        "a resume that could not read a recorded result (opened without blobs=, a wrong key) "
        "wrote a failed end record, rolling the thread's state back",
        "persistkit/engine/_cursor.py",
        "            # so it writes nothing, as for a state that cannot be restored\n"
        "            self.load_error = error\n            raise\n",
        "            # so it writes nothing, as for a state that cannot be restored\n            raise\n",
        ("tests/test_unreadable_replay_writes_nothing.py",),
    ),
    Mutant(
        "M4",
        "a board watch on Redis ignored the URL's ?client_name= for its SUBSCRIBE connection",
        "persistkit/backends/_redis_kv.py",
        "    if not kwargs.get(\"client_name\"):\n        kwargs[\"client_name\"] = f\"persistkit:watch:{scope}\"\n",
        "    kwargs[\"client_name\"] = f\"persistkit:watch:{scope}\"\n",
        ("tests/test_redis_kv.py",),
    ),
    Mutant(
        "M5",
        "DynamoDB: a Query with an empty prefix sent begins_with(s, '') and failed with a "
        "ValidationException (store.leases(), persistkit leases without --prefix)",
        "persistkit/backends/_dynamo_items.py",
        "        if begins:  # \"\" (every key) is no condition: a key value may not be empty\n",
        "        if begins is not None:\n",
        ("tests/test_lease_conformance.py",),
        "dynamodb",
    ),
    Mutant(
        "M6",
        "text that looks like a secret handle (`$CRED{...}` typed by a user) in a tree this process "
        "committed was decoded as a stored handle, not given back as it was",
        "persistkit/codec/_pipeline.py",
        "        if live:\n            return self._verbatim().decode(tree, path=path, plain=plain)\n",
        "",
        ("tests/test_secret_lookalike.py",),
    ),
    Mutant(
        "M7",
        "DynamoDB: a step write whose request landed twice (botocore's retry after a lost "
        "response) lost to itself, a ConflictError on its own head",
        "persistkit/backends/dynamodb.py",
        "            if not _landed_before(exc, item, expected_version):\n"
        "                raise self._refused(row, expected_version, fence, exc, row_chunks) from exc\n",
        "            raise self._refused(row, expected_version, fence, exc, row_chunks) from exc\n",
        ("tests/test_dynamodb.py",),
        "lands_twice",
    ),
    Mutant(
        "M8",
        "a redelivered run (`pk.resume(thread, run_id=...)`) every checkpoint of which retention "
        "had pruned ran again in full (its steps' side effects twice): the resume no longer reads "
        "the prune's tombstone",
        "persistkit/engine/_cursor.py",
        "                pruned = yield from run_pruned(self.codec, t, ns, run_id)\n"
        "                if pruned is not None:\n                    raise pruned_error(t, run_id, pruned)\n",
        "                pass\n",
        ("tests/test_retention_conformance.py",),
        "redelivered_pruned_run",
    ),
    Mutant(
        "M9",
        "migrations did not apply to a replayed step's state: a version-1 run that crashed, "
        "resumed by version-2 code, restored its steps' states unmigrated",
        "persistkit/engine/_restore.py",
        "        if spec.cls is not None and schema != spec.schema:\n            fresh = spec.build(",
        "        if False:  # planted: a replayed step's state is not migrated\n            fresh = spec.build(",
        ("tests/test_migrations_resume.py",),
        "crashed_v1_run_resumed_by_v2_code",
    ),
    Mutant(
        "M10",
        "a `NonDeterminismError` (a deploy that changed the step order) wrote a failed end record: "
        "a suspended run lost its question and the thread's next turn ran on top",
        "persistkit/engine/_commit.py",
        "            or isinstance(exc, NonDeterminismError | RetryableError)\n",
        "            or isinstance(exc, RetryableError)\n",
        ("tests/test_suspend.py",),
        "cannot_replay_a_suspended_run",
    ),
    Mutant(
        "M11",
        "`store.update_state` on a thread whose run waits (suspended, answered, rolling back) "
        "wrote the edit as the head: the question, answer or rollback was lost",
        "persistkit/engine/_store_plans.py",
        "    if waiting is None or rec.kind != \"step\":\n        return\n",
        "    return  # planted: an edit on top of a waiting run is written\n",
        ("tests/test_suspend.py",),
        "update_state_refuses_a_waiting_run",
    ),
    Mutant(
        "M12",
        "`pk.ThreadLease.fenced()` before `acquire()` (or after `release()`) wrote unfenced, "
        "no error: a write meant to be fenced by the thread's lease carried no token",
        "persistkit/coordination/_thread_lease.py",
        "        self._needs(\"fenced()\")\n",
        "",
        ("tests/test_thread_lease.py",),
        "misuse",
    ),
]


def plant(m: Mutant) -> Path:
    """A worktree of HEAD with ``m`` planted; fails if the fix's text is not there once."""
    where = Path(f"/tmp/mutants-{m.id}-{os.getpid()}")  # two runs at once do not share one
    if where.exists():
        subprocess.run(["git", "worktree", "remove", "--force", str(where)], cwd=ROOT, check=False)
        shutil.rmtree(where, ignore_errors=True)
    subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(where), "HEAD"], cwd=ROOT, check=True)
    target = where / m.path
    text = target.read_text()
    fixed = (m.fixed,) if isinstance(m.fixed, str) else m.fixed
    planted = (m.planted,) if isinstance(m.planted, str) else m.planted
    for old, new in zip(fixed, planted, strict=True):
        if text.count(old) != 1:
            remove(where)
            raise SystemExit(f"{m.id}: the fix's text occurs {text.count(old)} times in {m.path}, not once: "
                             "the code moved; update MUTANTS")
        text = text.replace(old, new)
    target.write_text(text)
    return where


def remove(where: Path) -> None:
    subprocess.run(["git", "worktree", "remove", "--force", str(where)], cwd=ROOT, check=False)


def run_tier(where: Path, m: Mutant, tier: str, deselect: tuple[str, ...] = ()) -> tuple[str, float, str]:
    """("caught" / "missed" / "error", seconds, the first failure's line); ``deselect``: test ids
    left out of the quick tier (tests that fail on HEAD without any defect: with ``-x`` they
    would be a false "caught")."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(where), str(where / "adapters")])}
    env.pop("PERSISTKIT_TIER", None)
    args = [str(PY), "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=-ra --strict-markers"]
    if tier == "quick":
        env["PERSISTKIT_TIER"] = "quick"
        args += ["-n", "2"] + [f"--deselect={test}" for test in deselect]
    elif tier == "ci":
        env["PERSISTKIT_REQUIRE"] = REQUIRE
        args += list(m.ci_tests) + (["-k", m.ci_k] if m.ci_k else [])
    else:  # ci-full
        env["PERSISTKIT_REQUIRE"] = REQUIRE
        args += ["-n", "3"]
    start = time.monotonic()
    proc = subprocess.run(args, cwd=where, env=env, capture_output=True, text=True, check=False)
    took = time.monotonic() - start
    first = next((ln for ln in proc.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))), "")
    if proc.returncode == 1 or (proc.returncode == 2 and first.startswith("FAILED")):  # xdist's -x exits 2
        return "caught", took, first
    if proc.returncode == 0:
        return "missed", took, ""
    return "error", took, (first or proc.stdout[-500:] + proc.stderr[-500:]).strip()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ids", nargs="*", help="mutant ids (M1...), or 'list'")
    parser.add_argument("--tier", choices=["quick", "ci", "ci-full", "both"], default="both")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--deselect", action="append", default=[], metavar="TEST_ID",
                        help="leave a test that fails on HEAD out of the quick tier (repeatable)")
    opts = parser.parse_args(argv)
    if opts.ids == ["list"]:
        for m in MUTANTS:
            print(f"{m.id}  {m.path}\n    {m.defect}\n    CI tests: {', '.join(m.ci_tests)}")
        return 0
    chosen = [m for m in MUTANTS if not opts.ids or m.id in opts.ids]
    tiers = ["quick", "ci"] if opts.tier == "both" else [opts.tier]
    rows = ["| id | defect | planted in | " + " | ".join(tiers) + " |",
            "|---|---|---|" + "---|" * len(tiers)]
    for m in chosen:
        where = plant(m)
        cells = []
        try:
            for tier in tiers:
                verdict, took, first = run_tier(where, m, tier, tuple(opts.deselect))
                print(f"{m.id} {tier}: {verdict} in {took:.0f} s {first}", flush=True)
                cells.append(f"{verdict} ({took:.0f} s)")
        finally:
            remove(where)
        rows.append(f"| {m.id} | {m.defect} | `{m.path}` | " + " | ".join(cells) + " |")
    table = "\n".join(rows)
    print(table)
    if opts.out:
        opts.out.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
