"""The verifier's plain decoding: the same tokens step by step on the engine's thread or in shared decodes."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import aclosing

import numpy as np
import pytest

from proxy.engine.llama import Evaluation, Step
from proxy.verifier.model import VerifierModel
from proxy.verifier.plain import PlainSteps

N_VOCAB = 50
END = 0


class ArithmeticEngine:
    """A stand-in engine whose next token is a function of the whole context, and which counts its evaluations."""

    n_seq = 2
    n_vocab = N_VOCAB

    def __init__(self) -> None:
        self._held: list[list[int]] = [[] for _ in range(self.n_seq)]
        self.evaluations = 0
        self.vocabulary = self

    def is_end_of_generation(self, token: int) -> bool:
        return token == END

    def held(self, seq: int) -> list[int]:
        return self._held[seq]

    def check(self, tokens: Sequence[int], first_logit_row: int) -> None:
        pass

    def evaluate(self, seq: int, tokens: Sequence[int], first_logit_row: int) -> Evaluation:
        return self.evaluate_steps([Step(seq, tokens, first_logit_row)])[0]

    def next_row(self, seq: int, tokens: Sequence[int]) -> np.ndarray:
        return self.evaluate(seq, tokens, len(tokens) - 1).logits[0]

    def evaluate_steps(self, steps: Sequence[Step]) -> list[Evaluation]:
        self.evaluations += len(steps)
        out = []
        for step in steps:
            self._held[step.seq] = list(step.tokens)
            rows = np.zeros((len(step.tokens) - step.first_logit_row, N_VOCAB), dtype=np.float32)
            for r in range(len(rows)):
                rows[r, next_token(step.tokens[: step.first_logit_row + r + 1])] = 1.0
            out.append(Evaluation(rows, 0))
        return out

    def close(self) -> None:
        pass


def next_token(context: Sequence[int]) -> int:
    return (sum(context) * 7 + len(context)) % N_VOCAB


def reference(context: list[int], limit: int) -> list[int]:
    """Greedy decoding written out by hand."""
    out: list[int] = []
    while len(out) < limit:
        out.append(next_token(context + out))
        if out[-1] == END:
            break
    return out


async def decode(model: VerifierModel, context: list[int], limit: int, known_row: bool = False) -> list[int]:
    first_row = None
    if known_row:  # as /generate has it: the row after the input comes with the input's scoring
        first_row = model.engine.evaluate(0, context, len(context) - 1).logits[0]
    steps = PlainSteps(list(context), lambda row: int(np.argmax(row)), model.vocabulary.is_end_of_generation,
                       limit, first_row=first_row)
    async with aclosing(model.decode_plain(0, steps)) as tokens:
        return [token async for token in tokens]


@pytest.mark.parametrize("shared_decode", [False, True])
@pytest.mark.parametrize("known_row", [False, True])
async def test_plain_decoding_writes_the_greedy_tokens_with_one_evaluation_each(shared_decode: bool,
                                                                                known_row: bool) -> None:
    engine = ArithmeticEngine()
    model = VerifierModel(engine, shared_decode=shared_decode)  # type: ignore[arg-type]
    out = await decode(model, [3, 1, 4], 12, known_row)
    assert out == reference([3, 1, 4], 12)
    assert len(out) == 12  # this context never draws the end token within 12
    assert engine.evaluations == 12  # one a token, a known row counting as the first token's
    model.close()


async def test_plain_decoding_stops_at_the_end_token_and_at_no_tokens() -> None:
    model = VerifierModel(ArithmeticEngine())  # type: ignore[arg-type]
    context = next(c for c in ([k, 1] for k in range(N_VOCAB)) if END in reference(c, 30))
    out = await decode(model, context, 30)
    assert out == reference(context, 30) and out[-1] == END and len(out) < 30
    assert await decode(model, context, 0) == []
    model.close()
