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
        self._stops = [_StopMatcher(s) for s in stop if s]
        self._max_tokens = max_tokens
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._sent: list[str] = []  # the client's text, as it went out
        self._unsent = ""  # decoded since: a tail held back as the start of a stop string
        self.completion_tokens = 0
        self.finish_reason: str | None = None

    @property
    def text(self) -> str:
        """All text sent to the client so far."""
        return "".join(self._sent)

    def push(self, tokens: Iterable[int]) -> Delta:
        """Add emitted tokens; tokens after the end of generation are ignored."""
        if self.finish_reason is not None:
            return Delta("", self.finish_reason)
        pieces, length = [self._unsent], len(self._unsent)
        for token in tokens:
            self.completion_tokens += 1
            if self._is_end(token):
                return self._finish(STOP, "".join(pieces))
            pieces.append(self._decoder.decode(self._token_bytes(token)))
            cut = self._find_stop(pieces[-1], length)
            length += len(pieces[-1])
            if cut is not None:
                return self._finish(STOP, "".join(pieces)[:cut])
            if self._max_tokens is not None and self.completion_tokens >= self._max_tokens:
                return self._finish(LENGTH, "".join(pieces) + self._decoder.decode(b"", final=True))
        unsent = "".join(pieces)
        end = len(unsent) - self._stop_prefix_held()
        self._unsent = unsent[end:]
        return self._send(unsent[:end])

    def _finish(self, reason: str, text: str) -> Delta:
        """Done: the text up to where generation ended goes out."""
        self.finish_reason, self._unsent = reason, ""
        return self._send(text)

    def _send(self, text: str) -> Delta:
        if text:
            self._sent.append(text)
        return Delta(text, self.finish_reason)

    def _find_stop(self, piece: str, offset: int) -> int | None:
        """Where the earliest stop string that the piece completes begins, counted from offset before the piece."""
        hits = [offset + at + 1 - len(m.stop) for m in self._stops if (at := m.feed(piece)) >= 0]
        return min(hits) if hits else None

    def _stop_prefix_held(self) -> int:
        """Length of the text tail that could still grow into a stop string (held back)."""
        # Within the unsent text: each tail grew by at most what came since the last push, when it was held back.
        return max((m.matched for m in self._stops), default=0)

    def close(self) -> Delta:
        """End the stream where generation stopped without a reason (upstream ended): flush held text."""
        if self.finish_reason is not None:
            return Delta("", self.finish_reason)
        return self._finish(LENGTH, self._unsent + self._decoder.decode(b"", final=True))


class _StopMatcher:
    """One stop string searched for in text that comes piece by piece, each character looked at about once.

    Knuth–Morris–Pratt: `matched` is the longest tail of the text so far that begins the stop string, and on a
    character that does not continue it, the next shorter such tail is known from the stop string alone.
    """

    def __init__(self, stop: str) -> None:
        self.stop = stop
        self.matched = 0
        self._shorter = [0] * len(stop)  # [i]: the longest proper prefix of stop[:i + 1] that also ends it
        for at in range(1, len(stop)):
            self._shorter[at] = self._step(self._shorter[at - 1], stop[at])

    def _step(self, matched: int, char: str) -> int:
        """How much of the stop string the text holds after one more character."""
        while matched and self.stop[matched] != char:
            matched = self._shorter[matched - 1]
        return matched + 1 if self.stop[matched] == char else 0

    def feed(self, piece: str) -> int:
        """The index in piece where the stop string first ends (-1: it does not); `matched` follows the piece."""
        at, first = 0, self.stop[0]
        while at < len(piece):
            if not self.matched:  # nothing to continue: skip to where the stop string may begin
                at = piece.find(first, at)
                if at < 0:
                    break
            self.matched = self._step(self.matched, piece[at])
            if self.matched == len(self.stop):
                return at
            at += 1
        return -1
