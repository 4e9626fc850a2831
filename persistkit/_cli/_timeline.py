"""The ``timeline`` verb: one thread's runs as a self-contained HTML page (``ops/_timeline``).

``persistkit timeline THREAD [-o FILE] [--url URL]`` (the store as every verb takes it:
``--url``, else ``$PERSISTKIT_URL``; ``persistkit timeline URL THREAD`` works too, a first
argument holding ``://`` being the store's URL). The file is written whole or not at all
(a temporary file renamed over it, so readable by its owner only, as the
thread's data may be private); ``-o -`` writes the page to standard output.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from .._errors import ConfigurationError
from ..ops._timeline import MAX_CHECKPOINTS, VALUE_CAP, render
from ..ops._timeline_html import page_name
from ._open import open_store, require_thread, resolve_url, split_url
from ._output import Output, cell, whole_file

__all__ = ["add_parsers"]


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    t = sub.add_parser(
        "timeline", parents=[common], help="write a thread's runs as one HTML page (open it in a browser)",
        description="Write THREAD's timeline as one self-contained HTML file (no network needed to open "
        "it): its runs as lanes, each attempt a row of steps (ran, replayed, retried, failed, "
        "suspended, answered) with durations and errors; click a step for its arguments digest, "
        "result, and the state at its checkpoint with the changes from the previous one. Secrets "
        f"show as their handles. Values are cut to {VALUE_CAP:,} characters each and the newest "
        f"{MAX_CHECKPOINTS:,} checkpoints are read. The store is --url, else $PERSISTKIT_URL, else "
        "sqlite:///.persistkit/persistkit.db; `persistkit timeline URL THREAD` works too.",
    )
    t.add_argument("thread", metavar="THREAD", help="the thread id")
    t.add_argument("extra", nargs="*", default=[], help=argparse.SUPPRESS)  # THREAD after a leading URL
    t.add_argument("-o", "--output", metavar="FILE",
                   help="where to write the page (default: THREAD.html, the name fork links use; - for stdout)")
    t.add_argument("--namespace", default="", help="the thread's namespace (see `persistkit threads`)")
    t.add_argument("--json", action="store_true", help="print what was written as JSON")
    t.set_defaults(func=_timeline)


def _timeline(ns: argparse.Namespace, out: Output) -> int:
    url, args = split_url([ns.thread, *ns.extra])
    if len(args) != 1:
        ns.parser.error("timeline shows ONE thread: give THREAD (the store URL goes in --url)" if not args
                        else f"timeline shows ONE thread, got {len(args)}: {' '.join(map(cell, args))}")
    thread = args[0]
    if url is not None and ns.url is not None and url != ns.url:
        ns.parser.error(f"two stores given: {cell(url)} and --url {cell(ns.url)}; give one")
    if ns.output == "-" and ns.json:
        ns.parser.error("-o - writes the page to stdout: --json has nowhere to go (drop one)")
    with open_store(resolve_url(ns.url or url), display=True) as store:
        require_thread(store, thread, ns.namespace)
        text = render(store, thread, namespace=ns.namespace)
    if ns.output == "-":
        sys.stdout.write(text)
        return 0
    path = ns.output or page_name(thread)
    size = _write(path, text.encode())
    if out.as_json:
        out.value({"thread": thread, "path": os.path.abspath(path), "bytes": size})
    else:
        out.line(f"wrote {cell(path)} ({size / 1024:,.0f} KB): open it in a browser")
    return 0


def _write(path: str, data: bytes) -> int:
    """Write ``data`` to ``path`` whole or not at all (``whole_file``)."""
    try:
        with whole_file(path) as f:
            f.write(data)
    except OSError as exc:
        raise ConfigurationError(f"cannot write the timeline to {path!r}: {exc.strerror}") from exc
    return len(data)
