"""Compare LangGraph's SqliteSaver and PersistkitSaver when a process dies mid-run (not a test).

usage: python tests/adapters/langgraph_durability_compare.py [RUNS] [MODES] [KILLS]

For each saver, durability mode (default ``exit,async,sync``) and node the
process dies in (default ``abcd``), RUNS times (default 5): run
``langgraph_durability_graph.py`` until it SIGKILLs itself, run it again, and
count what the second process ran before the graph finished. Prints one line
per case: how often each re-run sequence happened, and whether every final
result was ``a b c d`` exactly. Needs ``langgraph-checkpoint-sqlite``.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def once(saver: str, mode: str, kill: str) -> tuple[str, bool]:
    with tempfile.TemporaryDirectory() as d:
        log, url = f"{d}/log", f"sqlite:///{d}/store.db"
        cmd = [sys.executable, str(HERE / "langgraph_durability_graph.py"), saver, url, "t", log, mode, kill]
        first = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert first.returncode == -9, first.stderr
        before = len(Path(log).read_text().split())
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        rerun = "".join(Path(log).read_text().split()[before:])
        out = json.loads(second.stdout) if second.stdout.strip() else {"error": second.stderr[-300:]}
        if "error" in out:
            return "error: " + out["error"][:80], False
        return rerun, out["items"] == list("abcd")


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    modes = sys.argv[2].split(",") if len(sys.argv) > 2 else ["exit", "async", "sync"]
    kills = sys.argv[3] if len(sys.argv) > 3 else "abcd"
    for mode in modes:
        for kill in kills:
            for saver in ("sqlite", "persistkit"):
                seen: collections.Counter[str] = collections.Counter()
                correct = 0
                for _ in range(runs):
                    rerun, ok = once(saver, mode, kill)
                    seen[rerun] += 1
                    correct += ok
                ran = sum(len(r) * n for r, n in seen.items() if not r.startswith("error"))
                print(f"{mode:5} kill={kill} {saver:10} re-ran {dict(seen)}  nodes re-run/run: {ran / runs:.1f}"
                      f"  result a b c d: {correct}/{runs}", flush=True)


if __name__ == "__main__":
    main()
