"""The package metadata and namespace a user sees."""

from __future__ import annotations

import tomllib
import types
from pathlib import Path

import persistkit as pk

ROOT = Path(__file__).resolve().parent.parent


def _pyproject() -> dict[str, object]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def test_license_is_an_spdx_expression_with_a_setuptools_that_reads_it() -> None:
    # A {text = ...} table makes setuptools >= 77 print a deprecation warning per build (PEP 639).
    data = _pyproject()
    project = data["project"]
    assert isinstance(project, dict) and project["license"] == "Apache-2.0"
    requires = data["build-system"]["requires"]  # type: ignore[index]
    assert any(r.replace(" ", "") in ("setuptools>=77", "setuptools>=77.0") for r in requires)


def test_every_package_of_the_source_tree_is_shipped() -> None:
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])  # type: ignore[index]
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "persistkit").rglob("__init__.py")
    }
    assert found <= listed, f"packages missing from pyproject.toml: {sorted(found - listed)}"


def test_public_namespace_holds_only_the_public_api() -> None:
    leaked = [
        name for name in dir(pk)
        if not name.startswith("_") and name not in pk.__all__
        and not isinstance(getattr(pk, name), types.ModuleType)  # subpackages: pk.backends, pk.testing
    ]
    assert leaked == [], f"names in persistkit's namespace that are not in __all__: {leaked}"
    for name in pk.__all__:
        assert getattr(pk, name) is not None
