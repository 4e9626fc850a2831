"""The user's API and the run engine.

``_api``: ``@checkpointed`` and ``resume()``, the sync and async drivers.
``_run``: a run (``Run``), made of ``_cursor`` (the replay cursor: which recorded step a
call is), ``_restore`` (restoring the state committed with a replayed step) and
``_commit`` (what a step or a run end writes, and how it lands). ``_args``: a step
call's argument digest. ``_inputs``: a live step's inputs with secret handles resolved.
``_store``: ``pk.Store`` (history, fork, update_state, get_state; ``_store_admin``: keys,
verify, copy, delete) and ``_connect``: ``pk.connect()``.
"""
