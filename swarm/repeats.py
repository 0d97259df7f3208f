"""Messages seen lately: a bounded memory of their digests, so that one repeated byte for byte is dropped before it
is decoded and its signature checked."""

from __future__ import annotations

import collections
import hashlib

__all__ = ["RecentMessages"]


class RecentMessages:
    """The digests of the last ``capacity`` distinct messages seen.

    A signed message that arrives again byte for byte says nothing new, yet checking it again costs its signature
    check; a sender need sign it only once to have it checked as often as it can send it. An honest publisher signs
    each message afresh (it dates it), so only a copy repeats.

    Args:
        capacity: how many distinct messages are remembered (the oldest forgotten first; 32 bytes of digest each and
            the dictionary's own overhead, about 150 bytes).
    """

    def __init__(self, capacity: int = 8192):
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self._capacity = capacity
        self._seen: collections.OrderedDict[bytes, None] = collections.OrderedDict()

    def repeated(self, data: bytes) -> bool:
        """True if ``data`` was seen among the last ``capacity`` distinct messages; it is remembered either way."""
        digest = hashlib.sha256(data).digest()
        if digest in self._seen:
            self._seen.move_to_end(digest)
            return True
        self._seen[digest] = None
        if len(self._seen) > self._capacity:
            self._seen.popitem(last=False)
        return False
