"""``export`` and ``import``: threads moved between stores as JSON Lines.

What moves is each thread's data as ``backends/_copy`` reads it (the logic
``store.copy_from`` uses): every blob, and every row of every namespace oldest
first. The records are exported *decoded but still redacted*: read through the
source's wrappers (decrypted, integrity tags checked, offloaded records fetched)
and out of the codec's envelope (decompressed), each one the JSON tree that
was stored — never resolved, so a secret is its handle (``$CRED{...}``) there as
it is in the store. No key material is exported: the target seals what it
writes with its own keys (encryption) and chains it anew (integrity). Lease
records and the store's handle key are not part of a thread and stay behind.

The file (format 1), one JSON object a line::

    {"persistkit": "export", "format": 1, "source": URL, "threads": [ids]}
    (with ``--timestamp``, also ``"created": ISO``: without it, two exports of the same
    data are byte-equal, so a file can be compared or checksummed)
    {"type": "thread", "thread": T, "rows": N, "blobs": M}
    {"type": "blob", "thread": T, "key": K, "body": <stored tree>}             (M lines)
    {"type": "row", "thread": T, "namespace": NS, "checkpoint": C, "parent": P,
     "run": R, "body": <stored record>}                                         (N lines)
    {"type": "end", "thread": T}
    ... one such group per thread ...
    {"type": "end-of-export", "threads": K}

Import is all or nothing per thread: a thread's lines are read and checked
before anything of it is written, and a failed write deletes what of it was
written. A file given by name is checked whole before the first write (stdin is
read once: the threads before a malformed line stay imported, and the error says
which). An existing thread is refused, before anything is written, unless
``--replace`` (which deletes it just before its new copy is written).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import IO, Any

from .._errors import ConfigurationError, NotFoundError, PersistkitError, SerializationError
from .._ids import is_checkpoint_id
from ..backends import CheckpointRow, mask_url
from ..backends._copy import ThreadCopy, read_thread, write_thread
from ..codec._pipeline import Codec, _dump
from ..engine._store import Store, check_namespace, check_thread_id
from ..state._records import _check_body
from ._open import env_keys, namespaces, open_store, resolve_url, thread_not_found
from ._output import Output, cell, dumps, whole_file

__all__ = ["FORMAT", "add_parsers"]

FORMAT = 1
_BLOB_KEY = re.compile(r"[0-9A-Za-z:._~%-]{1,1024}")


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    e = sub.add_parser(
        "export", parents=[common], help="write threads as JSON Lines (to move them to another store)",
        description="Write each THREAD (or --all) as JSON Lines to FILE (default: stdout): every checkpoint "
        "and value, decrypted but still redacted (secrets stay their handles), no key material. "
        "`persistkit import` reads it into another store, which seals it with its own keys "
        "(docs/operations.md, Command line). Lease records are not exported.",
    )
    e.add_argument("threads", nargs="*", metavar="THREAD", help="thread id(s)")
    e.add_argument("--all", action="store_true", help="every thread of the store")
    e.add_argument("-o", "--output", metavar="FILE", help="write here (default: stdout); written whole or not at all")
    e.add_argument("--timestamp", action="store_true", help="put the time of the export in its header (then "
                   "two exports of the same data differ)")
    e.add_argument("--json", action="store_true", help="print the summary as JSON")
    e.set_defaults(func=_export)

    i = sub.add_parser(
        "import", parents=[common], help="read threads from an export into this store",
        description="Read the threads of FILE (default: stdin), written by `persistkit export`, into the "
        "store (created when missing, as `migrate` does). Each thread is imported whole or not at "
        "all; an existing thread is refused, nothing written, unless --replace. The target's "
        "encryption and integrity seal what it writes ($PERSISTKIT_ENCRYPTION_KEYS / "
        "$PERSISTKIT_INTEGRITY_KEYS or the URL's options, as for every verb).",
    )
    i.add_argument("file", metavar="FILE", nargs="?", help="the export (default: stdin)")
    i.add_argument("--replace", action="store_true", help="replace threads the store already has")
    i.add_argument("--json", action="store_true", help="print the summary as JSON")
    i.set_defaults(func=_import)


# -- export -------------------------------------------------------------------------------


def _line(obj: dict[str, Any]) -> str:
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate in an id or text: escaped, still valid JSON
        text = json.dumps(obj, ensure_ascii=True, separators=(",", ":"))
    return text + "\n"


def _tree(codec: Codec, data: bytes, where: str) -> Any:
    return Codec.load_tree(codec.open(data, where), where)


def export_lines(store: Store, threads: list[str], *, timestamp: bool = False) -> Iterator[tuple[str, str]]:
    """The export of ``threads`` (which exist) line by line, each with its type; a thread is
    read when its lines are due. The same data gives the same bytes unless ``timestamp``."""
    header: dict[str, Any] = {"persistkit": "export", "format": FORMAT, "source": mask_url(store.url)}
    if timestamp:
        header["created"] = datetime.now(UTC).isoformat(timespec="seconds")
    yield "header", _line({**header, "threads": threads})
    for tid in threads:
        copy = read_thread(store.backend, tid)
        yield "thread", _line({"type": "thread", "thread": tid, "rows": copy.count, "blobs": len(copy.blobs)})
        for key in sorted(copy.blobs):
            body = _tree(store.codec, copy.blobs[key], f"thread {tid!r} blob {key!r}")
            yield "blob", _line({"type": "blob", "thread": tid, "key": key, "body": body})
        for ns, rows in copy.rows.items():
            for r in rows:
                body = _tree(store.codec, r.payload, f"thread {tid!r} checkpoint {r.checkpoint_id}")
                yield "row", _line({"type": "row", "thread": tid, "namespace": ns, "checkpoint": r.checkpoint_id,
                             "parent": r.parent_id, "run": r.run_id, "body": body})
        yield "end", _line({"type": "end", "thread": tid})
    yield "end-of-export", _line({"type": "end-of-export", "threads": len(threads)})


def _export(ns: argparse.Namespace, out: Output) -> int:
    if bool(ns.threads) == bool(ns.all):
        ns.parser.error("give THREAD id(s) or --all (not both)")
    with open_store(resolve_url(ns.url)) as store:
        threads = list(ns.threads) if ns.threads else store.threads()
        for tid in threads:  # every id checked before a line is written
            if not namespaces(store, tid):
                raise thread_not_found(store, tid)
        counts = {"threads": len(threads), "rows": 0, "blobs": 0}
        if ns.output is None:
            _write(export_lines(store, threads, timestamp=ns.timestamp), sys.stdout, counts)
        else:
            try:
                with whole_file(ns.output, "w") as f:
                    _write(export_lines(store, threads, timestamp=ns.timestamp), f, counts)
            except OSError as exc:
                raise ConfigurationError(f"cannot write the export to {ns.output!r}: {exc.strerror}") from exc
    summary = (f"exported {counts['threads']} thread(s), {counts['rows']} checkpoint(s), "
               f"{counts['blobs']} blob(s)" + (f" to {ns.output}" if ns.output else ""))
    report = Output(as_json=out.as_json, stream=sys.stderr if ns.output is None else out.stream)
    report.line(dumps({**counts, "file": ns.output}) if out.as_json else summary)
    return 0


def _write(lines: Iterable[tuple[str, str]], stream: IO[str], counts: dict[str, int]) -> None:
    for kind, text in lines:
        if kind in ("row", "blob"):
            counts[kind + "s"] += 1
        stream.write(text)


# -- import -------------------------------------------------------------------------------


class _Thread:
    """One thread's lines as read: the trees, checked, not yet sealed for a store."""

    def __init__(self, thread_id: str, rows: int, blobs: int) -> None:
        self.thread_id, self.want_rows, self.want_blobs = thread_id, rows, blobs
        self.blobs: dict[str, Any] = {}
        self.rows: dict[str, list[tuple[str, str | None, str | None, Any]]] = {}

    def copy(self, codec: Codec) -> ThreadCopy:
        """The thread sealed by ``codec`` (the target's compression) as ``backends/_copy`` writes it."""
        tid = self.thread_id
        blobs = {k: codec.seal(_dump(t)) for k, t in self.blobs.items()}
        rows = {ns: [CheckpointRow(tid, ns, cid, parent, run, codec.seal(_dump(body))) for cid, parent, run, body in rs]
                for ns, rs in self.rows.items()}
        return ThreadCopy(tid, blobs, rows)


