"""``-o FILE`` of the CLI (timeline, export): written whole or not at all, and never
replacing what is not a regular file (found from outside: a FIFO, a symlink and, as
root, /dev/full were replaced by regular files)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from persistkit._cli._output import whole_file


def test_a_regular_file_is_replaced_whole(tmp_path: Path) -> None:
    target = tmp_path / "out.html"
    target.write_text("old")
    with whole_file(str(target)) as f:
        f.write(b"new")
        assert target.read_text() == "old"  # not yet
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.html"]


def test_an_error_leaves_the_old_file_and_no_part(tmp_path: Path) -> None:
    target = tmp_path / "out.jsonl"
    target.write_text("old")
    with pytest.raises(RuntimeError), whole_file(str(target), "w") as f:
        f.write("half")
        raise RuntimeError("cut")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]


def test_a_symlink_is_followed_and_stays(tmp_path: Path) -> None:
    real = tmp_path / "real.html"
    real.write_text("old")
    link = tmp_path / "link.html"
    link.symlink_to(real)
    with whole_file(str(link)) as f:
        f.write(b"new")
    assert link.is_symlink() and real.read_text() == "new"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_written_through(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    with whole_file(str(fifo)) as f:
        f.write(b"page")
    reader.join(10)
    assert got == [b"page"] and fifo.is_fifo()


def test_a_device_is_written_through() -> None:
    with whole_file(os.devnull) as f:
        f.write(b"gone")
    assert Path(os.devnull).is_char_device()


def test_a_long_thread_id_gets_a_page_name_a_file_system_takes() -> None:
    from persistkit.ops._timeline_html import page_name

    long_a, long_b = "日本語" * 40, "日本語" * 40 + "x"
    for tid in (long_a, long_b):
        assert len(page_name(tid).encode()) <= 255 and page_name(tid).endswith(".html")
    assert page_name(long_a) != page_name(long_b)
    assert page_name("ticket-42") == "ticket-42.html"  # short ids as they were


def test_timeline_usage_errors(tmp_path: Path) -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "persistkit", "timeline", *args], capture_output=True, text=True,
                              cwd=tmp_path, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, timeout=60)

    two = cli("sqlite:///a.db", "t", "--url", "sqlite:///b.db")
    assert two.returncode == 2 and "two stores" in two.stderr
    both = cli("t", "-o", "-", "--json", "--url", f"sqlite:///{tmp_path}/x.db")
    assert both.returncode == 2 and "--json" in both.stderr
