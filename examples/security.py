"""Secrets, encryption, integrity and verification on one store, end to end, offline.

    pip install 'persistkit[crypto]'      # encryption (AES-GCM) needs the cryptography package
    python examples/security.py

What the README's and docs/security.md's security blocks show, runnable: keys
come from the environment as a deployment would set them
(``python -m persistkit keygen`` prints an entry for
``$PERSISTKIT_ENCRYPTION_KEYS`` or ``$PERSISTKIT_INTEGRITY_KEYS``), a step
returns text holding an API key, the store (SQLite here; any URL works) holds
neither the key nor the text in the clear, ``store.verify()`` checks the hash
chain, and a store written before encryption was on is sealed in place.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import persistkit as pk


def keygen() -> str:
    """One key entry (``id:base64``), from the CLI."""
    out = subprocess.run([sys.executable, "-m", "persistkit", "keygen"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def main() -> None:
    workdir = Path(tempfile.mkdtemp(prefix="pk-security-"))
    # What a deployment puts in the environment (a secret manager, a systemd credential...).
    os.environ["PERSISTKIT_ENCRYPTION_KEYS"] = keygen()
    os.environ["PERSISTKIT_INTEGRITY_KEYS"] = keygen()
    os.environ["PK_VAULT_KEY"] = base64.b64encode(os.urandom(32)).decode()
    os.environ["OPENAI_API_KEY"] = api_key = "sk-proj-" + base64.b32encode(os.urandom(30)).decode().lower()

    pk.secrets.from_env("openai", "OPENAI_API_KEY")   # a key you know, read from the environment
    pk.secrets.configure(vault=pk.secrets.FileVault(workdir / "vault", key_env="PK_VAULT_KEY"))  # keys you cannot name

    url = f"sqlite:///{workdir}/agent.db"
    store = pk.connect(
        url,
        encryption=True,       # AES-256-GCM per record, keys from $PERSISTKIT_ENCRYPTION_KEYS
        integrity=True,        # keyed hash chain, keys from $PERSISTKIT_INTEGRITY_KEYS
        witness=f"file:{workdir}/witness.log",  # catches a store rolled back to an older copy
    )

    @pk.checkpointed
    def call_tool(city: str) -> str:
        return f"booked {city} with header Authorization: Bearer {api_key}"

    with pk.resume("thread-42", store=store):
        answer = call_tool("Lisbon")
    raw = (workdir / "agent.db").read_bytes()
    assert api_key.encode() not in raw and b"Lisbon" not in raw, "the store holds a key or clear text"
    print("stored: neither the key nor the text in the clear")

    report = store.verify()            # or store.verify("thread-42")
    print(report)                      # every broken record, not only the first
    assert report.ok
    store.close()

    # A store written before encryption was on: read it, then seal its records in place.
    old_url = f"sqlite:///{workdir}/old.db"
    with pk.connect(old_url) as plain:
        plain.update_state("old-thread", {"note": "written in the clear"})
    store = pk.connect(old_url, encryption=True, accept_plaintext=True)   # reads old plaintext records
    print(store.rotate_keys(encrypt_plaintext=True))                      # seals them in place
    store.close()
    with pk.connect(old_url, encryption=True) as sealed:                  # accept_plaintext dropped
        assert sealed.get_state("old-thread")["note"] == "written in the clear"
    assert b"written in the clear" not in (workdir / "old.db").read_bytes()
    print("old store sealed; the answer was:", answer.replace(api_key, "<key>"))


if __name__ == "__main__":
    main()
