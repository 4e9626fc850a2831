"""Verbs for keys: ``keygen``, ``rotate-keys``, ``verify``.

Key material is never printed except by ``keygen``, whose one job is to print
a fresh key, and never read from the command line (only ``env:VAR`` or
``file:PATH`` sources).
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import os
from typing import Any

from ..backends import split_connect_options
from ._open import open_store, resolve_url
from ._output import Output, dumps

__all__ = ["add_parsers"]


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    r = sub.add_parser("rotate-keys", parents=[common], help="re-seal records under the active encryption key",
                       description="Re-seal an encrypted store's records under its active key, in "
                       "resumable batches. Keys from --keys or $PERSISTKIT_ENCRYPTION_KEYS.")
    r.add_argument("legacy_url", nargs="?", help=argparse.SUPPRESS)
    r.add_argument("--thread", help="only this thread (default: every thread)")
    r.add_argument("--keys", default=None, help="env:VAR or file:PATH (default: $PERSISTKIT_ENCRYPTION_KEYS)")
    r.add_argument("--batch-size", type=int, default=100)
    r.add_argument("--after", help="continue a store-wide rotation after this thread id")
    r.add_argument("--encrypt-plaintext", action="store_true", help="also seal plaintext records (migration)")
    r.add_argument("--json", action="store_true", help="print the report as JSON")
    r.set_defaults(func=_rotate)

    k = sub.add_parser("keygen", help="print a fresh encryption key entry 'key_id:base64'")
    k.add_argument("--id", dest="key_id", help="key id (default: derived from the key)")
    k.add_argument("--json", action="store_true", help='print {"id": ..., "entry": "key_id:base64"}')
    k.set_defaults(func=_keygen)

    v = sub.add_parser("verify", parents=[common],
                       help="check every record's integrity tag and chain; list every broken one",
                       description="Check every record's integrity tag and chain; exit 1 when any is broken.")
    v.add_argument("legacy_url", nargs="?", help=argparse.SUPPRESS)
    v.add_argument("--thread", help="only this thread")
    v.add_argument("--key", default=None, help="integrity key source: file:PATH or env:VAR "
                   "(default: $PERSISTKIT_INTEGRITY_KEYS)")
    v.add_argument("--keys", default=None, help="encryption keys of an encrypted store: env:VAR or file:PATH "
                   "(default: $PERSISTKIT_ENCRYPTION_KEYS when set)")
    v.add_argument("--witness", default=None, help="the witness the store was written with: file:PATH or a store URL")
    v.add_argument("--json", action="store_true", help="print the report as JSON (every problem a record)")
    v.set_defaults(func=_verify)


def _sources(*given: str | None) -> None:
    for source in given:
        if source is not None and not source.startswith(("env:", "file:")):
            raise SystemExit("--key/--keys take env:VAR or file:PATH (never key text on the command line)")


def _rotate(ns: argparse.Namespace, out: Output) -> int:
    _sources(ns.keys)
    url = resolve_url(ns.url or ns.legacy_url)
    keys: Any = ns.keys if ns.keys else (None if "encryption" in split_connect_options(url)[1] else True)
    with open_store(url, encryption=keys,
                    accept_plaintext=ns.encrypt_plaintext) as store:
        report = store.rotate_keys(
            ns.thread, batch_size=ns.batch_size, after=ns.after, encrypt_plaintext=ns.encrypt_plaintext
        )
    if out.as_json:
        out.value(dataclasses.asdict(report))
    else:
        out.line(str(report))
    return 0


def _keygen(ns: argparse.Namespace, out: Output) -> int:
    from ..wrappers._keys import KeyRing, fingerprint_id, generate_key

    key = generate_key("encryption")
    kid = ns.key_id or fingerprint_id(key)
    KeyRing({kid: key})  # validates the id
    entry = f"{kid}:{base64.b64encode(key).decode('ascii')}"
    out.line(dumps({"id": kid, "entry": entry}) if out.as_json else entry)
    return 0


def _verify(ns: argparse.Namespace, out: Output) -> int:
    _sources(ns.key, ns.keys)
    url = resolve_url(ns.url or ns.legacy_url)
    in_url = split_connect_options(url)[1]  # key sources the URL names apply unless a flag is given
    key: Any = ns.key if ns.key is not None else (None if "integrity" in in_url else True)
    encryption: Any = ns.keys if ns.keys is not None else (
        True if "encryption" not in in_url and os.environ.get("PERSISTKIT_ENCRYPTION_KEYS") else None
    )
    with open_store(url, integrity=key, witness=ns.witness, encryption=encryption) as store:
        report = store.verify(ns.thread)
    if out.as_json:
        out.value({"ok": report.ok, "threads": report.threads, "records": report.records, "blobs": report.blobs,
                   "problems": [{"thread": p.thread_id, "namespace": p.namespace, "checkpoint": p.checkpoint_id,
                                 "blob": p.blob_key, "reason": p.reason} for p in report.problems]})
    else:
        out.line(str(report))
    return 0 if report.ok else 1
