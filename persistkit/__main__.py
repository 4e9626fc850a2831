"""Command line: inspect and manage stores.

    persistkit threads [URL] [--prefix P] [--limit N]
    persistkit history [URL] THREAD [--limit N] [--run RUN_ID]
    persistkit state [URL] THREAD [--checkpoint ID]
    persistkit delete [URL] THREAD
    persistkit migrate [URL] [--check]
    persistkit rotate-keys [URL] [--thread T] [--keys SOURCE] [--batch-size N] [--after T] [--encrypt-plaintext]
    persistkit keygen [--id KEY_ID]
    persistkit verify [URL] [--thread T] [--key SOURCE] [--keys SOURCE] [--witness W]

Encryption keys come from $PERSISTKIT_ENCRYPTION_KEYS, or ``--keys env:VAR`` /
``--keys file:PATH``; integrity keys from $PERSISTKIT_INTEGRITY_KEYS or
``--key``. Key material is never printed except by ``keygen``, whose one job
is to print a fresh key.

URL defaults to $PERSISTKIT_URL, else the SQLite file under ./.persistkit/.
Exit status: 0 ok, 1 error (or, with ``migrate --check``, the schema is behind;
with ``verify``, any broken record). ``verify`` reads the integrity key from
$PERSISTKIT_INTEGRITY_KEYS unless ``--key`` names another source.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ._errors import PersistkitError
from ._secrets import scrub
from ._store import Store, connect


def _store(url: str | None) -> Store:
    return connect(url) if url else connect()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="persistkit", description="Inspect and manage persistkit stores.")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("threads", help="list thread ids")
    t.add_argument("url", nargs="?")
    t.add_argument("--prefix", default="")
    t.add_argument("--limit", type=int)
    h = sub.add_parser("history", help="a thread's checkpoints, newest first")
    h.add_argument("args", nargs="+", metavar="[URL] THREAD")
    h.add_argument("--limit", type=int)
    h.add_argument("--run")
    s = sub.add_parser("state", help="a thread's state (as JSON) at its head or a checkpoint")
    s.add_argument("args", nargs="+", metavar="[URL] THREAD")
    s.add_argument("--checkpoint")
    d = sub.add_parser("delete", help="delete a thread and all its data")
    d.add_argument("args", nargs="+", metavar="[URL] THREAD")
    m = sub.add_parser("migrate", help="create or upgrade the store's own tables")
    m.add_argument("url", nargs="?")
    m.add_argument("--check", action="store_true", help="only report whether the schema is behind")
    r = sub.add_parser("rotate-keys", help="re-seal records under the active encryption key")
    r.add_argument("url", nargs="?")
    r.add_argument("--thread", help="only this thread (default: every thread)")
    r.add_argument("--keys", default=None, help="env:VAR or file:PATH (default: $PERSISTKIT_ENCRYPTION_KEYS)")
    r.add_argument("--batch-size", type=int, default=100)
    r.add_argument("--after", help="continue a store-wide rotation after this thread id")
    r.add_argument("--encrypt-plaintext", action="store_true", help="also seal plaintext records (migration)")
    k = sub.add_parser("keygen", help="print a fresh encryption key entry 'key_id:base64'")
    k.add_argument("--id", dest="key_id", help="key id (default: derived from the key)")
    v = sub.add_parser("verify", help="check every record's integrity tag and chain; list every broken one")
    v.add_argument("url", nargs="?")
    v.add_argument("--thread", help="only this thread")
    v.add_argument("--key", default=None, help="integrity key source: file:PATH or env:VAR "
                   "(default: $PERSISTKIT_INTEGRITY_KEYS)")
    v.add_argument("--keys", default=None, help="encryption keys of an encrypted store: env:VAR or file:PATH "
                   "(default: $PERSISTKIT_ENCRYPTION_KEYS when set)")
    v.add_argument("--witness", default=None, help="the witness the store was written with: file:PATH or a store URL")
    return p


def _rotate(ns: argparse.Namespace) -> int:
    keys: Any = ns.keys if ns.keys else True
    if isinstance(keys, str) and not keys.startswith(("env:", "file:")):
        raise SystemExit("--keys takes env:VAR or file:PATH (never key text on the command line)")
    store = connect(ns.url, encryption=keys, accept_plaintext=ns.encrypt_plaintext) if ns.url else connect(
        encryption=keys, accept_plaintext=ns.encrypt_plaintext
    )
    with store:
        report = store.rotate_keys(
            ns.thread, batch_size=ns.batch_size, after=ns.after, encrypt_plaintext=ns.encrypt_plaintext
        )
    print(report)
    return 0


def _keygen(key_id: str | None) -> int:
    import base64

    from ._keys import KeyRing, fingerprint_id, generate_key

    key = generate_key("encryption")
    kid = key_id or fingerprint_id(key)
    KeyRing({kid: key})  # validates the id
    print(f"{kid}:{base64.b64encode(key).decode('ascii')}")
    return 0


def _verify(ns: argparse.Namespace) -> int:
    import os

    from ._store import DEFAULT_URL

    url = ns.url or os.environ.get("PERSISTKIT_URL") or DEFAULT_URL
    key: Any = ns.key if ns.key is not None else True
    for source in (ns.key, ns.keys):
        if source is not None and not source.startswith(("env:", "file:")):
            raise SystemExit("--key/--keys take env:VAR or file:PATH (never key text on the command line)")
    encryption: Any = ns.keys if ns.keys is not None else (True if os.environ.get("PERSISTKIT_ENCRYPTION_KEYS") else None)
    with connect(url, integrity=key, witness=ns.witness, encryption=encryption) as store:
        report = store.verify(ns.thread)
    print(report)
    return 0 if report.ok else 1


def _url_thread(args: list[str]) -> tuple[str | None, str]:
    if len(args) == 1:
        return None, args[0]
    if len(args) == 2:
        return args[0], args[1]
    raise SystemExit("expected [URL] THREAD")


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    try:
        return _run(ns)
    except PersistkitError as exc:
        print(f"persistkit: {type(exc).__name__}: {scrub(str(exc))}", file=sys.stderr)
        return 1


def _run(ns: argparse.Namespace) -> int:
    if ns.command == "threads":
        with _store(ns.url) as store:
            for tid in store.threads(prefix=ns.prefix, limit=ns.limit):
                print(tid)
        return 0
    if ns.command == "rotate-keys":
        return _rotate(ns)
    if ns.command == "keygen":
        return _keygen(ns.key_id)
    if ns.command == "migrate":
        import os

        from ._store import DEFAULT_URL
        from .backends import backend_class

        url = ns.url or os.environ.get("PERSISTKIT_URL") or DEFAULT_URL
        cls = backend_class(url)
        if not hasattr(cls, "migrate"):
            print(f"{scrub(url)}: this store creates and upgrades its tables when it opens; nothing to do")
            return 0
        backend = cls.from_url(url, migrate=False)  # open without migrating, then decide
        try:
            status = backend.migrate(check=ns.check)  # type: ignore[attr-defined]
        finally:
            backend.close()
        print(status)
        return 1 if ns.check and status.behind else 0
    if ns.command == "verify":
        return _verify(ns)
    url, thread = _url_thread(ns.args)
    with _store(url) as store:
        store.codec.reveal = False  # print handles, never the secrets they stand for
        if ns.command == "history":
            print(f"{'checkpoint':<24}  {'run':<12}  {'kind':<6}  {'pos':<7}  {'step':<24}  {'status':<9}  {'run status':<10}  created")
            for cp in store.history(thread, limit=ns.limit, run_id=ns.run):
                print(
                    f"{cp.checkpoint_id:<24}  {(cp.run_id or '')[:12]:<12}  {cp.kind:<6}  {cp.position or '':<7}  "
                    f"{(cp.step or '')[-24:]:<24}  {cp.status or '':<9}  {cp.run_status or '':<10}  "
                    f"{cp.created_at.isoformat(timespec='milliseconds')}"
                )
        elif ns.command == "state":
            state: Any = store.get_state(thread, ns.checkpoint)
            print(json.dumps(state, indent=2, default=repr, ensure_ascii=False))
        elif ns.command == "delete":
            print("deleted" if store.delete_thread(thread) else "no such thread")
    return 0


if __name__ == "__main__":
    sys.exit(main())
