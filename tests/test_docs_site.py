"""The docs site (mkdocs.yml) builds with ``--strict``, and its reference lists every public name.

``--strict`` with mkdocs.yml's ``validation`` fails on a link to a missing page or anchor, a
page left out of the nav, and a reference (``::: module``) mkdocstrings cannot resolve. The
site needs the ``docs`` extra, which the ``test`` extra pulls in: without mkdocs the build is
skipped and says so (a failure where ``PERSISTKIT_REQUIRE`` names ``docs``).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REQUIRED = {s.strip() for s in os.environ.get("PERSISTKIT_REQUIRE", "").split(",") if s.strip()}
#: Each reference page and the packages whose ``__all__`` it must list.
REFERENCE = {
    "reference/persistkit": ["persistkit", "persistkit.secrets"],
    "reference/testing": ["persistkit.testing"],
    "reference/adapters": ["persistkit_langgraph", "persistkit_openai_agents", "persistkit_crewai",
                           "persistkit_pydantic_ai", "persistkit_pytest"],
}


def _public(module_name: str) -> list[tuple[str, object]]:
    module = importlib.import_module(module_name)
    return [(name, getattr(module, name)) for name in module.__all__]


@pytest.mark.parametrize("module_name", [m for ms in REFERENCE.values() for m in ms])
def test_every_public_name_has_a_docstring(module_name: str) -> None:
    # The reference is generated from docstrings: a name without one is a heading with nothing under it.
    if module_name != "persistkit" and importlib.util.find_spec(module_name.split(".")[0]) is None:
        pytest.skip(f"{module_name} is not importable here")
    try:
        public = _public(module_name)
    except ImportError as exc:  # an adapter whose framework extra is not installed
        pytest.skip(f"{module_name} needs its extra: {exc}")
    bare = []
    for name, obj in public:
        if inspect.isclass(obj):
            doc = obj.__dict__.get("__doc__")
        elif callable(obj) or inspect.ismodule(obj):
            doc = getattr(obj, "__doc__", None)
        else:
            continue  # a constant: documented where the module's docstring names it
        if not (doc or "").strip():
            bare.append(name)
    assert bare == [], f"public names of {module_name} without a docstring: {bare}"


@pytest.mark.slow
def test_the_site_builds_strict_and_its_reference_lists_every_public_name(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        if "docs" in REQUIRED:
            pytest.fail("mkdocs is not installed: pip install -e '.[docs]' (the test extra includes it)")
        pytest.skip("mkdocs is not installed: pip install -e '.[docs]' (the test extra includes it)")
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                         cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, f"mkdocs build --strict failed:\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    for page, modules in REFERENCE.items():
        html = (site / page / "index.html").read_text()
        anchors = set(re.findall(r'id="([\w.]+)"', html))
        for module_name in modules:
            missing = [name for name, _ in _public(module_name) if f"{module_name}.{name}" not in anchors]
            assert missing == [], f"{page} does not list {module_name}'s public names {missing}"
    for record in (ROOT / "docs" / "decisions").glob("[0-9]*.md"):  # listed by scripts/mkdocs_hooks.py
        assert (site / "decisions" / record.stem / "index.html").exists(), f"{record.name} is not on the site"


#: The calls whose every parameter the reference shows in a Parameters table (the docstring's
#: ``:param name:`` fields, which mkdocstrings renders).
PARAMETERS = {"persistkit.resume": "__init__", "persistkit.checkpointed": None, "persistkit.connect": None}


@pytest.mark.parametrize("name", sorted(PARAMETERS))
def test_every_parameter_of_the_main_calls_is_in_the_reference(name: str) -> None:
    obj = importlib.import_module("persistkit")
    obj = getattr(obj, name.rsplit(".", 1)[1])
    sig = inspect.signature(getattr(obj, PARAMETERS[name]) if PARAMETERS[name] else obj)
    wanted = [p for p in sig.parameters if p != "self"]
    documented = re.findall(r"^\s*:param (\w+):", obj.__doc__ or "", re.M)
    assert documented == wanted, (
        f"{name}: its docstring's ':param name:' fields are {documented}, its parameters {wanted}: "
        "one field per parameter, in the signature's order (the reference's Parameters table)")


#: Each store's heading on docs/reference/stores.md and where its option names are.
STORE_OPTIONS = {
    "## `pk.connect()`'s own options": ("persistkit.backends", "CONNECT_OPTIONS"),
    "## SQLite": ("persistkit.backends.sqlite", "_OPTIONS"),
    "## PostgreSQL": ("persistkit.backends.postgres", "OPTIONS"),
    "## Redis": ("persistkit.backends.redis", "_OPTIONS"),
    "## S3": ("persistkit.backends.s3", "_OPTIONS"),
    "## DynamoDB": ("persistkit.backends.dynamodb", "_OPTIONS"),
}


@pytest.mark.parametrize("heading", sorted(STORE_OPTIONS))
def test_every_url_option_of_every_store_is_in_the_reference(heading: str) -> None:
    module_name, attr = STORE_OPTIONS[heading]
    try:
        options = getattr(importlib.import_module(module_name), attr)
    except ImportError as exc:  # a store whose driver (extra) is not installed
        pytest.skip(f"{module_name} needs its extra: {exc}")
    page = (ROOT / "docs" / "reference" / "stores.md").read_text()
    assert heading in page, f"docs/reference/stores.md has no section '{heading}'"
    section = page.split(heading, 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"^\| `(\w+)` \|", section, re.M))
    assert rows == set(options), (
        f"docs/reference/stores.md, {heading}: the table lists {sorted(rows)}, the store takes "
        f"{sorted(options)} ({module_name}.{attr}): one row per option")


@pytest.mark.parametrize(("page", "limit"), [("README.md", 10_000), ("docs/architecture.md", 30_000)])
def test_the_first_reads_stay_short(page: str, limit: int) -> None:
    # The README fits two screens; the design page is read in 20 minutes (#36). A decision goes
    # to docs/decisions/NNNN-title.md, a detail to its topic's page.
    size = len((ROOT / page).read_bytes())
    assert size <= limit, f"{page} is {size} bytes, over {limit}: move detail to the pages it links to"
