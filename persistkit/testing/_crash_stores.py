"""The crash matrix's stores (``persistkit.testing.crash_matrix``): a fresh store per run.

``url="sqlite"``: each store a file in a directory of the matrix call's own (made in the
caller's ``directory``, or the system's temporary one), so two calls never read each
other's files, removed with what is in it when the matrix ends; ``memory://``: a fresh
store per run; a server URL: the threads the agent used are deleted before each use and at
the end. :func:`takes_store`: whether the agent takes the store as its one argument.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from .._errors import ConfigurationError
from ..engine._store import Store, connect

__all__ = ["Stores", "takes_store"]


def takes_store(agent: Callable[..., Any]) -> bool:
    try:
        params = [
            p
            for p in inspect.signature(agent).parameters.values()
            if p.default is inspect.Parameter.empty
        ]
    except (TypeError, ValueError):
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if len(params) > 1 or (params and params[0].kind not in positional):
        raise ConfigurationError(
            f"crash_matrix: the agent must take no argument or the store as its one argument, got {inspect.signature(agent)}"
        )
    return bool(params)


class Stores:
    """Fresh stores of one kind: memory, SQLite files, or a server URL whose threads are reset."""

    def __init__(self, url: str, directory: str | None) -> None:
        self.url = url
        self.shared = not (url.startswith("memory:") or url == "sqlite")
        # SQLite: a directory of this call's own (inside ``directory`` when given), so two
        # calls never share a file name; it and what the matrix left in it go at the end
        self.own_dir = url == "sqlite"
        self.dir = tempfile.mkdtemp(prefix="pk-crash-matrix-", dir=directory) if self.own_dir else directory
        self.n = 0
        self.template: str | None = None
        self.template_store: Store | None = None  # open while the pool is: see fresh_url
        self.paths: dict[int, str] = {}  # id of a store of the matrix's own dir -> its file
        self.threads: set[str] = set()
        self.open: list[Store] = []

    def fresh_url(self) -> str:
        if self.url == "sqlite":
            self.n += 1
            path = os.path.join(self.dir or ".", f"matrix-{os.getpid()}-{self.n}.db")
            # a copy of an empty store made once: creating its schema costs tens of ms (a
            # few synced transactions), which the matrix paid once per crash point. The copy
            # takes the template's write-ahead log too, which still holds the schema (its
            # store stays open until the pool ends: closing it would move the log into the
            # file): a store's first write then appends to a log, where it would start a new
            # one, whose header SQLite syncs (~10 ms, the most a short resume cost)
            if self.template is None:
                self.template = os.path.join(self.dir or ".", f"empty-{os.getpid()}.db")
                self.template_store = connect(f"sqlite:///{self.template}")
            shutil.copyfile(self.template, path)
            if os.path.exists(self.template + "-wal"):
                shutil.copyfile(self.template + "-wal", path + "-wal")
            return f"sqlite:///{path}"
        if self.shared:
            self.reset()
        return self.url

    def fresh(self) -> Store:
        url = self.fresh_url()
        store = connect(url)
        self.open.append(store)
        if self.own_dir:
            self.paths[id(store)] = url.removeprefix("sqlite:///")
        return store

    def release(self, store: Store) -> None:
        """Close a store :meth:`fresh` opened, before the pool ends."""
        self._close(store)
        self.open.remove(store)

    def _close(self, store: Store) -> None:
        # a file of the matrix's own is removed before it is closed: closing SQLite's last
        # connection checkpoints the WAL into the file (and syncs it), for nobody
        path = self.paths.pop(id(store), None)
        if path is not None:
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path + suffix)
        store.close()

    def reset(self) -> None:
        if self.threads:
            with connect(self.url) as store:
                for t in sorted(self.threads):
                    store.delete_thread(t)

    def close(self) -> None:
        for store in self.open:
            self._close(store)
        if self.shared:
            self.reset()
        if self.template_store is not None:
            self.paths[id(self.template_store)] = self.template or ""
            self._close(self.template_store)
        if self.own_dir and self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
