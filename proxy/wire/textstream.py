"""Token ids in, text deltas out: UTF-8-safe incremental decoding, stop strings, EOS and max_tokens.

The verifier's own generation and the proxy's speculative path both emit through this one
class, so their texts, finish reasons and token counts agree by construction.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

STOP = "stop"
LENGTH = "length"


@dataclass(frozen=True)
class Delta:
    """What one push produced: new text for the client, and the finish reason once done."""

    text: str
    finish_reason: str | None


class TextStream:
    """Detokenizes emitted tokens; never emits a split UTF-8 character or text past a stop string."""

    def __init__(
        self,
        token_bytes: Callable[[int], bytes],
        is_end_of_generation: Callable[[int], bool],
        *,
        stop: Sequence[str] = (),
        max_tokens: int | None = None,
    ) -> None:
        self._token_bytes = token_bytes
        self._is_end = is_end_of_generation
        self._stops = tuple(s for s in stop if s)
        self._max_tokens = max_tokens
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._text = ""  # everything decoded so far
        self._sent = 0  # how much of _text the client has
        self.completion_tokens = 0
        self.finish_reason: str | None = None

    @property
    def text(self) -> str:
        """All text sent to the client so far."""
        return self._text[: self._sent]

    def push(self, tokens: Iterable[int]) -> Delta:
        """Add emitted tokens; tokens after the end of generation are ignored."""
        start = self._sent
        for token in tokens:
            if self.finish_reason is not None:
                break
            self._push_one(token)
        if self.finish_reason is None:
            self._sent = len(self._text) - self._stop_prefix_held()
        return Delta(self._text[start : self._sent], self.finish_reason)

    def _push_one(self, token: int) -> None:
        self.completion_tokens += 1
        if self._is_end(token):
            self._finish(STOP, end=len(self._text))
            return
        searched_from = max(0, len(self._text) - self._longest_stop() + 1)
        self._text += self._decoder.decode(self._token_bytes(token))
        cut = self._find_stop(searched_from)
        if cut is not None:
            self._finish(STOP, end=cut)
        elif self._max_tokens is not None and self.completion_tokens >= self._max_tokens:
            self._text += self._decoder.decode(b"", final=True)
            self._finish(LENGTH, end=len(self._text))

    def _finish(self, reason: str, *, end: int) -> None:
        self.finish_reason = reason
        self._text = self._text[:end]
        self._sent = end

    def _find_stop(self, searched_from: int) -> int | None:
        """Index where the earliest stop string begins in the new text, if any."""
        hits = [i for s in self._stops if (i := self._text.find(s, searched_from)) >= 0]
        return min(hits) if hits else None

    def _longest_stop(self) -> int:
        return max((len(s) for s in self._stops), default=1)

    def _stop_prefix_held(self) -> int:
        """Length of the text tail that could still grow into a stop string (held back)."""
        tail = self._text[self._sent :]
        for size in range(min(len(tail), self._longest_stop() - 1), 0, -1):
            if any(s.startswith(tail[-size:]) for s in self._stops):
                return size
        return 0

    def close(self) -> Delta:
        """End the stream where generation stopped without a reason (upstream ended): flush held text."""
        start = self._sent
        if self.finish_reason is None:
            self._text += self._decoder.decode(b"", final=True)
            self._finish(LENGTH, end=len(self._text))
        return Delta(self._text[start : self._sent], self.finish_reason)
