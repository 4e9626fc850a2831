"""The built-in features of the combination matrix (see ``combination``).

Each entry says how the agent uses the feature in code version 1 (which writes
and crashes) and version 2 (which resumes), and what must hold of the finished
thread. A new feature is one more ``register_feature(Feature(...))``.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Annotated, Any

from pydantic import BaseModel, create_model

import persistkit as pk

from .combination import MARKER, Case, Feature, Stored, register_feature

__all__ = ["ENCRYPTION_KEY", "INTEGRITY_KEY", "SECRET", "MigEntry"]

ENCRYPTION_KEY = bytes(range(40, 72))
INTEGRITY_KEY = bytes(range(90, 122))
#: A registered secret, shaped like a real API key; it must never be stored.
SECRET = "sk-proj-MtrxQ81xLmN0pQrS2tUvW3xYz4AbC5dEf6GhI7jK"
SECRET_NAME = "matrix_api_key"


# -- state migration v1 -> v2 ---------------------------------------------------------


class MigEntry(BaseModel):
    i: int
    text: str


def _mig_fields(version: int) -> dict[str, tuple[Any, Any]]:
    if version == 1:
        return {"mig_turns": (int, 0), "mig_log": (Annotated[list[str], pk.append], [])}
    return {"mig_count": (int, 0), "mig_log": (Annotated[list[MigEntry], pk.append], [])}


def _mig_step(case: Case, version: int, i: int, state: Any, handed: Any) -> None:
    if version == 1:
        state.mig_turns += 1
        state.mig_log.append(f"t{i}")
    else:
        state.mig_count += 1
        state.mig_log.append(MigEntry(i=i, text=f"t{i}"))


def _mig_migrate(data: dict[str, Any]) -> None:
    # a rename and a type change (list of str -> list of models): what version 2 would have made
    data["mig_count"] = data.pop("mig_turns")
    data["mig_log"] = [MigEntry(i=int(text[1:]), text=text) for text in data["mig_log"]]


def _mig_check(case: Case, store: pk.Store, data: Stored, final: dict[str, Any]) -> list[str]:
    want = case.steps + 1  # the later run's step too
    got = (final.get("mig_count"), [e["i"] for e in final.get("mig_log", [])])
    return [] if got == (want, list(range(want))) else [f"migrated fields after a later run: {got}"]


register_feature(
    Feature(
        name="migration",
        doc="the state schema changes between the crash and the resume (rename + type change, @pk.migration)",
        fields=_mig_fields,
        bumps_state=True,
        changes_schema=True,
        migrate=_mig_migrate,
        step=_mig_step,
        check=_mig_check,
    )
)


# -- secrets: registered, and from the process environment ---------------------------------
#
# Step 0 fetches the key; each later step is handed the previous step's result: the
# key alone and an email body quoting it (a longer text, as tool-call arguments are).
# What a live step is handed must be the key itself, never its handle as text; the
# state keeps a log line quoting the key. No stored byte may hold the value.


def _secret_feature(name: str, doc: str, value: str, handle: str, setup: Any) -> Feature:
    log, evidence = f"{name}_log", f"{name}-handed.log"

    def step(case: Case, version: int, i: int, state: Any, handed: Any) -> dict[str, str]:
        if handed is None:
            key = value if i == 0 else "<nothing handed>"
        else:
            key = handed["key"]
            ok = (
                handed["key"] == value
                and value in handed["body"]
                and "$CRED{" not in handed["body"]
            )
            with open(case.path(evidence), "a") as f:
                f.write(("ok" if ok else f"step {i} BAD {str(handed)[:80]!r}") + "\n")
        getattr(state, log).append(f"tool call {i} with Authorization: Bearer {key} for user 7")
        return {"key": key, "body": f"Dear user, step {i} used the key {key}; keep it safe."}

    def summary(v: Any) -> Any:
        if isinstance(v, dict) and v.get("key") == value and value in v.get("body", ""):
            return "<the key and a text quoting it>"
        return repr(v)

    def check(case: Case, store: pk.Store, data: Stored, final: dict[str, Any]) -> list[str]:
        problems = []
        where = data.contains(value)
        if where:
            problems.append(f"the secret's value is in the stored bytes ({', '.join(where)})")
        if not data.contains(handle):
            problems.append(
                f"no {handle} in the opened records: the secret was not stored as that handle"
            )
        p = case.path(evidence)
        bad = [h for h in (p.read_text().splitlines() if p.exists() else []) if h != "ok"]
        if bad:
            problems.append(f"a live step was handed something else than the key: {bad}")
        if len(final.get(log, [])) != case.steps + 1:
            problems.append(f"{log} holds {len(final.get(log, []))} lines after a later run")
        return problems

    return Feature(
        name=name,
        doc=doc,
        setup=setup,
        fields=lambda version: {log: (Annotated[list[str], pk.append], [])},
        step=step,
        summary=summary,
        check=check,
    )


register_feature(
    _secret_feature(
        "secret",
        "a registered secret (pk.secrets.register) returned by a step, handed on, quoted in state",
        SECRET,
        "$CRED{" + SECRET_NAME + "}",
        lambda case, version: pk.secrets.register(SECRET_NAME, SECRET),
    )
)

#: An environment variable a deployment sets in every process; nothing registers it.
ENV_VARIABLE = "PK_MATRIX_OPENAI_API_KEY"
ENV_SECRET = "sk-proj-EnvQ81xLmN0pQrS2tUvW3xYz4AbC5dEf6GhI7mTrx"


def _env_setup(case: Case, version: int) -> None:
    os.environ[ENV_VARIABLE] = ENV_SECRET  # what the process manager gives each process


register_feature(
    _secret_feature(
        "env_secret",
        "a key from the process environment, zero configuration, resolved in the new process",
        ENV_SECRET,
        "$CRED{env:" + ENV_VARIABLE + "}",
        _env_setup,
    )
)


# -- offload of big values ---------------------------------------------------------------

BLOB_THRESHOLD = 2048


def _big(i: int) -> str:
    """6 KB of incompressible text, the same in every process."""
    chunks, seed = [], f"matrix-big-{i}".encode()
    for _ in range(144):
        seed = hashlib.sha256(seed).digest()
        chunks.append(seed)
    return base64.b64encode(b"".join(chunks)).decode()


def _offload_step(case: Case, version: int, i: int, state: Any, handed: Any) -> str:
    value = _big(i)
    state.big.append(value)
    return value


def _offload_check(case: Case, store: pk.Store, data: Stored, final: dict[str, Any]) -> list[str]:
    problems = []
    if not data.offloaded:
        problems.append(f"the blob store {case.blob_url} holds nothing for the thread")
    if not any(p.startswith(b"\x00PKREF1:") for p in data.primary):
        problems.append("the primary store holds no pointer to an offloaded value")
    if final.get("big") != [_big(i) for i in range(case.steps + 1)]:
        problems.append("the big values read back differ from those written")
    return problems


register_feature(
    Feature(
        name="offload",
        doc="values over blob_threshold go to a second store (blobs=); step results and appended items",
        connect=lambda case: {"blobs": case.blob_url, "blob_threshold": BLOB_THRESHOLD},
        fields=lambda version: {"big": (Annotated[list[str], pk.append], [])},
        step=_offload_step,
        summary=lambda v: (
            hashlib.sha256(v.encode()).hexdigest()[:16] if isinstance(v, str) else repr(v)
        ),
        check=_offload_check,
    )
)


# -- encryption ----------------------------------------------------------------------------


def _encryption_check(
    case: Case, store: pk.Store, data: Stored, final: dict[str, Any]
) -> list[str]:
    problems = []
    if any(MARKER.encode() in p for p in data.raw):
        problems.append("plaintext of the state is in the stored bytes")
    clear = [
        p[:12] for p in data.raw if not (p.startswith(b"\xe1") or p.startswith(b"\x00PKREF1:"))
    ]
    if clear:
        problems.append(
            f"{len(clear)} stored record(s) are neither ciphertext nor a pointer: {clear[:3]}"
        )
    extra = {
        k: v
        for f in case.feature_objects()
        if f.name != "encryption"
        for k, v in f.connect(case).items()
    }
    extra.pop("integrity", None)
    extra.pop("witness", None)
    with pk.connect(case.url, **extra) as keyless:
        try:
            keyless.get_state(case.thread)
        except pk.PersistkitError:
            pass
        else:
            problems.append("a store opened without the encryption key read the state")
    return problems


register_feature(
    Feature(
        name="encryption",
        doc="every record sealed with AES-256-GCM (encryption=)",
        connect=lambda case: {"encryption": {"mx1": ENCRYPTION_KEY}},
        check=_encryption_check,
    )
)


# -- integrity -----------------------------------------------------------------------------


def _integrity_check(case: Case, store: pk.Store, data: Stored, final: dict[str, Any]) -> list[str]:
    report = store.verify(case.thread)
    return [] if report.ok else [f"verify: {[str(p) for p in report.problems]}"]


register_feature(
    Feature(
        name="integrity",
        doc="a keyed hash chain per thread and a file witness (integrity=, witness=)",
        connect=lambda case: {
            "integrity": {"mi1": INTEGRITY_KEY},
            "witness": f"file:{case.dir}/witness.log",
        },
        check=_integrity_check,
    )
)


# -- leases --------------------------------------------------------------------------------


def _lease_check(case: Case, store: pk.Store, data: Stored, final: dict[str, Any]) -> list[str]:
    leases = [le for le in store.leases(prefix=case.thread) if le.thread_id == case.thread]
    if len(leases) != 1:
        return [f"store.leases() shows {len(leases)} lease records for the thread"]
    le = leases[0]
    problems = []
    if le.held:
        problems.append(f"the lease is still held by {le.holder} after every run ended")
    # the crashed writer, the resume, the replay and the later run each took it
    if le.token < 4:
        problems.append(f"fencing token {le.token}: fewer than the 4 runs that took the lease")
    return problems


register_feature(
    Feature(
        name="leases",
        doc="every run takes the thread's lease, busy='reject': a dead writer's lease must be taken over at once",
        # A long TTL: the takeover must come from recognising the dead holder, not from expiry.
        resume=lambda case: {"busy": "reject", "lease_ttl": 120.0},
        check=_lease_check,
    )
)


# -- retention: a prune between the crash and the resume ---------------------------------
#
# The new process prunes the thread before it resumes, as a nightly job may run while a
# run waits to be resumed: keep one checkpoint, finished runs only their last. Everything
# of the crashed run is still needed, so nothing may go, and the resume must still be
# exactly once with every feature's bytes (lists, anchors under integrity, offloaded
# values) intact. It runs once per case (a marker file), only for a crashed case.


def _retention_setup(case: Case, version: int) -> None:
    marker = case.path("pruned.json")
    if version != 2 or case.crash_at is None or marker.exists():
        return
    from .combination import open_store

    with open_store(case) as store:
        if not store.history(case.thread):  # crashed before its first checkpoint: nothing to prune
            marker.write_text(json.dumps(pk.PruneReport(dry_run=False).as_dict()))
            return
        report = store.prune(
            pk.Retention(keep_last=1, final_only=True), thread_id=case.thread, progress=False
        )
    marker.write_text(json.dumps(report.as_dict()))


def _retention_check(case: Case, store: pk.Store, data: Stored, final: dict[str, Any]) -> list[str]:
    marker = case.path("pruned.json")
    if case.crash_at is None:
        return []
    if not marker.exists():
        return ["the prune before the resume did not run"]
    report = json.loads(marker.read_text())
    problems = []
    if report["checkpoints"] or report["threads_deleted"]:
        problems.append(f"the prune deleted what the crashed run needed: {report}")
    if report["skipped"] and not any(f.name == "leases" for f in case.feature_objects()):
        problems.append(f"the prune skipped the thread: {report['skipped']}")
    return problems


register_feature(
    Feature(
        name="retention",
        doc="store.prune(keep_last=1, final_only=True) in the new process before it resumes the crashed run",
        setup=_retention_setup,
        check=_retention_check,
    )
)


# -- spans: long list chains gathered into blobs ---------------------------------------------
#
# A long list's inline segments are gathered into a span blob every SPAN_SEGMENTS
# segments (state._tracker). At the real threshold (256) no case of the matrix is
# long enough, so this feature lowers it to 1 for its runs: every second checkpoint of
# each list writes a span, and crashes, replays, wrappers and prunes meet chains that
# mix rows and spans. Every checkpoint of the thread must then load whole.


@contextmanager
def _spans_every_two(case: Case) -> Iterator[None]:
    from persistkit.state import _tracker

    before = _tracker.SPAN_SEGMENTS
    _tracker.SPAN_SEGMENTS = 1
    try:
        yield
    finally:
        _tracker.SPAN_SEGMENTS = before


def _spans_check(case: Case, store: pk.Store, data: Stored, final: dict[str, Any]) -> list[str]:
    from persistkit.backends import open_backend

    direct = open_backend(case.url)
    try:
        spans = [
            k
            for k in direct.scan_blobs(case.thread, "s:", "s;")
            if k.startswith(("s:done:", "s:notes:"))
        ]
    finally:
        direct.close()
    problems = [] if spans or case.steps < 2 else ["no list was gathered into a span"]
    for cp in store.history(case.thread):
        state = store.get_state(case.thread, cp.checkpoint_id)
        done, notes = state.get("done", []), state.get("notes", [])
        if notes != [f"{MARKER} step {i}" for i in done]:
            problems.append(f"checkpoint {cp.checkpoint_id} loads done={done} with notes={notes}")
    return problems


register_feature(
    Feature(
        name="spans",
        doc="lists are gathered into span blobs every 2 segments (SPAN_SEGMENTS lowered to 1 for the runs)",
        around=_spans_every_two,
        check=_spans_check,
    )
)


# -- versioned value classes (pk.register(cls, version=2) + @pk.migration(cls, from_version=1)) --
#
# Each code version defines its own class under one stored name (this module's
# ``MatrixMsg`` / ``MatrixReply``), as two releases of an application would. A
# process defines only the version it runs (inline mode: version 1, then 2).


def _define(make: Any, version: int) -> None:
    """Define (once per process) and register the class of this code version."""
    make(version)


@cache
def msg_class(version: int) -> type[BaseModel]:
    """The nested message model: version 2 renames ``text`` to ``content`` and adds ``chars``."""
    if version == 1:
        cls = create_model("MatrixMsg", __module__=__name__, role=(str, ...), text=(str, ...))
        pk.register(cls)
    else:
        cls = create_model(
            "MatrixMsg", __module__=__name__, role=(str, ...), content=(str, ...), chars=(int, ...)
        )
        pk.register(cls, version=2)

        @pk.migration(cls, from_version=1)
        def msg_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
            data["content"] = data.pop("text")
            data["chars"] = len(data["content"])
            return data

    globals()["MatrixMsg"] = cls  # what a new process finds under the stored name
    return cls


def _nested_step(case: Case, version: int, i: int, state: Any, handed: Any) -> None:
    text = f"answer {i}"
    m = msg_class(version)
    state.msgs.append(
        m(role="assistant", text=text)
        if version == 1
        else m(role="assistant", content=text, chars=len(text))
    )


def _nested_check(case: Case, store: pk.Store, data: Stored, final: dict[str, Any]) -> list[str]:
    want = [
        {"role": "assistant", "content": f"answer {i}", "chars": len(f"answer {i}")}
        for i in range(case.steps + 1)
    ]
    return [] if final.get("msgs") == want else [f"messages after a later run: {final.get('msgs')}"]


register_feature(
    Feature(
        name="nested_migration",
        doc="state holds list[Msg]; Msg changes shape between the versions (class version + class migration)",
        setup=lambda case, version: _define(msg_class, version),
        fields=lambda version: {"msgs": (Annotated[list[msg_class(version)], pk.append], [])},  # type: ignore[misc]
        step=_nested_step,
        check=_nested_check,
        changes_schema=True,
    )
)


def _dataclass(name: str, fields: list[tuple[str, type]]) -> type:
    cls = dataclasses.make_dataclass(name, fields)  # module= only from Python 3.12
    cls.__module__ = __name__
    return cls


@cache
def reply_class(version: int) -> type:
    """A step's result dataclass: version 2 turns ``text`` into ``body`` + ``words``."""
    if version == 1:
        cls = _dataclass("MatrixReply", [("text", str)])
        pk.register(cls)
    else:
        cls = _dataclass("MatrixReply", [("body", str), ("words", int)])
        pk.register(cls, version=2)

        @pk.migration(cls, from_version=1)
        def reply_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
            data["body"] = data.pop("text")
            data["words"] = len(data["body"].split())
            return data

    globals()["MatrixReply"] = cls
    return cls