class _Reader:
    """Reads an export line by line, checking each line; every problem names its line."""

    def __init__(self, lines: Iterable[str], name: str) -> None:
        self.lines, self.name, self.n = lines, name, 0
        self.header: dict[str, Any] = {}

    def fail(self, what: str) -> SerializationError:
        return SerializationError(f"{self.name} line {self.n}: {what}")

    def _objects(self) -> Iterator[dict[str, Any]]:
        for text in self.lines:
            self.n += 1
            try:
                obj = json.loads(text)
            except ValueError as exc:
                raise self.fail(f"not JSON ({exc})" + ("; is this a persistkit export?" if self.n == 1 else "")) from None
            if not isinstance(obj, dict):
                raise self.fail(f"expected a JSON object, got {type(obj).__name__}")
            yield obj

    def threads(self) -> Iterator[_Thread]:
        """Each thread, once its lines up to its ``end`` line are read and checked."""
        objects = self._objects()
        first = next(objects, None)
        if first is None:
            raise SerializationError(f"{self.name} is empty: expected a persistkit export (`persistkit export`)")
        self._check_header(first)
        current: _Thread | None = None
        seen: list[str] = []
        for obj in objects:
            kind = obj.get("type")
            if kind == "end-of-export":
                if current is not None:
                    raise self.fail(f"the export ends inside thread {current.thread_id!r}")
                if obj.get("threads") != len(seen) or seen != self.header["threads"]:
                    raise self.fail(f"the export lists {len(self.header['threads'])} thread(s) and holds {len(seen)}")
                if next(objects, None) is not None:
                    raise self.fail("a line after the end of the export")
                return
            if kind == "thread":
                if current is not None:
                    raise self.fail(f"thread {current.thread_id!r} has no end line")
                tid = self._id(obj.get("thread"), "thread")
                rows, blobs = obj.get("rows"), obj.get("blobs")
                if type(rows) is not int or type(blobs) is not int or rows < 0 or blobs < 0:
                    raise self.fail("a thread line needs counts 'rows' and 'blobs'")
                current = _Thread(tid, rows, blobs)
                continue
            if current is None or obj.get("thread") != current.thread_id:
                raise self.fail(f"a {kind!r} line outside its thread's lines" if current is None else
                                f"a line of thread {obj.get('thread')!r} inside thread {current.thread_id!r}")
            if kind == "blob":
                self._blob(current, obj)
            elif kind == "row":
                self._row(current, obj)
            elif kind == "end":
                got_rows = sum(len(r) for r in current.rows.values())
                if (got_rows, len(current.blobs)) != (current.want_rows, current.want_blobs):
                    raise self.fail(f"thread {current.thread_id!r} holds {got_rows} row(s) and "
                                    f"{len(current.blobs)} blob(s), its thread line says "
                                    f"{current.want_rows} and {current.want_blobs}")
                seen.append(current.thread_id)
                yield current
                current = None
            else:
                raise self.fail(f"unknown line type {kind!r}")
        raise SerializationError(
            f"{self.name} ends at line {self.n} without its last line (end-of-export): the export was cut "
            "short. Export the threads again"
        )

    def _check_header(self, obj: dict[str, Any]) -> None:
        if obj.get("persistkit") != "export":
            raise self.fail("not a persistkit export: the first line is not its header "
                            '({"persistkit": "export", "format": ...}); write one with `persistkit export`')
        if obj.get("format") != FORMAT:
            raise self.fail(f"export format {obj.get('format')!r} is not one this persistkit reads (format "
                            f"{FORMAT}): import it with the persistkit version that wrote it, or a newer one")
        threads = obj.get("threads")
        if not isinstance(threads, list):
            raise self.fail("the header lists no threads")
        self.header = {**obj, "threads": [self._id(t, "thread") for t in threads]}

    def _id(self, value: Any, what: str) -> str:
        try:
            return check_thread_id(value, what)
        except ConfigurationError as exc:
            raise self.fail(str(exc)) from None

    def _blob(self, t: _Thread, obj: dict[str, Any]) -> None:
        key = obj.get("key")
        if not isinstance(key, str) or not _BLOB_KEY.fullmatch(key):
            raise self.fail(f"blob key {key!r} is not one (printable ASCII letters, digits and :._~%-)")
        if key in t.blobs or "body" not in obj:
            raise self.fail(f"blob {key!r} given twice, or without a body")
        t.blobs[key] = obj["body"]

    def _row(self, t: _Thread, obj: dict[str, Any]) -> None:
        cid, parent, run = obj.get("checkpoint"), obj.get("parent"), obj.get("run")
        try:
            ns = check_namespace(obj.get("namespace"))
        except ConfigurationError as exc:
            raise self.fail(str(exc)) from None
        if not isinstance(cid, str) or not is_checkpoint_id(cid) or not (parent is None or is_checkpoint_id(parent)):
            raise self.fail(f"checkpoint {cid!r} (parent {parent!r}) is not a checkpoint id")
        run = None if run is None else self._id(run, "run")
        problem = _check_body(obj.get("body"))
        if problem:
            raise self.fail(f"checkpoint {cid}: its body is not a persistkit checkpoint record ({problem})")
        rows = t.rows.setdefault(ns, [])
        if rows and rows[-1][0] >= cid:
            raise self.fail(f"checkpoint {cid} comes after {rows[-1][0]}: rows must be oldest first")
        rows.append((cid, parent, run, obj["body"]))


