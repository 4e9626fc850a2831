"""Every API an error message (or docstring) suggests exists.

The suggestions are read from the package's source, not from a list: every
string literal and f-string of ``persistkit/`` and ``adapters/`` is scanned
for calls spelled ``pk.x(``, ``persistkit.x(``, ``pk.secrets.x(``,
``store.x(``, ``run.x(`` or ``backend.x(`` and for command lines spelled
`` `persistkit VERB``; each must name something real.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import types
from pathlib import Path
from typing import Any

import pytest

import persistkit
from persistkit._cli import parser
from persistkit.backends import Backend

ROOT = Path(__file__).resolve().parent.parent
CALL = re.compile(r"(?<![\w.])((?:pk|persistkit|store|run|backend)(?:\.[A-Za-z_]\w*)+)\(")
VERB = re.compile(r"`(?:python -m )?persistkit ([a-z][a-z-]*)")
ROOTS: dict[str, Any] = {"pk": persistkit, "persistkit": persistkit, "store": persistkit.Store,
                         "run": persistkit.Run, "backend": Backend}


def _texts() -> list[tuple[str, str]]:
    """(where, text) of every string literal; an f-string's fields become a NUL."""
    out = []
    for path in sorted([*(ROOT / "persistkit").rglob("*.py"), *(ROOT / "adapters").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "\0" for v in node.values)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            else:
                continue
            out.append((f"{path.relative_to(ROOT)}:{node.lineno}", text))
    return out


TEXTS = _texts()
# run.state.<field>...: the user's own state in an example, not an API.
CALLS = sorted({
    (m.group(1), where) for where, text in TEXTS for m in CALL.finditer(text) if not m.group(1).startswith("run.state.")
})
VERBS = sorted({(m.group(1), where) for where, text in TEXTS for m in VERB.finditer(text)})


def test_the_scan_finds_suggestions() -> None:
    # The scan itself works: known suggestions are found in the source.
    names = {name for name, _ in CALLS}
    assert {"pk.connect", "persistkit.register", "store.history"} <= names
    assert {"migrate"} <= {verb for verb, _ in VERBS}


def _returned_class(prop: property) -> Any:
    """The class a property of a persistkit class is annotated to return (``store.limits``:
    the annotation names a class its module imports only for type checkers)."""
    name = prop.fget.__annotations__.get("return") if prop.fget is not None else None
    if not isinstance(name, str):
        return name
    module = importlib.import_module(prop.fget.__module__)
    source = Path(module.__file__ or "").read_text()
    for where in re.findall(rf"from (\.*[\w.]*) import [^\n]*\b{name}\b", source):
        found = getattr(importlib.import_module(importlib.util.resolve_name(where, module.__package__)), name, None)
        if isinstance(found, type):
            return found
    return getattr(module, name, None)


@pytest.mark.parametrize(("name", "where"), CALLS, ids=[f"{n}@{w}" for n, w in CALLS])
def test_every_suggested_call_exists(name: str, where: str) -> None:
    root, *attrs = name.split(".")
    obj = ROOTS[root]
    for i, attr in enumerate(attrs):
        try:
            obj = getattr(obj, attr)
            if isinstance(obj, property):  # store.limits: the class the property returns
                obj = _returned_class(obj)
        except AttributeError:
            try:  # a submodule no earlier test of this process imported (the quick tier, an xdist worker)
                obj = importlib.import_module(f"{obj.__name__}.{attr}") if isinstance(obj, types.ModuleType) else None
            except ImportError:
                obj = None
            if obj is None:
                pytest.fail(f"{where} suggests {name}(...), but {'.'.join([root, *attrs[:i + 1]])} does not exist")
    assert callable(obj), f"{where} suggests calling {name}, which is not callable"


def test_every_suggested_command_exists() -> None:
    verbs = set(parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    missing = [(verb, where) for verb, where in VERBS if verb not in verbs]
    assert not missing, f"messages suggest CLI verbs that do not exist: {missing}"


def test_unregistered_class_message_names_real_options() -> None:
    # The message that once suggested persistkit.register_module (which never existed).
    from persistkit.codec._serde import Serializer

    tree = {"__pk__": "dc", "c": "somewhere_else:Thing", "v": {}}
    with pytest.raises(persistkit.SerializationError) as info:
        Serializer().decode(tree)
    text = str(info.value)
    assert "register_module" not in text and "allow_modules=" in text and "persistkit.register(" in text
