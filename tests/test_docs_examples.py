"""What the README and the demo print is what a reader can follow; a one-call block takes store=."""

from __future__ import annotations

import ast
import asyncio
import base64
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import persistkit as pk

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PERSISTKIT_URL"}
    env["PYTHONPATH"] = str(ROOT)
    return env


def test_readme_quickstart_prints_no_unexplained_none(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"## Quickstart\s+```python\n(.*?)```", readme, re.S)
    assert code is not None
    out = subprocess.run([sys.executable, "-c", code.group(1)], cwd=tmp_path, capture_output=True, text=True,
                         env=_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    assert "None" not in out.stdout
    lines = out.stdout.splitlines()
    assert lines[1:] == ["step 0/0 call_llm", "step 0/1 call_llm", "step 0 agent", "end  completed"]


def test_demo_step_numbers_agree_with_history_positions(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py")], cwd=tmp_path,
                         capture_output=True, text=True, env=_env(), timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    shown = re.findall(r"step\s+(\d+) \(pos\s+(\d+)\)", out.stdout)
    assert len(shown) == 21  # the step that died in run 1, then the 20 steps of run 2
    assert all(int(pos) == int(n) - 1 for n, pos in shown)
    history = out.stdout.split("History of thread", 1)[1]
    positions = {int(p) for p in re.findall(r"\bstep\s+(\d+)\s+\w+\s+completed", history)}
    assert positions == set(range(20)) and "pos counts from 0" in history


@pk.checkpointed
def add_one(x: int) -> int:
    return x + 1


@pk.checkpointed
async def add_two(x: int) -> int:
    return x + 2


@pk.checkpointed
def takes_store(x: int, store: str) -> str:
    return f"{x}:{store}"


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_one_call_block_runs_in_the_store_given(local_store: pk.Store, kind: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERSISTKIT_URL", f"sqlite:///{tmp_path}/default.db")
    tid = f"one-call-{kind}"
    if kind == "sync":
        assert add_one(1, thread_id=tid, store=local_store) == 2
    else:
        assert asyncio.run(add_two(1, thread_id=tid, store=local_store)) == 3
    steps = [cp.step for cp in local_store.history(tid) if cp.kind == "step"]
    assert steps == [("add_one" if kind == "sync" else "add_two")]
    assert not (tmp_path / "default.db").exists()  # the default store was not used


def test_a_step_with_its_own_store_parameter_receives_it(local_store: pk.Store) -> None:
    with pk.resume("own-store", store=local_store):
        assert takes_store(1, store="mine") == "1:mine"
    assert takes_store(2, store="x") == "2:x"  # outside a block: a plain call


# -- every ```python block of README.md and docs/**/*.md ---------------------------------------
#
# The blocks of a page run as written, in order, in one new process in a fresh directory
# (tests/doc_page.py): a later block uses what an earlier one of its page defined, as a reader
# pasting them one by one would. A block that needs a service says so on the line before its
# fence, in a comment the rendered page does not show:
#     <!-- run: postgres -->      $DATABASE_URL: a PostgreSQL schema of this page's own
#     <!-- run: redis -->         $REDIS_URL: a Redis key prefix of this page's own
#     <!-- run: aws -->           $AWS_ENDPOINT_URL: this worker's moto server (S3, DynamoDB),
#                                 with the bucket "bucket" and test credentials
#     <!-- run: keys -->          test keys in $PERSISTKIT_ENCRYPTION_KEYS, $PERSISTKIT_INTEGRITY_KEYS,
#                                 $PK_VAULT_KEY and a fake $OPENAI_API_KEY
# (several: <!-- run: postgres, keys -->), set for that block only. A block that cannot run at
# all (it needs a second process, a real model) is a fragment: its first line is
#     # fragment: see examples/<file>.py (why it cannot run)     (or a test file under tests/)
# naming a complete file that covers it: the file must use every persistkit name the block
# uses (names imported from persistkit*, pk.<attr> chains, keyword arguments of those calls).
# An example is run by tests/test_examples.py; a test file by the suite itself. A page's blocks
# after a fragment still run; there are at most MAX_FRAGMENTS fragments in all.

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# Also an indented fence (a block inside a list item): its code is dedented.
FENCE = re.compile(r"^([ \t]*)```[ \t]*(python3?|py)[ \t]*\n(.*?)^\1```[ \t]*$", re.S | re.M)
FRAGMENT = re.compile(r"#\s*fragment:\s*see\s+(\S+)\s*(.*)")
RUN = re.compile(r"<!--\s*run:\s*(.*?)\s*-->")
NEEDS = ("postgres", "redis", "aws", "keys")
MAX_FRAGMENTS = 5
HOW_TO_FIX = ("Make it run as written, after the blocks above it on its page (imports, definitions; "
              "'<!-- run: postgres -->' on the line before the fence for a service), or, if it cannot "
              "run at all, make its first line '# fragment: see examples/<file>.py (why it cannot run)' "
              "naming a complete file that does what it shows")


class Block:
    def __init__(self, doc: Path, line: int, code: str, needs: tuple[str, ...]) -> None:
        self.doc, self.line, self.code, self.needs = doc, line, code, needs
        first = code.lstrip("\n").splitlines()[0] if code.strip() else ""
        marker = FRAGMENT.match(first.strip())
        self.covered_by = marker.group(1) if marker else None
        self.why = marker.group(2).strip(" ()—-:") if marker else ""
        self.where = f"{doc.relative_to(ROOT)}:{line} (the ```python block starting '{first.strip()[:60]}')"


def python_blocks() -> list[Block]:
    blocks = []
    for doc in DOCS:
        text = doc.read_text()
        for m in FENCE.finditer(text):
            before = text[: m.start()].rstrip().rsplit("\n", 1)[-1].strip()
            run = RUN.fullmatch(before)
            needs = tuple(n.strip() for n in run.group(1).split(",") if n.strip()) if run else ()
            blocks.append(Block(doc, text[: m.start()].count("\n") + 1, textwrap.dedent(m.group(3)), needs))
    return blocks


BLOCKS = python_blocks()
PAGES = sorted({b.doc for b in BLOCKS if b.covered_by is None})


def _parse(block: Block) -> ast.Module:
    try:
        tree = compile(block.code, block.where, "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except SyntaxError as exc:
        pytest.fail(f"{block.where} is not valid Python (line {exc.lineno} of the block: {exc.msg}). {HOW_TO_FIX}",
                    pytrace=False)
    assert isinstance(tree, ast.Module)
    return tree


def persistkit_names(tree: ast.Module) -> set[str]:
    """What a block shows: names imported from persistkit, ``pk.…`` attributes and the keywords
    of those calls, and the methods it calls on any object (``store.verify()``)."""
    names: set[str] = set()
    ours: set[str] = {"pk"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0].startswith("persistkit"):
            for alias in node.names:
                names.add(alias.name)
                ours.add(alias.asname or alias.name)

    def rooted(node: ast.expr) -> list[str] | None:
        chain: list[str] = []
        while isinstance(node, ast.Attribute):
            chain.append(node.attr)
            node = node.value
        return chain if isinstance(node, ast.Name) and node.id in ours else None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (chain := rooted(node)) is not None:
            names.update(chain)
        if isinstance(node, ast.Call) and rooted(node.func) is not None:
            names.update(k.arg for k in node.keywords if k.arg)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            names.add(node.func.attr)
    return names


def _service_env(need: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                 page_env: dict[str, dict[str, str]]) -> dict[str, str]:
    """What a ``<!-- run: need -->`` block gets: the same for every block of a page
    (``page_env``), apart from every other page's and every other xdist worker's (conftest's
    make_url: a PostgreSQL schema, a Redis prefix of the page's own; this worker's moto server)."""
    from conftest import make_url

    if need in page_env:
        return page_env[need]
    if need in ("postgres", "redis"):
        env = {"DATABASE_URL" if need == "postgres" else "REDIS_URL":
               make_url(need, request, tmp_path_factory, isolated=True)}
    elif need == "aws":
        endpoint = request.getfixturevalue("s3_endpoint")
        import boto3

        client = boto3.client("s3", endpoint_url=endpoint)
        if "bucket" not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
            client.create_bucket(Bucket="bucket")
        env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1"}
    elif need == "keys":
        def key() -> str:  # as `python -m persistkit keygen` prints it: key_id:base64
            return base64.b64encode(os.urandom(32)).decode()

        env = {"PERSISTKIT_ENCRYPTION_KEYS": f"docs:{key()}", "PERSISTKIT_INTEGRITY_KEYS": f"docs:{key()}",
               "PK_VAULT_KEY": key(), "OPENAI_API_KEY": "sk-test-" + "x" * 40}
    else:
        raise AssertionError(need)
    page_env[need] = env
    return env


@pytest.mark.parametrize("block", BLOCKS, ids=[b.where.split(" ")[0] for b in BLOCKS])
def test_every_python_block_parses_and_says_what_it_needs(block: Block) -> None:
    tree = _parse(block)
    unknown = [n for n in block.needs if n not in NEEDS]
    if unknown:
        pytest.fail(f"{block.where}: '<!-- run: ... -->' names {unknown}; a block may need {list(NEEDS)}",
                    pytrace=False)
    if block.covered_by is None:
        return
    if not block.why:
        pytest.fail(f"{block.where} is a fragment that does not say why it cannot run: "
                    f"'# fragment: see {block.covered_by} (why)'. {HOW_TO_FIX}", pytrace=False)
    target = ROOT / block.covered_by
    if not (target.is_file() and target.suffix == ".py"):
        pytest.fail(f"{block.where} says it is covered by {block.covered_by}, which is not a file of the "
                    f"repository. {HOW_TO_FIX}", pytrace=False)
    rel = target.relative_to(ROOT).parts
    if not (rel[0] == "examples" or (rel[0] == "tests" and target.name.startswith("test_"))):
        pytest.fail(f"{block.where}: a fragment is covered by an example (examples/*.py, run by "
                    f"tests/test_examples.py) or a test module (tests/**/test_*.py, run by the suite), not by "
                    f"{block.covered_by}", pytrace=False)
    text = target.read_text()
    missing = sorted(n for n in persistkit_names(tree) if not re.search(rf"\b{re.escape(n)}\b", text))
    if missing:
        pytest.fail(f"{block.where} is a fragment covered by {block.covered_by}, which never uses {missing}: "
                    "cover them there, or point the fragment at a file that does", pytrace=False)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_page_runs_its_blocks_in_order(page: Path, tmp_path: Path, request: pytest.FixtureRequest,
                                             tmp_path_factory: pytest.TempPathFactory) -> None:
    page_env: dict[str, dict[str, str]] = {}
    blocks = [b for b in BLOCKS if b.doc == page and b.covered_by is None]
    todo = [{"where": b.where, "code": b.code,
             "env": {k: v for n in b.needs if n in NEEDS for k, v in _service_env(n, request, tmp_path_factory,
                                                                                  page_env).items()}}
            for b in blocks]
    spec = tmp_path / "blocks.json"
    spec.write_text(json.dumps(todo))
    work = tmp_path / "work"
    work.mkdir()
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "adapters")])
    # offline, as tests/adapters runs CrewAI: no telemetry, no trace upload
    env.update(CREWAI_DISABLE_TELEMETRY="true", CREWAI_TRACING_ENABLED="false", OTEL_SDK_DISABLED="true")
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "doc_page.py"), str(spec)], cwd=work,
                         capture_output=True, text=True, env=env, timeout=600)
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines() or ["(no output)"]
        failed = lines[-1].removeprefix("FAILED BLOCK: ") if lines[-1].startswith("FAILED BLOCK: ") else page.name
        error = lines[-2] if len(lines) > 1 else lines[-1]
        pytest.fail(f"{failed} does not run as written after the blocks above it: {error}. {HOW_TO_FIX}\n"
                    f"--- stderr ---\n{out.stderr[-4000:]}", pytrace=False)


