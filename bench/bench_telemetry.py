"""What telemetry costs per step: off (no provider), against the code before the hook, and on.

    python3 dev.py bench telemetry [--steps 2000] [--rounds 5] [--stores memory,sqlite] [--before REV]
    .venv/bin/python bench/bench_telemetry.py [same options]   (a venv with pip install -e '.[bench]')

One block runs ``--steps`` steps (each returns its argument and appends ~100 bytes to a
list in the state): "ran" is the CPU time per step of that block, "replayed" of the same
block resumed with its ``run_id`` (every step replays). CPU time of the process, not wall
time: on a machine shared with other work it is the steadier of the two, and what the
hook adds is CPU work. Each variant runs in its own process, the variants interleaved
round by round (median of ``--rounds``, each round the best of 3 blocks):

* before the hook: the package as it was before telemetry (``--before``, default the
  parent of the commit that added ``run.observer``), exported from git to a temporary
  directory: the baseline every ratio is against;
* telemetry off: this checkout, no tracer or meter provider (``run.observer`` is None:
  the step path tests one attribute where a step is called and where it commits);
* spans: the OpenTelemetry SDK's ``TracerProvider`` with a no-op exporter behind a
  ``SimpleSpanProcessor`` (every span ended and exported inline: the upper bound);
* spans and metrics: also a ``MeterProvider`` with an ``InMemoryMetricReader``;
* DEBUG lines: the ``persistkit`` logger at DEBUG to a handler that formats and drops.

The target when off: 1.00x of the baseline within the noise of the machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import _env  # noqa: F401 -- first: a missing package says how to run this script

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
VARIANTS = {
    "before": "before the hook",
    "off": "telemetry off",
    "spans": "on: spans (SDK, no-op exporter)",
    "metrics": "on: spans and metrics",
    "debug": "on: DEBUG log lines",
}


# -- the worker: one variant, one process -----------------------------------------------------


def _configure(variant: str) -> None:
    if variant in ("spans", "metrics"):
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            SimpleSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )

        class Drop(SpanExporter):
            def export(self, spans: object) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(Drop()))
        trace.set_tracer_provider(provider)
    if variant == "metrics":
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    if variant == "debug":

        class Formats(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                self.format(record)

        logger = logging.getLogger("persistkit")
        logger.addHandler(Formats())
        logger.setLevel(logging.DEBUG)
        logger.propagate = False


def worker(variant: str, url: str, steps: int) -> dict[str, float]:
    _configure(variant)
    import persistkit as pk

    expected = Path(os.environ["PERSISTKIT_BENCH_SRC"]).resolve()
    assert Path(pk.__file__).resolve().is_relative_to(expected), (pk.__file__, expected)

    @pk.checkpointed(name="bench.step")
    def step(i: int) -> int:
        return i

    store = pk.connect(url)
    ran, replayed = [], []
    for _ in range(3):
        thread = f"bench-{uuid.uuid4().hex}"
        t = time.process_time()
        with pk.resume(thread, store=store) as run:
            notes = run.state.setdefault("notes", [])
            for i in range(steps):
                notes.append("n" * 100)
                step(i)
        ran.append((time.process_time() - t) / steps)
        t = time.process_time()
        with pk.resume(thread, store=store, run_id=run.run_id):
            for i in range(steps):
                step(i)
        replayed.append((time.process_time() - t) / steps)
    store.close()
    return {"ran": min(ran) * 1e6, "replayed": min(replayed) * 1e6}


# -- the driver --------------------------------------------------------------------------------


def _before(rev: str | None) -> tuple[str, Path] | None:
    """(revision, directory) of the package before the hook, exported from git; None without git."""
    try:
        if rev is None:
            added = subprocess.run(
                ["git", "log", "--format=%H", "-S", "observer.call_sync", "--", "persistkit/engine/_api.py"],
                cwd=ROOT, capture_output=True, text=True, check=True,
            ).stdout.split()
            if not added:
                return None
            rev = added[-1] + "^"
        sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True, check=True)
        out = Path(tempfile.mkdtemp(prefix="pk-before-"))
        archive = subprocess.run(["git", "archive", rev, "persistkit"], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
        return sha.stdout.strip(), out
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"(no baseline before the hook: {exc})")
        return None


def _run(variant: str, src: Path, url: str, steps: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src), "PERSISTKIT_BENCH_SRC": str(src / "persistkit")}
    out = subprocess.run(
        [sys.executable, str(HERE), "--worker", variant, "--url", url, "--steps", str(steps)],
        env=env, capture_output=True, text=True, check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"{variant} failed:\n{out.stderr}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--stores", default="memory,sqlite")
    ap.add_argument("--before", default=None, help="the git revision to compare with (default: before the hook)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--url", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.url, args.steps)))
        return

    before = _before(args.before)
    variants = [v for v in VARIANTS if v != "before" or before is not None]
    src = {v: ROOT for v in variants}
    if before is not None:
        src["before"] = before[1]
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.stores.split(","):
            times: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
            for r in range(args.rounds):
                for v in variants:
                    url = "memory://bench" if kind == "memory" else f"sqlite:///{tmp}/{v}-{r}.db"
                    times[v].append(_run(v, src[v], url, args.steps))
            med = {v: {k: statistics.median(t[k] for t in times[v]) for k in ("ran", "replayed")} for v in variants}
            base = "before" if before is not None else "off"
            label = f"before the hook ({before[0]})" if before is not None else ""
            print(f"\n{kind} store, {args.steps} steps, per step (median of {args.rounds} rounds, each the best of 3):")
            print(f"  {'':36} {'ran':>9} {'x':>6}   {'replayed':>9} {'x':>6}")
            for v in variants:
                name = label if v == "before" else VARIANTS[v]
                ran, rep = med[v]["ran"], med[v]["replayed"]
                print(
                    f"  {name:36} {ran:8.2f}us {ran / med[base]['ran']:5.2f}x   "
                    f"{rep:8.2f}us {rep / med[base]['replayed']:5.2f}x"
                )
    if before is not None:
        import shutil

        shutil.rmtree(before[1], ignore_errors=True)


if __name__ == "__main__":
    main()