def _import(ns: argparse.Namespace, out: Output) -> int:
    if ns.file is not None and "://" in ns.file:
        ns.parser.error(f"{ns.file!r} is a store URL: give it with --url (FILE is the export to read)")
    url = resolve_url(ns.url)
    name = ns.file or "<stdin>"
    if ns.file is not None and not os.path.isfile(ns.file):
        raise NotFoundError(f"no file {os.path.abspath(ns.file)} to import")
    done: list[dict[str, Any]] = []
    with _source(ns.file) as f:
        if ns.file is not None:  # a file is checked whole before anything is written
            for _ in _Reader(f, name).threads():
                pass
            f.seek(0)
        reader = _Reader(f, name)
        with open_store(url, create=True, **env_keys(url)) as store:
            try:
                for t in reader.threads():
                    if not done:
                        _refuse_existing(store, reader.header["threads"], ns.replace)
                    done.append(_write_thread(store, t, replace=ns.replace))
            except PersistkitError as exc:
                if done:
                    names = ", ".join(repr(d["thread"]) for d in done)
                    raise _again(exc, f"{exc}. Imported before it, whole: {names}") from exc
                raise
    if out.as_json:
        out.value(done)
    else:
        for d in done:
            out.line(f"imported {cell(d['thread'])}: {d['rows']} checkpoint(s), {d['blobs']} blob(s)"
                     + (" (replaced)" if d["replaced"] else ""))
        out.line(f"{len(done)} thread(s) imported into {mask_url(store.url)}")
    return 0


