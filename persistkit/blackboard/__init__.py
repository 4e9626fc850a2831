"""State shared across agents: ``store.board()`` (docs/shared-state.md).

A board is a space of keys many agents read and write at once, on the store's ``kv``
capability (``persistkit.backends.Backend.kv_*``): versions and kept history,
compare-and-swap, atomic batches, TTL, claims with fencing tokens, watches, scoped
handles with grants, and validators per prefix. Values go through the store's codec
(secrets become handles, encryption, integrity tags), as checkpoints do.

The modules (this file imports none of them):

``_entries``   keys, values and their stored envelope; BoardEntry, BoardChange; policies per prefix
``_board``     BoardCore: get, put, cas, delete, list, update, history, batches (each once, as a plan)
``_claims``    claim / complete / release / renew: work items taken by one worker at a time
``_hub``       one feed of a board's hints per process, shared by all its watches
``_watch``     watch(pattern): change events from the store's hints, or by polling
``_acl``       board.scoped(...): a handle that refuses keys outside its grants
``_validate``  schemas and content checks per prefix; pk.instruction_check
``_space``     pk.Board: BoardCore with claims, watches and scoped handles (what store.board() returns)
"""
