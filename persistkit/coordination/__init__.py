"""Coordination between runs: leases with fencing tokens and the busy policy.

``pk.resume(thread_id, busy=..., lease_ttl=..., busy_timeout=...)`` takes the
thread's lease before the run opens; ``store.leases()`` lists who holds what.
See ``docs/coordination.md`` for the guarantees and what can still happen twice.
"""

from ._fence import fenced
from ._lease import (
    BUSY_POLICIES,
    DEFAULT_BUSY,
    DEFAULT_BUSY_TIMEOUT,
    DEFAULT_TTL,
    Lease,
    LeaseInfo,
    check_options,
    check_unfinished,
)

__all__ = [
    "BUSY_POLICIES",
    "DEFAULT_BUSY",
    "DEFAULT_BUSY_TIMEOUT",
    "DEFAULT_TTL",
    "Lease",
    "LeaseInfo",
    "check_options",
    "check_unfinished",
    "fenced",
]
