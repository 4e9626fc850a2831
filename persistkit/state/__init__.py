"""The storage model of state: what a checkpoint holds and how state is read back.

``_spec``: ``StateSpec`` (a state's channels, reducers, schema version and migrations),
``TrackedList``, the reducers. ``_model``: ``pk.State`` (imports pydantic, on first use).
``_channels``: what a checkpoint writes per channel and how it is loaded. ``_records``:
the payload of one checkpoint row and ``pk.Checkpoint``. ``_dedupe``: a list item that is
a copy of the previous step's result is stored once.
"""