def _source(path: str | None) -> contextlib.AbstractContextManager[IO[str]]:
    """The file to read, or stdin (left open: it is the process's)."""
    if path is None:
        return contextlib.nullcontext(sys.stdin)
    return open(path, encoding="utf-8")


def _refuse_existing(store: Store, threads: list[str], replace: bool) -> None:
    """Before the first write: the threads the store already has are refused (unless ``replace``)."""
    existing = [t for t in threads if namespaces(store, t)]
    if existing and not replace:
        shown = ", ".join(repr(t) for t in existing[:5]) + (" ..." if len(existing) > 5 else "")
        raise ConfigurationError(
            f"the store at {mask_url(store.url)} already has {len(existing)} of the threads to import "
            f"({shown}); nothing was imported. Pass --replace to replace them, or delete them first "
            "(`persistkit delete`)"
        )


def _write_thread(store: Store, t: _Thread, *, replace: bool) -> dict[str, Any]:
    copy = t.copy(store.codec)
    replaced = bool(namespaces(store, t.thread_id))
    if replaced:
        if not replace:  # written by someone else since the check
            raise ConfigurationError(f"thread {t.thread_id!r} appeared in the store during the import; "
                                     "pass --replace to replace it")
        store.delete_thread(t.thread_id)
    try:
        rows = write_thread(store.backend, copy)
        # The lines were checked one by one; a thread they describe must also read back whole
        # (a row missing from the file leaves a list linking to nothing: refused, not imported).
        for space in namespaces(store, t.thread_id) or [""]:
            store.get_state(t.thread_id, namespace=space, plain=True)
    except BaseException as exc:
        store.delete_thread(t.thread_id)  # all or nothing: no half thread stays
        if isinstance(exc, PersistkitError):
            raise _again(exc, f"thread {t.thread_id!r} was not imported (what was written of it is deleted): {exc}") from exc
        raise
    return {"thread": t.thread_id, "rows": rows, "blobs": len(copy.blobs), "replaced": replaced}


def _again(exc: PersistkitError, message: str) -> PersistkitError:
    """``exc`` told with more context: a malformed file stays a SerializationError."""
    return SerializationError(message) if isinstance(exc, SerializationError) else PersistkitError(message)
