"""Operating a store: retention (``_retention``: policies and ``store.prune``), the
thread timeline page (``_timeline``), OpenTelemetry spans and metrics (``_telemetry``).

A floor between ``blackboard`` and ``engine``: built on the store protocol, the state
records and the codec; the engine's ``pk.Store`` delegates to it and the command line
calls it. This file is a map and imports nothing.
"""
