"""A store writer must not run code in the reader's process (issue #33).

Someone who can write the store (integrity off, the default) rewrites the names a record
holds — an after-commit effect, a compensation, a result's or a state field's class, a
recorded error's class — to reach code through an allowlisted module (``forged_app``, an
agent's module: its steps make it trusted). Every attempt of the corpus below is refused
through every path that resolves a name (a drain, a resume, a rollback, ``get_state``,
the replay of a result and of an error, the CLI's drain), on every store, and nothing
runs: the marker file that ``os.system``, ``subprocess``, ``exec`` and every function and
constructor of ``forged_evil`` would write never appears.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import forged_app as app
import pytest

import persistkit as pk
from persistkit._cli import main
from persistkit.backends import CheckpointRow
from persistkit.backends._protocol import new_row

#: Names of functions a forged effect or compensation may try: through the app's globals,
#: through persistkit, the standard library directly, a module attribute that is a module,
#: a re-export, a class attribute, the helper module itself, an unregistered tool of the
#: app, a class and a module.
FUNCTIONS = [
    "forged_app:os.system",
    "forged_app:pk._ids.os.system",
    "forged_app:subprocess.getoutput",
    "os:system",
    "posix:system",
    "subprocess:getoutput",
    "builtins:exec",
    "builtins:eval",
    "persistkit:_ids.os.system",
    "persistkit._ids:os.system",
    "forged_app:evilmod.evil",
    "forged_app:evil_reexport",
    "forged_app:Outer.run",
    "forged_evil:evil",
    "forged_app:run_tool",
    "forged_app:Reexported",
    "forged_app:os",
]

#: Names of classes a forged result or state value may try (tag ``dc`` or ``m``).
CLASSES = [
    ("dc", "forged_app:Reexported"),
    ("dc", "forged_app:evilmod.Boom"),
    ("dc", "forged_app:Outer.Inner"),
    ("dc", "forged_evil:Boom"),
    ("m", "forged_app:evilmod.BoomModel"),
    ("m", "forged_evil:BoomModel"),
    ("dc", "forged_app:pk._ids.os.system"),
    ("dc", "subprocess:Popen"),
    ("dc", "builtins:type"),
]

#: Names of exception classes a forged recorded error may try.
ERRORS = [
    "forged_evil:BoomError",
    "forged_app:evilmod.BoomError",
    "forged_app:ReexportedError",
    "forged_app:Outer.InnerError",
]


class _Crash(pk.RetryableError):
    """Leaves the run unfinished (no end record), as a crash would."""


@pytest.fixture
def marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "PWNED"
    monkeypatch.setenv("PK_FORGED_MARKER", str(path))
    yield path
    assert not path.exists(), f"a forged record ran code: {path.read_text()!r}"


def _args_for(name: str, marker: Path) -> list[Any]:
    if name.startswith("builtins:"):
        return [f"open({str(marker)!r}, 'a').write('exec')"]
    return [f"echo forged >> {marker}"]


def _forge(store: pk.Store, thread: str, edit: Callable[[dict[str, Any]], bool]) -> None:
    """Rewrite the stored records of ``thread`` as a store writer would (``edit`` changes a
    body in place and says whether it did), through the store's own primitives."""
    rows: list[CheckpointRow] = []
    for row in store.backend.list(thread, ""):
        body = store.codec.unpack_tree(row.payload)
        if edit(body):
            payload = store.codec.pack_stored(body)
            rows.append(new_row(row.thread_id, row.namespace, row.checkpoint_id, row.parent_id, row.run_id, payload))
    assert rows, f"nothing to forge in {thread}"
    store.backend.rewrite(thread, rows, {})


def _retag(node: Any, tag: str, name: str, *, only: str) -> bool:
    """Point every tagged node of class ``only`` at class ``name`` (tag ``tag``)."""
    changed = False
    if isinstance(node, dict):
        if node.get("__pk__") in ("dc", "m", "ex") and node.get("c") == only:
            node["__pk__"], node["c"] = tag, name
            changed = True
        for v in node.values():
            changed |= _retag(v, tag, name, only=only)
    elif isinstance(node, list):
        for v in node:
            changed |= _retag(v, tag, name, only=only)
    return changed


def _prefix() -> str:
    return f"forged-{uuid.uuid4().hex[:8]}-"


def test_forged_effects_are_refused_by_drain_resume_and_cli(
    store: pk.Store, store_url: str, marker: Path
) -> None:
    prefix = _prefix()
    threads = {}
    for i, name in enumerate(FUNCTIONS):
        t = threads[name] = f"{prefix}{i}"
        with pytest.raises(pk.EffectError), pk.resume(t, store=store, run_id="r"):
            app.effect_step(i)

        def edit(body: dict[str, Any], name: str = name) -> bool:
            for entry in body.get("ac") or ():
                entry["f"], entry["a"] = name, {"a": _args_for(name, marker), "k": {}}
            return bool(body.get("ac"))

        _forge(store, t, edit)
    report = store.drain_outbox(prefix=prefix)
    assert not report.done
    stuck = {e.function: e.error or "" for e in [*report.failed, *report.pending]}
    assert set(stuck) == set(FUNCTIONS), report
    for name, why in stuck.items():
        assert name in why and "allow_modules=['os" not in why, why
    for name in FUNCTIONS[:4] + FUNCTIONS[-3:]:
        with pytest.raises(pk.EffectError, match="stays pending"), pk.resume(threads[name], store=store, run_id="r"):
            app.effect_step(0)
    if not store_url.startswith("memory"):  # the CLI opens the URL in its own store
        assert main(["drain-outbox", "--url", store_url, "--import", "forged_app", "--prefix", prefix]) != 0