def _result_step(case: Case, version: int, i: int, state: Any, handed: Any) -> Any:
    # the previous step's recorded result, replayed (and migrated) or live, is handed in
    prev = "" if handed is None else _reply_summary(handed)
    state.replies.append(prev)
    text = f"reply {i} after {len(prev)} chars"
    cls = reply_class(version)
    return cls(text=text) if version == 1 else cls(body=text, words=len(text.split()))


def _reply_summary(value: Any) -> str:
    if hasattr(value, "body"):
        return f"{value.body} ({value.words} words)"
    if hasattr(value, "text"):
        return f"{value.text} ({len(value.text.split())} words)"
    return repr(value)


register_feature(
    Feature(
        name="result_migration",
        doc="steps return a dataclass that changes shape between the versions; replayed results are migrated",
        setup=lambda case, version: _define(reply_class, version),
        fields=lambda version: {"replies": (Annotated[list[str], pk.append], [])},
        step=_result_step,
        summary=_reply_summary,
        changes_schema=True,
    )
)


# -- runs that outlive a process: an after-commit effect and a compensation per step ---------
#
# Each step registers an effect (pk.after_commit) and the undo of its work (pk.compensate),
# both stored in the step's own record with an argument that is the registered secret when
# that feature is on (it must be stored as a handle and reach the effect as the value), else
# the plaintext marker (encryption must hide it there too). The runs never fail, so no undo
# may run. Each committed step's effect runs exactly once: the crash positions of the matrix
# (inside a step, after a step returned) are never between an effect and its done mark,
# which is written as soon as the step's effects ran.


