"""Log-probs as the OpenAI API shapes them: what a request asks for, and each emitted token's entry.

Chat (`logprobs: true`, `top_logprobs: n`): `choices[i].logprobs = {"content": [...], "refusal": null}`,
one entry per token: its text, log-prob, UTF-8 bytes and the n most likely tokens, best first.
Completions (`logprobs: n`, the legacy shape): `tokens`, `token_logprobs`, `top_logprobs` (one
text -> log-prob object per token: the top n and the sampled token, so up to n + 1 entries) and
`text_offset`. A stream carries each chunk's tokens in that chunk. vLLM writes -inf as -9999.0
(JSON has no infinity); so do we.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.wire.fields import CHAT
from proxy.wire.shapers import ResponseShaper

LOGPROB_FIELDS = frozenset({"logprobs", "top_logprobs"})
MAX_CHAT_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs
CLAMPED_NEG_INF = -9999.0


@dataclass(frozen=True)
class TokenLogprobs:
    """The target's log-prob of one emitted token, and its top-N at that position (best first)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token id, log-prob)


Lookup = Callable[[Sequence[int]], TokenLogprobs]  # the completion so far -> its last token's log-probs


def _count(value: Any, low: int, high: int | None) -> int | None:
    """An integer within bounds, else None (not ours to answer: the upstream gives its own error)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        return None
    return value


def requested_logprobs(body: dict, kind: str) -> int | None:
    """How many top log-probs per token a body asks for (0: the token's own only), or None when it asks for none or
    asks in a shape only the upstream can judge."""
    if kind == CHAT:
        if body.get("logprobs") is not True:
            return None
        top = body.get("top_logprobs")
        return 0 if top is None else _count(top, 0, MAX_CHAT_TOP_LOGPROBS)
    return _count(body.get("logprobs"), 0, None)


def _clamped(logprob: float) -> float:
    return max(logprob, CLAMPED_NEG_INF)


class LogprobsWriter(ResponseShaper):
    """One response's log-probs: each chunk carries those of the tokens emitted since the last one."""

    def __init__(self, kind: str, n: int, token_bytes: Callable[[int], bytes], lookup: Lookup) -> None:
        self.kind, self.n = kind, n
        self._token_bytes, self._lookup = token_bytes, lookup
        self._completion: list[int] = []
        self._pending: list[TokenLogprobs] = []
        self._offset = 0  # the legacy text_offset of the next token

    def add(self, tokens: Sequence[int]) -> None:
        """Tokens the text stream took, in order."""
        for token in tokens:
            self._completion.append(token)
            self._pending.append(self._lookup(self._completion))

    def take(self) -> dict[str, Any] | None:
        """The pending tokens' log-probs object (None when there are none), in the response's shape."""
        if not self._pending:
            return None
        pending, self._pending = self._pending, []
        return self._chat(pending) if self.kind == CHAT else self._legacy(pending)

    def shape_chunk(self, chunk: dict[str, Any], text: str | None, finish_reason: str | None) -> bool:
        chunk["choices"][0]["logprobs"] = self.take()
        return True

    def shape_body(self, body: dict[str, Any], text: str) -> None:
        body["choices"][0]["logprobs"] = self.take()

    def _text(self, token: int) -> str:
        return self._token_bytes(token).decode("utf-8", errors="replace")

    def _chat_entry(self, token: int, logprob: float) -> dict[str, Any]:
        return {"token": self._text(token), "logprob": _clamped(logprob), "bytes": list(self._token_bytes(token))}

    def _chat(self, entries: list[TokenLogprobs]) -> dict[str, Any]:
        content = [{**self._chat_entry(entry.token, entry.logprob),
                    "top_logprobs": [self._chat_entry(token, logprob) for token, logprob in entry.top[: self.n]]}
                   for entry in entries]
        return {"content": content, "refusal": None}

    def _legacy(self, entries: list[TokenLogprobs]) -> dict[str, Any]:
        tokens, offsets, tops = [], [], []
        for entry in entries:
            text = self._text(entry.token)
            tokens.append(text)
            offsets.append(self._offset)
            self._offset += len(text)
            top = {self._text(token): _clamped(logprob) for token, logprob in entry.top[: self.n]}
            top.setdefault(text, _clamped(entry.logprob))  # the sampled token is always there (OpenAI: n + 1)
            tops.append(top)
        return {"tokens": tokens, "token_logprobs": [_clamped(entry.logprob) for entry in entries],
                "top_logprobs": tops, "text_offset": offsets}
