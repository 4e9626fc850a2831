"""Conformance suites a store must pass (interim)."""
