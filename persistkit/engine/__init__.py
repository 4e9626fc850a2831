"""The user's API and the run engine.

``_api``: ``@checkpointed`` and ``resume()``, the sync and async drivers; ``_inputs``: a
live step's inputs with read-back secret handles resolved; ``_args``: a step call's
argument digest. ``_run``: a run (``Run``), made of ``_cursor`` (the replay cursor: which
recorded step a call is, and replaying it), ``_restore`` (restoring the state committed
with a replayed step) and ``_commit`` (what a step or a run's end writes, and how it
lands), over the fields declared in ``_fields``. ``_store``: ``pk.Store`` and
``pk.connect()``; ``_store_plans``: what each of its operations reads and writes.
"""