def test_forged_compensations_are_refused_by_the_rollback(store: pk.Store, marker: Path) -> None:
    prefix = _prefix()
    for i, name in enumerate(FUNCTIONS[:: 2 if store.backend.__class__.__name__ != "MemoryBackend" else 1]):
        t = f"{prefix}{i}"
        with pytest.raises(_Crash), pk.resume(t, store=store, run_id="r"):
            app.booking(i)
            raise _Crash("the process dies")

        def edit(body: dict[str, Any], name: str = name) -> bool:
            for entry in body.get("cp") or ():
                entry["f"], entry["a"] = name, _args_for(name, marker)
            return bool(body.get("cp"))

        _forge(store, t, edit)
        with pytest.raises(pk.PersistkitError) as refused, pk.resume(t, store=store, run_id="r"):
            app.booking(i)
            app.failing(i)
        assert name in str(refused.value) or any(name in str(c) for c in _chain(refused.value)), refused.value
        assert i not in app.UNDONE


def _chain(exc: BaseException) -> Iterator[BaseException]:
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
        yield exc


def test_forged_classes_are_refused_by_get_state_and_replay(store: pk.Store, marker: Path) -> None:
    prefix = _prefix()
    for i, (tag, name) in enumerate(CLASSES):
        t = f"{prefix}{i}"
        with pytest.raises(_Crash), pk.resume(t, store=store, run_id="r", state=app.St) as run:
            run.state.item = app.booking(1)
            app.booking(2)
            raise _Crash("the process dies")
        _forge(store, t, lambda body, tag=tag, name=name: _retag(body, tag, name, only="forged_app:Safe"))
        with pytest.raises(pk.SerializationError, match=r"not registered|may be forged|no class"):
            store.get_state(t)
        with pytest.raises(pk.SerializationError), pk.resume(t, store=store, run_id="r", state=app.St):
            app.booking(1)


def test_forged_error_classes_replay_as_data(store: pk.Store, marker: Path) -> None:
    prefix = _prefix()
    for i, name in zip(itertools.count(), ERRORS, strict=False):
        t = f"{prefix}{i}"
        with pytest.raises(_Crash), pk.resume(t, store=store, run_id="r"):
            with pytest.raises(app.AppError):
                app.failing(i)
            raise _Crash("the process dies")
        _forge(store, t, lambda body, name=name: _retag(body, "ex", name, only="forged_app:AppError"))
        with pytest.raises(_Crash), pk.resume(t, store=store, run_id="r"):
            with pytest.raises(pk.StepFailedError) as replayed:
                app.failing(i)
            assert replayed.value.type_name == name.replace(":", ".")
            assert replayed.value.original_message == f"declined {i}"
            raise _Crash("again")


def test_no_refusal_advises_allowlisting_the_standard_library() -> None:
    with pytest.raises(pk.ConfigurationError, match="standard library cannot be allowlisted"):
        pk.connect("memory://", allow_modules=["os"])
    with pytest.raises(pk.ConfigurationError, match="standard library cannot be allowlisted"):
        pk.connect("memory://?allow_modules=subprocess")


@pytest.mark.parametrize("url", ["memory://", "sqlite"])
def test_with_integrity_a_forged_name_is_refused_before_it_is_read(url: str, tmp_path: Path, marker: Path) -> None:
    """integrity= is what protects against a store writer: the same forgery written to the
    store under the integrity layer (the writer has no key) fails its tag before any name
    in it is read."""
    url = f"sqlite:///{tmp_path}/sealed.db" if url == "sqlite" else f"memory://sealed-{uuid.uuid4().hex[:8]}"
    store = pk.connect(url, integrity=bytes(range(32)))
    t = f"{_prefix()}sealed"
    with pytest.raises(pk.EffectError), pk.resume(t, store=store, run_id="r"):
        app.effect_step(1)
    inner = store.backend.inner  # what someone who writes the store, but holds no key, reaches
    rows = []
    for row in inner.list(t, ""):
        text = row.payload.replace(b"forged_app:failing_effect", b"forged_app:os.system    ")
        if text != row.payload:
            rows.append(new_row(row.thread_id, row.namespace, row.checkpoint_id, row.parent_id, row.run_id, text))
    assert rows, "the effect's name is not in the sealed bytes"
    inner.rewrite(t, rows, {})
    with pytest.raises(pk.IntegrityError):
        store.drain_outbox(prefix=t)
    with pytest.raises(pk.IntegrityError), pk.resume(t, store=store, run_id="r"):
        app.effect_step(1)
    store.close()


def _set_answer_type(node: Any, name: str) -> bool:
    changed = False
    if isinstance(node, dict):
        if node.get("ty") == "forged_app:Safe":
            node["ty"] = name
            changed = True
        for v in node.values():
            changed |= _set_answer_type(v, name)
    elif isinstance(node, list):
        for v in node:
            changed |= _set_answer_type(v, name)
    return changed


def test_forged_answer_types_are_refused_by_answer_and_the_cli(
    store: pk.Store, store_url: str, marker: Path
) -> None:
    prefix = _prefix()
    for i, (_, name) in enumerate(CLASSES):
        t = f"{prefix}{i}"
        with pk.resume(t, store=store, run_id="r") as run:
            app.ask(i)
        assert run.status == "suspended"
        _forge(store, t, lambda body, name=name: _set_answer_type(body, name))
        with pytest.raises(pk.PersistkitError, match=r"may be forged|cannot resolve|not one this process"):
            store.answer(t, {"x": 1})
        if i < 3 and not store_url.startswith("memory"):
            assert main(["answer", "--url", store_url, "--allow-module", "forged_app", t, '{"x": 1}']) != 0
