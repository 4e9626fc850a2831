"""The shipped child-run conformance checks (persistkit.testing.children_suite) on every store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import persistkit as pk
from persistkit.coordination._children import child_run_id
from persistkit.testing.children_suite import ChildrenConformance, delegates, research


class TestChildren(ChildrenConformance):
    """``persistkit_url`` comes from conftest: one fresh store per backend."""


def test_show_and_the_timeline_draw_the_tree(tmp_path: Path) -> None:
    """`persistkit show THREAD` and the timeline list a run's children, their own children and status."""
    url = f"sqlite:///{tmp_path}/tree.db"
    store = pk.connect(url)
    with pk.resume("sup", store=store) as run:
        done = pk.start(delegates, "t", executor="inline")
        queued = pk.start(research, "q", executor=lambda spec: None)  # handed to nobody: pending
        assert done.result() == "T/GRAND!+"
    store.close()
    shown = subprocess.run([sys.executable, "-m", "persistkit", "show", "sup", "--url", url, "--json"],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    tree = json.loads(shown.stdout)["children"]
    assert [(k["agent"], k["status"]) for k in tree] == [
        ("persistkit.testing.children_suite:delegates", "completed"),
        ("persistkit.testing.children_suite:research", "cancelled"),  # the parent's end cancelled it
    ]
    assert [(k["agent"], k["status"]) for k in tree[0]["children"]] == [
        ("persistkit.testing.children_suite:research", "completed")]
    text = subprocess.run([sys.executable, "-m", "persistkit", "show", "sup", "--url", url],
                          capture_output=True, text=True, timeout=120)
    first = child_run_id(run.run_id, "0", "sup", run.namespace)  # <run id>:0@<digest of the parent thread>
    assert f"0: persistkit.testing.children_suite:delegates on thread sup~{first}" in text.stdout
    assert f"    0/0: persistkit.testing.children_suite:research on thread sup~{first}~{first}:0/0@" in text.stdout
    with pk.connect(url) as again:
        from persistkit.ops._timeline import model, render

        assert [k["status"] for k in model(again, "sup")["children"]] == ["completed", "cancelled"]
        assert queued.run_id in render(again, "sup") and "Child runs" in render(again, "sup")
