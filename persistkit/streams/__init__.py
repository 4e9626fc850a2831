"""Durable streams: ``pk.emit`` inside a run, ``store.read_stream`` anywhere (docs/streams.md).

A stream is an ordered log of records per thread (and namespace) and name, stored as
batches in a kv scope of its own (the store protocol's ``kv`` and ``watch`` capabilities,
as the board uses them): events a run emits, reaching readers before the emitting step
commits, and the records that say what became final and what a dead attempt took back.

The modules (this file imports none of them):

``_format``  scopes and keys, the stored batch, ``StreamEvent``, name checks
``_points``  where an event was emitted, and the rule: suppressed, final or superseded
``_writer``  a run's writers: buffer, background flush, rewind, the engine's two hooks
``_reader``  ``read_stream``: from an offset, then the live tail, sync and async
``_store``   ``StreamStore``: the methods ``pk.Store`` gets (``read_stream``, ``delete_stream``)
``_sse``     ``pk.sse``: a stream as Server-Sent Events for an ASGI streaming response
``_trim``    ``trim_streams``: what ``store.prune`` takes from a kept thread's streams
"""
