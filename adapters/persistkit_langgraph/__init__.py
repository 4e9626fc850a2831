"""persistkit for LangGraph (``pip install persistkit[langgraph]``).

:class:`PersistkitSaver` is a LangGraph checkpointer over any persistkit store::

    graph = builder.compile(checkpointer=PersistkitSaver.from_url("s3://bucket/agents"))

Storage layout, per LangGraph thread (= one persistkit thread):

* namespace ``lg:c:<checkpoint_ns>`` — one persistkit checkpoint per LangGraph
  checkpoint, written with ``store.update_state``. Its dict state holds the
  channel values (each encoded by the saver's ``serde``; msgpack is stored as
  the tree it encodes, so persistkit redacts the secrets in it (``_values``);
  a list value as a list of per-item encodings, so persistkit appends only the
  new items).
  Unchanged channels are stored by content hash and not rewritten. The metadata
  holds the LangGraph id, the parent id and the rest of the checkpoint.
* namespace ``lg:w:<checkpoint_id>:<checkpoint_ns>`` — the pending writes of
  one checkpoint, one dict entry per ``(task_id, idx)``.
* namespace ``lg:n`` — the checkpoint namespaces the thread has (for
  ``copy_thread`` and ``list`` without a namespace).

:func:`durable_invoke` runs a turn of a graph so that calling it again after a
crash continues the run instead of starting it over.

:class:`PersistkitStore` is LangGraph's long-term memory (``BaseStore``) on a
persistkit board (``store.board("langgraph")``), for ``builder.compile(store=...)``:
namespaces as key paths, values through the store's codec (``_store``).

:func:`durable_invoke` holds the thread's lease for the turn and names it (``run_id``):
see ``_invoke``. The saver lives in ``_saver``.
"""

from __future__ import annotations

from ._invoke import adurable_invoke, durable_invoke
from ._saver import PersistkitSaver
from ._store import PersistkitStore

__all__ = ["PersistkitSaver", "PersistkitStore", "adurable_invoke", "durable_invoke"]
