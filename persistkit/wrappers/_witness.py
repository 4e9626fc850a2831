"""Witnesses: the latest head tag of every thread, kept OUTSIDE the store.

A keyed hash chain proves that what a store returns was written by a key
holder and that its records are complete and in order *up to its head*. It
cannot tell a store rolled back to an older complete copy (a backup restored,
a volume snapshot reverted) from the real thing: the old copy is genuine. A
witness remembers, for every ``(thread, namespace)``, the newest
``(seq, checkpoint_id, tag)`` this process (or every writer sharing the
witness) committed; :class:`~persistkit.wrappers._integrity.IntegrityBackend`
refuses a head older than that.

Three implementations, chosen by ``pk.connect(..., witness=...)``:

``"file:PATH"`` → :class:`FileWitness`
    Append-only JSON lines, one per write, flushed (not fsynced unless
    ``fsync=True``), compacted when it grows past twice its live entries.
    Read once when opened, then served from memory.
a Backend or a store URL → :class:`StoreWitness`
    A second persistkit store (another database, a Redis, a bucket): one tiny
    row per recorded write, moved with the store's own head compare-and-swap,
    so several processes can share it.
an object with ``record`` / ``latest`` (/ ``forget``) → :class:`CallbackWitness`
    Anything else (a KMS-backed log, a transparency service, a test double).

A witness may lag (a crash between the store write and the witness record,
a file witness of another process): a head *newer* than the witness is
accepted. Witness failures on write are logged, never raised: the checkpoint
is already durable, and failing the step would desynchronize the run.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import BackendError, ConfigurationError, ConflictError, IntegrityError
from ..backends._protocol import Backend, CheckpointRow

__all__ = ["CallbackWitness", "FileWitness", "StoreWitness", "Witness", "WitnessEntry", "coerce_witness"]

log = logging.getLogger("persistkit")


@dataclass(frozen=True, slots=True)
class WitnessEntry:
    """The newest head a witness saw for one ``(thread, namespace)``."""

    seq: int
    checkpoint_id: str
    tag: bytes


class Witness:
    """Keeps the latest ``(seq, checkpoint_id, tag)`` per ``(thread, namespace)``.

    Subclasses implement the three sync methods; the async twins call them
    directly (file and callback witnesses do no network I/O) unless overridden.
    """

    def record(self, thread_id: str, namespace: str, seq: int, checkpoint_id: str, tag: bytes) -> None:
        raise NotImplementedError

    def latest(self, thread_id: str, namespace: str) -> WitnessEntry | None:
        raise NotImplementedError

    def forget(self, thread_id: str) -> None:
        """The thread was deleted through persistkit: drop every namespace of it."""
        raise NotImplementedError

    def namespaces(self, thread_id: str) -> list[str]:
        """The namespaces of ``thread_id`` this witness knows (for ``verify``: a thread
        removed from the store entirely is still walked). Optional: ``[]`` by default."""
        return []

    def close(self) -> None:
        """Release resources. Idempotent."""

    async def arecord(self, thread_id: str, namespace: str, seq: int, checkpoint_id: str, tag: bytes) -> None:
        self.record(thread_id, namespace, seq, checkpoint_id, tag)

    async def alatest(self, thread_id: str, namespace: str) -> WitnessEntry | None:
        return self.latest(thread_id, namespace)

    async def aforget(self, thread_id: str) -> None:
        self.forget(thread_id)

    async def aclose(self) -> None:
        self.close()


class FileWitness(Witness):
    """A local append-only file of JSON lines; the last line for a thread wins.

    ``fsync=True`` makes every record durable before the step returns (about
    a disk flush per step); by default lines are flushed to the OS only, so a
    power loss may lose the newest records: the witness then lags, which is
    safe (it never refuses a genuine head because of it).
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], WitnessEntry] = {}
        self._lines = 0
        self._load()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self._torn:  # drop the torn fragment, or the next record would be glued onto it
                with open(self.path, "r+b") as raw:
                    data = raw.read()
                    raw.truncate(data.rfind(b"\n") + 1)
            self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - held open for appends
        except OSError as exc:
            raise ConfigurationError(f"witness file {str(self.path)!r} cannot be opened ({exc.strerror})") from exc

    def _load(self) -> None:
        self._torn = False
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ConfigurationError(f"witness file {str(self.path)!r} cannot be read ({exc.strerror})") from exc
        self._torn = bool(text) and not text.endswith("\n")
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
                if doc.get("forget"):
                    self._drop(str(doc["t"]))
                else:
                    key = (str(doc["t"]), str(doc["n"]))
                    entry = WitnessEntry(int(doc["s"]), str(doc["c"]), bytes.fromhex(doc["h"]))
                    old = self._entries.get(key)
                    if old is None or entry.seq >= old.seq:
                        self._entries[key] = entry
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                if n == len(text.splitlines()) and not text.endswith("\n"):
                    continue  # a line torn by a crash mid-append: the witness merely lags
                raise IntegrityError(
                    f"witness file {str(self.path)!r} line {n} is malformed; the witness was edited or "
                    "damaged. Restore it, or remove it to start a new witness (rollback detection then "
                    "restarts from the current heads)"
                ) from exc
            self._lines += 1

    def _drop(self, thread_id: str) -> None:
        for key in [k for k in self._entries if k[0] == thread_id]:
            del self._entries[key]

    def _append(self, doc: dict[str, Any]) -> None:
        self._fh.write(json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n")
        self._fh.flush()
        if self.fsync:
            os.fsync(self._fh.fileno())
        self._lines += 1
        if self._lines > 2 * len(self._entries) + 1000:
            self._compact()

    def _compact(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as out:
            for (t, ns), e in self._entries.items():
                out.write(json.dumps({"t": t, "n": ns, "s": e.seq, "c": e.checkpoint_id, "h": e.tag.hex()},
                                     ensure_ascii=False, separators=(",", ":")) + "\n")
            out.flush()
            os.fsync(out.fileno())
        self._fh.close()
        os.replace(tmp, self.path)
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._lines = len(self._entries)

    def record(self, thread_id: str, namespace: str, seq: int, checkpoint_id: str, tag: bytes) -> None:
        with self._lock:
            old = self._entries.get((thread_id, namespace))
            if old is not None and old.seq > seq:
                return
            self._entries[(thread_id, namespace)] = WitnessEntry(seq, checkpoint_id, tag)
            self._append({"t": thread_id, "n": namespace, "s": seq, "c": checkpoint_id, "h": tag.hex()})

    def latest(self, thread_id: str, namespace: str) -> WitnessEntry | None:
        with self._lock:
            return self._entries.get((thread_id, namespace))

    def namespaces(self, thread_id: str) -> list[str]:
        with self._lock:
            return sorted(ns for t, ns in self._entries if t == thread_id)

    def forget(self, thread_id: str) -> None:
        with self._lock:
            self._drop(thread_id)
            self._append({"t": thread_id, "forget": 1})

    def close(self) -> None:
        with self._lock:
            if not self._fh.closed:
                self._fh.close()

    def __repr__(self) -> str:
        return f"FileWitness({str(self.path)!r})"


def _witness_id(seq: int) -> str:
    return format(seq, "016x")


class StoreWitness(Witness):
    """A second persistkit store. Each record is one small row; the witness
    store's head compare-and-swap keeps it monotonic across processes."""

    _ATTEMPTS = 5

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._versions: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def _row(self, thread_id: str, namespace: str, seq: int, checkpoint_id: str, tag: bytes) -> CheckpointRow:
        body = json.dumps({"c": checkpoint_id, "h": tag.hex()}).encode()
        return CheckpointRow(thread_id, namespace, _witness_id(seq), None, None, body)

    def _parse(self, thread_id: str, row: CheckpointRow | None) -> WitnessEntry | None:
        if row is None:
            return None
        try:
            doc = json.loads(row.payload)
            return WitnessEntry(int(row.checkpoint_id, 16), str(doc["c"]), bytes.fromhex(doc["h"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise IntegrityError(
                f"thread {thread_id!r}: the witness store {self.backend.url} holds a malformed record "
                f"{row.checkpoint_id!r}; restore the witness store or point witness= at a fresh one"
            ) from exc

    def record(self, thread_id: str, namespace: str, seq: int, checkpoint_id: str, tag: bytes) -> None:
        key = (thread_id, namespace)
        row = self._row(thread_id, namespace, seq, checkpoint_id, tag)
        for _ in range(self._ATTEMPTS):
            with self._lock:
                version = self._versions.get(key)
            if version is None:
                head = self.backend.head(thread_id, namespace)
                if head is not None and int(head.checkpoint_id, 16) >= seq:
                    return  # another writer already recorded this or a newer head
                version = head.version if head else 0
            try:
                new = self.backend.write(row, {}, version)
            except ConflictError:
                with self._lock:
                    self._versions.pop(key, None)
                continue
            except BackendError:
                with self._lock:  # e.g. the id exists: someone recorded this seq already
                    self._versions.pop(key, None)
                head = self.backend.head(thread_id, namespace)
                if head is not None and int(head.checkpoint_id, 16) >= seq:
                    return
                raise
            with self._lock:
                self._versions[key] = new.version
            return
        raise BackendError(f"thread {thread_id!r}: the witness store kept moving; record of #{seq} gave up")

    def latest(self, thread_id: str, namespace: str) -> WitnessEntry | None:
        head = self.backend.head(thread_id, namespace)
        if head is None:
            return None
        return self._parse(thread_id, self.backend.get(thread_id, namespace, head.checkpoint_id))

    def forget(self, thread_id: str) -> None:
        with self._lock:
            for key in [k for k in self._versions if k[0] == thread_id]:
                del self._versions[key]
        self.backend.delete_thread(thread_id)

    def namespaces(self, thread_id: str) -> list[str]:
        return list(self.backend.namespaces(thread_id))

    async def alatest(self, thread_id: str, namespace: str) -> WitnessEntry | None:
        head = await self.backend.ahead(thread_id, namespace)
        if head is None:
            return None
        return self._parse(thread_id, await self.backend.aget(thread_id, namespace, head.checkpoint_id))

    async def arecord(self, thread_id: str, namespace: str, seq: int, checkpoint_id: str, tag: bytes) -> None:
        import asyncio

        await asyncio.to_thread(self.record, thread_id, namespace, seq, checkpoint_id, tag)

    async def aforget(self, thread_id: str) -> None:
        with self._lock:
            for key in [k for k in self._versions if k[0] == thread_id]:
                del self._versions[key]
        await self.backend.adelete_thread(thread_id)

    def close(self) -> None:
        self.backend.close()

    async def aclose(self) -> None:
        await self.backend.aclose()

    def __repr__(self) -> str:
        return f"StoreWitness({self.backend.url!r})"


class CallbackWitness(Witness):
    """A witness made of the user's functions.

    ``record(thread_id, namespace, seq, checkpoint_id, tag)`` stores an entry;
    ``latest(thread_id, namespace)`` returns a :class:`WitnessEntry`, a
    ``(seq, checkpoint_id, tag)`` tuple, or ``None``; ``forget(thread_id)``
    (optional) drops a deleted thread.
    """

    def __init__(
        self,
        record: Callable[[str, str, int, str, bytes], object],
        latest: Callable[[str, str], object],
        forget: Callable[[str], object] | None = None,
    ) -> None:
        self._record, self._latest, self._forget = record, latest, forget

    def record(self, thread_id: str, namespace: str, seq: int, checkpoint_id: str, tag: bytes) -> None:
        self._record(thread_id, namespace, seq, checkpoint_id, tag)

    def latest(self, thread_id: str, namespace: str) -> WitnessEntry | None:
        got = self._latest(thread_id, namespace)
        if got is None or isinstance(got, WitnessEntry):
            return got
        if isinstance(got, tuple) and len(got) == 3:
            return WitnessEntry(int(got[0]), str(got[1]), bytes(got[2]))
        raise ConfigurationError(
            f"witness latest() must return None, a WitnessEntry or (seq, checkpoint_id, tag), got {type(got).__name__}"
        )

    def forget(self, thread_id: str) -> None:
        if self._forget is not None:
            self._forget(thread_id)


def coerce_witness(value: Any) -> Witness | None:
    """What ``connect(witness=...)`` accepts, as a :class:`Witness`."""
    if value is None:
        return None
    if isinstance(value, Witness):
        return value
    if isinstance(value, Backend):
        return StoreWitness(value)
    if isinstance(value, str | os.PathLike):
        text = os.fspath(value)
        if text.startswith("file:"):
            return FileWitness(text[5:].removeprefix("//"))
        if "://" in text:
            from ..backends import open_backend

            return StoreWitness(open_backend(text))
        raise ConfigurationError(
            f"witness={text!r}: use 'file:PATH', a store URL (e.g. 'sqlite:///witness.db'), a Backend, "
            "or an object with record() and latest()"
        )
    if callable(getattr(value, "record", None)) and callable(getattr(value, "latest", None)):
        forget = getattr(value, "forget", None)
        return CallbackWitness(value.record, value.latest, forget if callable(forget) else None)
    raise ConfigurationError(f"witness= cannot be a {type(value).__name__}")
