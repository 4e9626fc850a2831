"""The codec: between Python values and the bytes a backend stores.

``_pipeline``: ``Codec``, the envelope and compression (serialize → redact → compress).
``_serde``: the type-tagged JSON tree walk and class revival; ``_plain``: stored trees as
plain JSON (no revival, handles kept); ``_stdtypes``: the wire
forms of the standard library's value types; ``_registry``: which classes may be
revived; ``_versions``: class versions and migrations of stored values.
"""
