"""``store.update_state(expected_head=...)``: a compare-and-swap on the head's checkpoint id."""

from __future__ import annotations

from .._errors import ConflictError
from ..backends import Head

__all__ = ["ANY_HEAD", "AnyHead", "check_head"]


class AnyHead:
    """``update_state(expected_head=...)``'s default: write on top of whatever the head is."""

    def __repr__(self) -> str:
        return "ANY_HEAD"


ANY_HEAD = AnyHead()


def check_head(thread_id: str, namespace: str, head: Head | None, expected: str | AnyHead | None) -> None:
    """Raise ``ConflictError`` unless ``head`` (read in the same plan that writes over it, whose
    version compare-and-swap makes the check atomic) is the ``expected`` checkpoint (None: no head)."""
    found = head.checkpoint_id if head else None
    if isinstance(expected, AnyHead) or found == expected:
        return
    raise ConflictError(
        f"thread {thread_id!r}{f' namespace {namespace!r}' if namespace else ''}: update_state "
        f"wrote nothing: expected_head={expected!r} but the head is {found!r} (another writer "
        "moved it). Read the new head and apply the changes to it",
        thread_id=thread_id, namespace=namespace, found=head.version if head else 0, found_checkpoint=found,
    )
