"""Which token sequences a server has recently computed, so that a round knows whether its context is in the
server's prefix cache: a bounded, least-recently-used memory of sequences by length and hash.

A wrong answer costs time, never correctness: a cold context taken for warm is computed K + 1 times over.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

DEFAULT_REMEMBERED = 512  # sequences: a few per request in flight


class WarmPrefixes:
    """Recently computed sequences; `covers` says whether a context extends one by at most `gap` tokens."""

    def __init__(self, remembered: int = DEFAULT_REMEMBERED) -> None:
        self.remembered = remembered
        self._seen: OrderedDict[tuple[int, int], None] = OrderedDict()  # (length, hash of the ids)
        self._lengths: dict[int, int] = {}  # length -> how many remembered sequences have it

    def add(self, tokens: Sequence[int]) -> None:
        """Remember that the server computed `tokens` (the oldest memory goes past `remembered`)."""
        key = (len(tokens), hash(tuple(tokens)))
        if key in self._seen:
            self._seen.move_to_end(key)
            return
        self._seen[key] = None
        self._lengths[key[0]] = self._lengths.get(key[0], 0) + 1
        if len(self._seen) > self.remembered:
            (length, _), _ = self._seen.popitem(last=False)
            self._lengths[length] -= 1
            if not self._lengths[length]:
                del self._lengths[length]

    def covers(self, context: Sequence[int], gap: int) -> bool:
        """Whether a remembered sequence is a prefix of `context` short of it by at most `gap` tokens."""
        # Only lengths that some memory has are hashed: a round costs a few hashes of its context, not `gap`.
        for length in sorted(self._lengths, reverse=True):
            if length > len(context):
                continue
            if len(context) - length > gap:
                return False
            key = (length, hash(tuple(context[:length])))
            if key in self._seen:
                self._seen.move_to_end(key)
                return True
        return False
