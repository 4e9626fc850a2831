"""Runs the ```python blocks of one docs page in order, in one process, as a reader would paste them.

    python doc_page.py BLOCKS.json

BLOCKS.json is a list of ``{"where": ..., "code": ..., "env": {...}}`` (tests/test_docs_examples.py
writes it). Every block runs in one fresh ``__main__`` module, so a later block sees what an
earlier one defined (a class a store names by import path resolves, as in a script); a block
with a top-level ``await`` runs on the page's one event loop. ``env`` is set for that block
only (a service's URL, test keys) and removed after it. The first block that raises ends the
page: its ``where`` goes to stderr's last line, after the traceback.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import os
import sys
import time
import traceback
import types


def main(path: str) -> int:
    with open(path) as f:
        blocks = json.load(f)
    module = types.ModuleType("__main__")
    module.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = module
    loop = asyncio.new_event_loop()
    try:
        for block in blocks:
            saved = {name: os.environ.get(name) for name in block["env"]}
            os.environ.update(block["env"])
            started = time.perf_counter()
            try:
                code = compile(block["code"], block["where"], "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
                if code.co_flags & inspect.CO_COROUTINE:
                    loop.run_until_complete(eval(code, module.__dict__))
                else:
                    exec(code, module.__dict__)
            except BaseException:
                traceback.print_exc()
                print(f"FAILED BLOCK: {block['where']}", file=sys.stderr)
                return 1
            finally:
                if os.environ.get("DOC_PAGE_TIMES"):
                    print(f"{time.perf_counter() - started:6.2f}s {block['where']}", file=sys.stderr)
                for name, value in saved.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
