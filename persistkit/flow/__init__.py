"""Flow control across workers: rate limits every process shares (docs/flow-control.md).

Built on the store protocol's ``kv`` capability (versioned keys with compare-and-swap), as
the board and streams are; the engine only calls in (``engine/_flow.py``: ``limit=`` on a
step, ``pk.limited``, ``pk.throttle``).

The modules (this file imports none of them):

``_gcra``    the generic cell rate algorithm on one bucket's state: rates, declarations, decisions
``_limits``  ``store.limits``: declare, list and delete limits; the draw and throttle plans, sync and async
"""