def test_at_most_a_few_fragments() -> None:
    fragments = [b.where.split(" ")[0] for b in BLOCKS if b.covered_by is not None]
    assert len(fragments) <= MAX_FRAGMENTS, (
        f"{len(fragments)} doc blocks are fragments (at most {MAX_FRAGMENTS}): {fragments}. {HOW_TO_FIX}")


def test_the_fragment_convention_is_what_the_docs_use() -> None:
    # A block that looks like a fragment marker but does not match it would silently run as code;
    # a run marker that is not on the line right before a fence would silently give nothing.
    for block in BLOCKS:
        first = block.code.lstrip("\n").splitlines()[0] if block.code.strip() else ""
        if "fragment" in first.lower():
            assert block.covered_by is not None, (
                f"{block.where}: its first line mentions a fragment but is not '# fragment: see <file> (why)'")
    for doc in DOCS:
        text = doc.read_text()
        for m in re.finditer(rf"^[ \t]*{RUN.pattern}[ \t]*$", text, re.M):  # a marker on a line of its own
            after = text[m.end():].lstrip("\n ")
            assert after.startswith("```"), (
                f"{doc.relative_to(ROOT)}:{text[: m.start()].count(chr(10)) + 1}: '{m.group(0)}' is not on the line "
                "right before a ```python fence, so it applies to no block")
