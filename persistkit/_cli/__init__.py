"""The ``persistkit`` command line: inspect and manage stores.

One module per group of verbs, each adding its subcommands to one argparse
parser (so help, usage and argument errors are generated), all printing
through :class:`~persistkit._cli._output.Output`:

* ``_threads``: ``threads``, ``history``, ``state``, ``delete``
* ``_schema``: ``migrate``
* ``_dynamodb``: ``dynamodb create-table``
* ``_keys``: ``keygen``, ``rotate-keys``, ``verify``
* ``_leases``: ``leases``, ``abandon``, ``cancel``
* ``_limits``: ``limits`` (shared rate limits)
* ``_suspend``: ``answer``, ``pending``, ``due``
* ``_replay``: ``replay-check``
* ``_outbox``: ``drain-outbox``
* ``_prune``: ``prune`` (retention)
* ``_timeline``: ``timeline`` (a thread's runs as one HTML page)
* ``_inspect``: ``show``, ``diff``, ``fork``
* ``_transfer``: ``export``, ``import``

Exit status: 0 ok; 1 an error, ``migrate --check`` found the schema behind,
or ``verify`` found a broken record, or
``replay-check`` found a run that would stop; 2 a usage error (argparse's, or a thread id,
run id or namespace argument that cannot be one); 3 not found (no store
at the URL, or no such thread or checkpoint), the same for every verb.
A reader that goes away (``persistkit threads | head -1``) ends a read verb
(``threads``, ``history``, ``state``, ``show``, ``diff``) quietly with 0, as its
output was wanted only in part; any other verb with 1, as its work may be cut
short (``export`` to stdout included: a cut export is not one).

argparse, not a CLI library: the standard library keeps ``persistkit`` free of a
dependency for a command of a few dozen flags, and gives usage, help and exit
status 2 for usage errors as they are documented here.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from .._errors import ConfigurationError, NotFoundError, PersistkitError, StoreOptionsError
from ..engine._store import check_namespace, check_thread_id
from ..secrets._redact import scrub
from . import (
    _dynamodb,
    _inspect,
    _keys,
    _leases,
    _limits,
    _outbox,
    _prune,
    _replay,
    _schema,
    _suspend,
    _threads,
    _timeline,
    _transfer,
)
from ._output import Output

__all__ = ["EXIT_NOT_FOUND", "main", "parser"]

EXIT_NOT_FOUND = 3
_READ_VERBS = frozenset({"threads", "history", "state", "show", "diff"})  # a closed pipe ends them with 0


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", help="the store's URL (default: $PERSISTKIT_URL, else "
                        "sqlite:///.persistkit/persistkit.db); its password is never printed")
    p = argparse.ArgumentParser(
        prog="persistkit",
        description="Inspect and manage persistkit stores. Every verb but `migrate`, `import`, "
        "`dynamodb create-table` and `keygen` opens an existing store and never creates one.",
        epilog="Encrypted or integrity-protected stores: set $PERSISTKIT_ENCRYPTION_KEYS / "
        "$PERSISTKIT_INTEGRITY_KEYS (every verb opens the store with them), or add "
        "?encryption=true&integrity=true to the URL. Exit status: 0 ok, 1 error (or migrate --check: behind; verify: a broken record), "
        "2 usage error, 3 no such store, thread or checkpoint. A closed pipe on stdout "
        "(`| head`) ends threads, history, state, show and diff with 0, other verbs with 1.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="VERB", parser_class=_VerbParser)
    groups = (_threads, _inspect, _transfer, _schema, _dynamodb, _keys, _leases, _limits, _suspend, _replay, _outbox,
              _prune, _timeline)
    for group in groups:
        group.add_parsers(sub, common)
    for verb in sub.choices.values():
        verb.set_defaults(parser=verb)  # for errors a verb finds after parsing (parser.error)
    return p


class _VerbParser(argparse.ArgumentParser):
    """A verb's parser: its options may stand between its positionals
    (``persistkit show THREAD --url URL CKPT``), as argparse's intermixed parsing allows;
    plain parsing would take THREAD alone and call CKPT an unrecognized argument."""

    _inner = False

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self._inner:  # parse_known_intermixed_args calls back here for each of its two passes
            return super().parse_known_args(args, namespace)
        self._inner = True
        try:
            return super().parse_known_intermixed_args(args, namespace)
        finally:
            self._inner = False


def main(argv: list[str] | None = None) -> int:
    ns, unknown = parser().parse_known_args(argv)
    if unknown:
        # argparse would report them with the top-level usage; they belong to the verb
        ns.parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    _check_ids(ns)
    out = Output(as_json=getattr(ns, "json", False))
    try:
        code: int = ns.func(ns, out)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # The reader went away (`persistkit history t | head`): stop quietly, and keep
        # Python from reporting the flush at exit (the recipe of the signal module's docs).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0 if ns.command in _READ_VERBS else 1
    except NotFoundError as exc:
        print(f"persistkit: {type(exc).__name__}: {scrub(str(exc))}", file=sys.stderr)
        return EXIT_NOT_FOUND
    except StoreOptionsError as exc:
        hint = _BLOBS_HINT if exc.option == "blobs" else _KEYS_HINT
        print(f"persistkit: {type(exc).__name__}: {scrub(str(exc))}. {hint}", file=sys.stderr)
        return 1
    except PersistkitError as exc:
        print(f"persistkit: {type(exc).__name__}: {scrub(str(exc))}", file=sys.stderr)
        return 1


def _check_ids(ns: argparse.Namespace) -> None:
    """Thread ids, run ids and the namespace given as arguments are checked before any store
    opens: a bad one is a usage error (exit 2, with the verb's usage), like argparse's own."""
    given: list[tuple[str, str]] = [(v, "thread_id") for v in getattr(ns, "threads", None) or () if "://" not in v]
    thread, run = getattr(ns, "thread", None), getattr(ns, "run", None)
    if isinstance(thread, str) and "://" not in thread:
        given.append((thread, "thread_id"))
    if isinstance(run, str):
        given.append((run, "run_id"))
    try:
        for value, what in given:
            check_thread_id(value, what)
        if isinstance(getattr(ns, "namespace", None), str):
            check_namespace(ns.namespace)
    except ConfigurationError as exc:
        ns.parser.error(scrub(str(exc)))


_BLOBS_HINT = (
    "From the command line: add ?blobs=<the blob store's URL, percent-encoded> to --url "
    "(e.g. --url 'sqlite:///main.db?blobs=sqlite%3A%2F%2F%2Fblobs.db'), with the keys in "
    "$PERSISTKIT_ENCRYPTION_KEYS / $PERSISTKIT_INTEGRITY_KEYS as the store needs them"
)
_KEYS_HINT = (
    "From the command line: set $PERSISTKIT_ENCRYPTION_KEYS and/or $PERSISTKIT_INTEGRITY_KEYS "
    "(every verb then opens the store with those keys), or add ?encryption=true&integrity=true "
    "(or =env:VAR / =file:PATH) to --url"
)