def _long_value(case: Case) -> str:
    return SECRET if "secret" in case.features else MARKER


@pk.register
def matrix_effect(folder: str, i: int, value: str, *, idempotency_key: str) -> None:
    """The after-commit effect of step ``i`` (a module-level function: another process finds it)."""
    with open(os.path.join(folder, "effects-after-commit.log"), "a") as f:
        f.write(json.dumps({"i": i, "key": idempotency_key, "value": value}) + "\n")
        f.flush()
        os.fsync(f.fileno())


@pk.register
def matrix_undo(folder: str, i: int, value: str) -> None:
    """The undo of step ``i``: registered by every step, run by none (the runs do not fail)."""
    with open(os.path.join(folder, "undone.log"), "a") as f:
        f.write(f"{i}\n")


def _long_step(case: Case, version: int, i: int, state: Any, handed: Any) -> None:
    value = _long_value(case)
    pk.after_commit(matrix_effect, case.dir, i, value)
    pk.compensate(matrix_undo, case.dir, i, value)


def _long_check(case: Case, store: pk.Store, data: Stored, final: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    log = case.path("effects-after-commit.log")
    runs: dict[int, list[dict[str, Any]]] = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        entry = json.loads(line)
        runs.setdefault(entry["i"], []).append(entry)
    for i in range(case.steps + 1):  # the later run's step too
        got = runs.pop(i, [])
        if len(got) != 1:
            problems.append(f"the effect of step {i} ran {len(got)} times (want 1)")
        if len({e["key"] for e in got}) > 1:
            problems.append(
                f"the effect of step {i} ran with different idempotency keys: {[e['key'] for e in got]}"
            )
        if any(e["value"] != _long_value(case) for e in got):
            problems.append(
                f"the effect of step {i} was handed {[e['value'][:24] for e in got]}, not the value"
            )
    if runs:
        problems.append(f"effects of steps that never ran: {sorted(runs)}")
    if case.path("undone.log").exists():
        problems.append(
            f"compensations ran in runs that did not fail: {case.path('undone.log').read_text().split()}"
        )
    return problems


register_feature(
    Feature(
        name="long_runs",
        doc="each step registers an after-commit effect and a compensation whose argument is the secret (or the marker)",
        connect=lambda case: {"allow_modules": (__name__,)},
        step=_long_step,
        summary=lambda value: None,
        check=_long_check,
    )
)
