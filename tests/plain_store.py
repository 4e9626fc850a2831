"""A third-party store: only the abstract primitives of ``persistkit.backends.Backend``.

No ``head_row``, no leases, no fencing, no ``namespaces``/``rewrite``: what a user writing
their own store starts with (docs/backends.md, "Writing your own store"). Its data is one
JSON file per store, read and rewritten whole under an exclusive ``flock`` for every
operation, so two processes opening the same URL see one store (``plainfile:///path``).
Slow by design and correct: the conformance suites run the long-run features on it.
"""

from __future__ import annotations

import base64
import builtins
import fcntl
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from persistkit import (
    BackendError,
    ConfigurationError,
    ConflictError,
    LeaseLostError,
    StoreClosedError,
)
from persistkit.backends import (
    Backend,
    CheckpointRow,
    Head,
    LeaseRecord,
    ThreadedAsync,
    register_backend,
)

SCHEME = "plainfile"
LEASED = "plainleased"


class PlainFileBackend(ThreadedAsync):
    """The bare protocol over one JSON file (see the module docstring)."""

    schemes = (SCHEME,)
    atomic_blobs = True
    supports_rewrite = False

    def __init__(self, path: str) -> None:
        self.path = path
        self.url = f"{SCHEME}://{path}"
        self._closed = False

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Backend:
        if options:
            raise ConfigurationError(f"{SCHEME}: unknown options {sorted(options)}")
        path = urlsplit(url).path
        if not path:
            raise ConfigurationError(f"{cls.schemes[0]}: the URL names no file: {url!r}")
        return cls(path)

    # -- the file ------------------------------------------------------------------

    @contextmanager
    def _data(self, write: bool = False) -> Iterator[dict[str, Any]]:
        if self._closed:
            raise StoreClosedError(f"{self.url} is closed")
        with open(self.path + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                try:
                    with open(self.path) as f:
                        data = json.load(f)
                except FileNotFoundError:
                    data = {"rows": {}, "heads": {}, "blobs": {}}
                yield data
                if write:
                    tmp = f"{self.path}.{os.getpid()}.tmp"
                    with open(tmp, "w") as f:
                        json.dump(data, f)
                    os.replace(tmp, self.path)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    @staticmethod
    def _tn(thread_id: str, namespace: str) -> str:
        return json.dumps([thread_id, namespace])

    # -- the primitives --------------------------------------------------------------

    def write(self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int) -> Head:
        return self._write(row, blobs, expected_version, None)

    def _write(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int, fence: int | None
    ) -> Head:
        key = self._tn(row.thread_id, row.namespace)
        with self._data(write=True) as data:
            if fence is not None:  # the token check and the write: one critical section
                lease = data.setdefault("leases", {}).get(key)
                if lease is None or lease[0] != fence:
                    raise LeaseLostError(
                        thread_id=row.thread_id, namespace=row.namespace, token=fence, found=lease[0] if lease else 0
                    )
            head = data["heads"].get(key)
            version = head[1] if head else 0
            if version != expected_version:
                raise ConflictError(
                    f"head of {row.thread_id!r} moved", thread_id=row.thread_id, namespace=row.namespace,
                    expected=expected_version, found=version, found_checkpoint=head[0] if head else None,
                )
            rows = data["rows"].setdefault(key, {})
            if row.checkpoint_id in rows:
                raise BackendError(f"checkpoint {row.checkpoint_id} exists")
            rows[row.checkpoint_id] = [row.parent_id, row.run_id, base64.b64encode(row.payload).decode()]
            self._put(data, row.thread_id, blobs)
            data["heads"][key] = [row.checkpoint_id, version + 1]
            return Head(row.checkpoint_id, version + 1)

    def _put(self, data: dict[str, Any], thread_id: str, blobs: Mapping[str, bytes]) -> None:
        mine = data["blobs"].setdefault(thread_id, {})
        for k, v in blobs.items():
            mine.setdefault(k, base64.b64encode(v).decode())

    def put_blobs(self, thread_id: str, blobs: Mapping[str, bytes]) -> None:
        with self._data(write=True) as data:
            self._put(data, thread_id, blobs)

    def head(self, thread_id: str, namespace: str) -> Head | None:
        with self._data() as data:
            head = data["heads"].get(self._tn(thread_id, namespace))
            return Head(head[0], head[1]) if head else None

    def get(self, thread_id: str, namespace: str, checkpoint_id: str) -> CheckpointRow | None:
        with self._data() as data:
            found = data["rows"].get(self._tn(thread_id, namespace), {}).get(checkpoint_id)
            return _row(thread_id, namespace, checkpoint_id, found) if found else None

    def list(
        self, thread_id: str, namespace: str, *, run_id: str | None = None, before: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[CheckpointRow]:
        with self._data() as data:
            rows = data["rows"].get(self._tn(thread_id, namespace), {})
            out: builtins.list[CheckpointRow] = []
            for cid in sorted(rows, reverse=True):
                if limit is not None and len(out) >= limit:
                    break
                if before is not None and cid >= before:
                    continue
                if run_id is not None and rows[cid][1] != run_id:
                    continue
                out.append(_row(thread_id, namespace, cid, rows[cid]))
            return out

    def get_blobs(self, thread_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        with self._data() as data:
            mine = data["blobs"].get(thread_id, {})
            return {k: base64.b64decode(mine[k]) for k in keys if k in mine}

    def scan_blobs(self, thread_id: str, start: str, stop: str) -> dict[str, bytes]:
        with self._data() as data:
            mine = data["blobs"].get(thread_id, {})
            return {k: base64.b64decode(v) for k, v in mine.items() if start <= k < stop}

    def threads(
        self, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[str]:
        with self._data() as data:
            ids = sorted({json.loads(k)[0] for k in data["heads"]})
        ids = [t for t in ids if t.startswith(prefix) and (after is None or t > after)]
        return ids[:limit] if limit is not None else ids

    def delete_thread(self, thread_id: str) -> bool:
        with self._data(write=True) as data:
            found = False
            for table in ("rows", "heads"):
                for key in [k for k in data[table] if json.loads(k)[0] == thread_id]:
                    del data[table][key]
                    found = True
            found = data["blobs"].pop(thread_id, None) is not None or found
            return found

    def close(self) -> None:
        self._closed = True


class PlainFileLeasedBackend(PlainFileBackend):
    """The same store with the lease primitives (``lease_get``/``lease_swap``/``lease_list``/
    ``write_fenced``): what a third-party store adds for leases, turns and fencing
    (``plainleased:///path``)."""

    schemes = (LEASED,)

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.url = f"{LEASED}://{path}"

    def lease_get(self, thread_id: str, namespace: str) -> LeaseRecord | None:
        with self._data() as data:
            found = data.get("leases", {}).get(self._tn(thread_id, namespace))
            return LeaseRecord(found[0], base64.b64decode(found[1]), found[2]) if found else None

    def lease_swap(self, thread_id: str, namespace: str, expected: int, token: int, data: bytes) -> bool:
        key = self._tn(thread_id, namespace)
        with self._data(write=True) as stored:
            leases = stored.setdefault("leases", {})
            version = leases[key][2] if key in leases else 0
            if version != expected:
                return False
            leases[key] = [token, base64.b64encode(data).decode(), version + 1]
            return True

    def lease_list(self, *, prefix: str = "") -> builtins.list[tuple[str, str, LeaseRecord]]:
        with self._data() as data:
            out = []
            for key, (token, raw, version) in sorted(data.get("leases", {}).items()):
                thread_id, namespace = json.loads(key)
                if thread_id.startswith(prefix):
                    out.append((thread_id, namespace, LeaseRecord(token, base64.b64decode(raw), version)))
            return out

    def write_fenced(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int, fence: int
    ) -> Head:
        return self._write(row, blobs, expected_version, fence)


def _row(thread_id: str, namespace: str, cid: str, found: builtins.list[Any]) -> CheckpointRow:
    return CheckpointRow(thread_id, namespace, cid, found[0], found[1], base64.b64decode(found[2]))


register_backend(SCHEME, PlainFileBackend)
register_backend(LEASED, PlainFileLeasedBackend)
