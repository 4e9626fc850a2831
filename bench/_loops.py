"""The workload "the step returns the message and the caller appends it", written two ways.

``bench_sqlite.py`` and ``bench_cpu.py`` run both in one process: as a
script's top-level code (:class:`Script`: its state class, its step and the
loop are module globals of ``__main__``, as ``python agent.py`` runs them) and
as a function of an imported module (:func:`in_function`, with the class and
the step defined in this module). The names differ as they do in real code
(``produce`` in the script, ``make_message`` here; schema names default to
the class's qualified name): issue 13 reported ~130 µs a step for the first
and ~205 µs for the second, because an underscore in a name made the secret
scan run its token patterns over every record holding "gh". What a step
costs must not depend on how the loop is written, so the benchmarks print
the ratio.
"""

from __future__ import annotations

from typing import Any

import persistkit as pk

STEPS = 200
TEXTS: list[str] = []  # the messages the steps return (set by the benchmark)


class AgentNotes(pk.State):
    messages: list[str] = []


@pk.checkpointed
def make_message(i: int) -> str:
    """Stands for a model call: returns the i-th 1 KB message."""
    return TEXTS[i]


def in_function(store: pk.Store, thread: str) -> None:
    with pk.resume(thread, store=store, state=AgentNotes) as run:
        for i in range(STEPS):
            msg = make_message(i)
            run.state.messages.append(msg)


_SCRIPT_DEFS = '''
import persistkit as pk

class Notes(pk.State):
    messages: list[str] = []

@pk.checkpointed
def produce(i: int) -> str:
    return TEXTS[i]
'''

_SCRIPT_LOOP = """
with pk.resume(thread, store=store, state=Notes) as run:
    for i in range(STEPS):
        msg = produce(i)
        run.state.messages.append(msg)
"""


class Script:
    """A script's module: its definitions run once, its top-level loop once per round."""

    def __init__(self) -> None:
        self.globals: dict[str, Any] = {"__name__": "__main__", "TEXTS": TEXTS, "STEPS": STEPS}
        exec(compile(_SCRIPT_DEFS, "<agent script>", "exec"), self.globals)
        self.loop = compile(_SCRIPT_LOOP, "<agent script>", "exec")

    def __call__(self, store: pk.Store, thread: str) -> None:
        self.globals.update(store=store, thread=thread)
        exec(self.loop, self.globals)
