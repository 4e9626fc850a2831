"""The combination matrix's driver, run as its own process by the suite.

    python -m persistkit.testing._combination_agent PLAN_JSON
    python -m persistkit.testing._combination_agent --serve MODULES_JSON   (see ``serve``)

PLAN_JSON: ``{"modules": [...], "cases": [Case as JSON, ...], "inline": bool,
"parallel": int, "timeout": seconds}``. The driver imports persistkit, the
store's driver and the feature modules once, then runs the phases in order
(``write`` for every case, then ``resume``, then ``check``), each job in a
forked child (a new process that never ran the case before) with up to
``parallel`` children at once; or, with ``inline``, every job in this process.
It prints one JSON object: ``{case id: {phase: status}}``, status ``ok``,
``killed`` (SIGKILL: the planned crash), ``crashed`` (inline's planned crash),
``error`` (the traceback is in the case's ``<phase>.error``), ``exit N`` or
``timeout``. Without ``os.fork`` each job is a ``sys.executable`` process
(``--job CASE_JSON PHASE``).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from persistkit.testing.combination import Case, case_to_json, registered_features, run_job

PHASES = ("write", "resume", "check")


def _wants(case: Case, phase: str) -> bool:
    return phase != "check" or case.crash_at is not None  # the reference needs no check job


def _status(code: int) -> str:
    if os.WIFSIGNALED(code):
        return "killed" if os.WTERMSIG(code) == signal.SIGKILL else f"signal {os.WTERMSIG(code)}"
    rc = os.WEXITSTATUS(code)
    return "ok" if rc == 0 else ("error" if rc == 3 else f"exit {rc}")


def _fork(case: Case, phase: str) -> int:
    pid = os.fork()
    if pid == 0:  # the child: one job, then out without running the parent's atexit hooks
        code = 1
        try:
            status = run_job(case, phase)
            code = 0 if status == "ok" else 3
        finally:
            sys.stdout.flush()
            os._exit(code)
    return pid


def _spawn(case: Case, phase: str) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", __spec__.name if __spec__ else "persistkit.testing._combination_agent"]
    return subprocess.Popen([*args, "--job", json.dumps(case_to_json(case)), phase])


def _pool(jobs: list[tuple[Case, str]], parallel: int, timeout: float) -> dict[tuple[str, str], str]:
    """Run jobs in child processes, ``parallel`` at a time."""
    out: dict[tuple[str, str], str] = {}
    running: dict[Any, tuple[Case, str, float]] = {}
    pending = list(jobs)
    while pending or running:
        while pending and len(running) < parallel:
            case, phase = pending.pop(0)
            child: Any = _fork(case, phase) if hasattr(os, "fork") else _spawn(case, phase)
            running[child] = (case, phase, time.monotonic() + timeout)
        done = False
        for child, (case, phase, deadline) in list(running.items()):
            if isinstance(child, int):
                pid, code = os.waitpid(child, os.WNOHANG)
                status = _status(code) if pid else None
            else:
                rc = child.poll()
                status = None if rc is None else ("ok" if rc == 0 else "killed" if rc == -9 else "error")
            if status is None and time.monotonic() > deadline:
                if isinstance(child, int):
                    os.kill(child, signal.SIGKILL)
                    os.waitpid(child, 0)
                else:
                    child.kill()
                    child.wait()
                status = "timeout"
            if status is not None:
                out[(case.id, phase)] = status
                del running[child]
                done = True
        if not done:
            time.sleep(0.005)
    return out


def run_plan(plan: dict[str, Any], log: Any = sys.stderr) -> dict[str, dict[str, str]]:
    """Every job of ``plan``, phase by phase: ``{case id: {phase: status}}``."""
    for module in plan.get("modules", []):
        importlib.import_module(module)
    registered_features()
    cases = [Case.from_json(c) for c in plan["cases"]]
    if cases and not plan.get("inline"):
        # Import the store's driver (psycopg, redis, boto3) once, before forking.
        from persistkit.backends import open_backend

        open_backend(cases[0].url).close()
    results: dict[str, dict[str, str]] = {c.id: {} for c in cases}
    for phase in PHASES:
        started = time.monotonic()
        jobs = [
            (c, phase)
            for c in cases
            if _wants(c, phase) and all(s in ("ok", "killed", "crashed") for s in results[c.id].values())
        ]
        if plan.get("inline"):
            for case, ph in jobs:
                results[case.id][ph] = run_job(case, ph)
        else:
            done = _pool(jobs, int(plan.get("parallel", 4)), float(plan.get("timeout", 180)))
            for (cid, ph), status in done.items():
                results[cid][ph] = status
        # shown when the suite fails; the timings help keep the matrix in its CI budget
        print(f"matrix {phase}: {len(jobs)} jobs in {time.monotonic() - started:.1f} s", file=log, flush=True)
    return results


def serve(modules: list[str]) -> int:
    """A fork server: import everything once, then run each plan named on stdin (a JSON line
    ``{"plan": PATH, "env": {...}}``) in a forked
    child (a store that lives in one process, memory://, lives in that child), answering
    ``done PATH`` on stdout when ``PATH.out`` (results) and ``PATH.log`` (timings) are written.
    The suite starts one per test class, so the frameworks are imported once, not per store."""
    for module in modules:
        importlib.import_module(module)
    registered_features()
    for driver in ("psycopg", "redis", "boto3", "botocore.session"):
        with contextlib.suppress(ImportError):  # the stores' drivers, imported before forking
            importlib.import_module(driver)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        path = request["plan"]
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                # The test's environment now (fixtures set some after the server started,
                # e.g. S3 credentials); through the pipe, never written to a file.
                os.environ.clear()
                os.environ.update(request["env"])
                with open(path) as f, open(path + ".log", "w") as log:
                    # What the frameworks print goes to the log: stdout is the server's protocol.
                    sys.stdout.flush()
                    os.dup2(log.fileno(), 1)
                    results = run_plan(json.load(f), log)
                with open(path + ".out", "w") as out:
                    json.dump(results, out)
                code = 0
            except BaseException:
                import traceback

                with open(path + ".log", "a") as log:
                    log.write(traceback.format_exc())
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(f"done {path} {status}", flush=True)
    return 0


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "--job":
        case = Case.from_json(json.loads(argv[1]))
        return {"ok": 0, "crashed": 0}.get(run_job(case, argv[2]), 3)
    if len(argv) >= 2 and argv[0] == "--serve":
        return serve(json.loads(argv[1]))
    with open(argv[0]) as f:
        plan = json.load(f)
    print(json.dumps(run_plan(plan)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
