"""A tiny deterministic language model for tests that must know the target's exact distribution.

Logits depend on the last two tokens through a seeded table, so greedy continuations are long
and varied; token 0 ends generation. Its vocabulary renders token t as a few letters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from proxy.sampling.processors import SamplerOrder, SamplingParams, processed_probs

END = 0
VOCAB = 24


@dataclass
class ToyModel:
    """Seeded logits over a small vocabulary."""

    seed: int = 7
    vocab: int = VOCAB
    end_after: int | None = None  # force the end token once the context holds this many tokens
    table: np.ndarray = field(init=False)  # [vocab, vocab, vocab] logits by the last two tokens

    def __post_init__(self) -> None:
        rng = np.random.default_rng(self.seed)
        self.table = rng.normal(0.0, 2.0, size=(self.vocab, self.vocab, self.vocab))
        self.table[:, :, END] -= 4.0  # the end token is rare unless forced

    def logits(self, context: Sequence[int]) -> np.ndarray:  # -> [vocab]
        """Raw logits for the token after context."""
        if self.end_after is not None and len(context) >= self.end_after:
            row = np.full(self.vocab, -10.0)
            row[END] = 10.0
            return row
        previous = context[-2] if len(context) > 1 else 1
        return self.table[previous, context[-1]].copy()

    def log_softmax(self, context: Sequence[int]) -> np.ndarray:
        """Raw log-probabilities for the token after context."""
        row = self.logits(context)
        return row - row.max() - np.log(np.exp(row - row.max()).sum())

    def probs(self, context: Sequence[int], params: SamplingParams, order: SamplerOrder) -> np.ndarray:
        """The processed distribution a server with this sampler order draws from."""
        return processed_probs(self.logits(context), params, order)

    def greedy(self, context: Sequence[int], n: int) -> list[int]:
        """The argmax continuation, stopping after the end token."""
        out: list[int] = []
        context = list(context)
        while len(out) < n:
            token = int(np.argmax(self.logits(context)))
            out.append(token)
            context.append(token)
            if token == END:
                break
        return out


class ToyVocabulary:
    """The toy model's tokenizer side: token t renders as letters, token 0 ends generation."""

    n_vocab = VOCAB
    special_ids = {"bos": -1, "eos": END}
    llama_only_ends: frozenset[int] = frozenset()

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        return [1 + ord(c) % (VOCAB - 1) for c in text]

    def token_bytes(self, token: int) -> bytes:
        return b"" if token == END else chr(ord("a") + token % 26).encode() + b" "

    def is_end_of_generation(self, token: int) -> bool:
        return token == END
