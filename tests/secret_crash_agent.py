"""An agent whose first step returns an API key, run as its own process (tests/test_secret_resume.py).

    python secret_crash_agent.py URL THREAD KILL_AT SETUP [ENCRYPT]

``setup()`` returns the key read from $AGENT_KEY; ``call(key, i)`` uses it in
steps 1..3 and records what it was handed. With KILL_AT >= 1 the process
SIGKILLs itself inside ``call`` number KILL_AT. SETUP names the secret setup
done before resuming: ``none``, ``from_env`` (pk.secrets.from_env), ``register``
(pk.secrets.register by value), ``vault:PATH`` (a FileVault with $VAULT_KEY).
ENCRYPT=1 opens the store with encryption (keys from $PERSISTKIT_ENCRYPTION_KEYS).
Prints one JSON line: what each call was handed and each call's result, or the error.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import persistkit as pk


def main() -> None:
    url, thread, kill_at, setup = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    encrypt = len(sys.argv) > 5 and sys.argv[5] == "1"
    # Environment secrets off: this agent checks detected keys named with the store's handle
    # key; tests/env_secret_agent.py covers a key that comes from the environment.
    pk.secrets.configure(environment=False)
    if setup == "from_env":
        pk.secrets.from_env("llm_key", "AGENT_KEY")
    elif setup == "register":
        pk.secrets.register("llm_key", os.environ["AGENT_KEY"])
    elif setup.startswith("vault:"):
        pk.secrets.configure(vault=pk.secrets.FileVault(setup[6:], key_env="VAULT_KEY"))
    handed: list[str] = []

    @pk.checkpointed
    def setup_key() -> str:
        return os.environ["AGENT_KEY"]

    @pk.checkpointed
    def call(api_key: str, i: int) -> str:
        handed.append(api_key)
        if i == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return f"answer {i} with a key of {len(api_key)} characters"

    store = pk.connect(url, encryption=bool(encrypt))  # False: plain, whatever the environment holds
    try:
        with pk.resume(thread, store=store) as run:
            key = setup_key()
            answers = [call(key, i) for i in (1, 2, 3)]
            state = run.state
            state["last"] = answers[-1]
    except pk.PersistkitError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
        return
    print(json.dumps({"handed": handed, "answers": answers, "ok": [h == os.environ["AGENT_KEY"] for h in handed]}))


if __name__ == "__main__":
    main()
