"""A real GGUF's vocabulary: each token's bytes and end-of-generation flag are asked of llama.cpp once (the flags when
it is loaded)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import llama_cpp
import pytest

from proxy.engine.vocabulary import LlamaVocabulary
from tests.e2e.servers import SMOL


def counted(calls: Counter, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        calls[name] += 1
        return function(*args)
    return call


def test_a_tokens_bytes_are_looked_up_once_and_the_ends_when_loaded(model_paths: dict[str, Path],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    calls: Counter = Counter()
    for name in ("llama_token_to_piece", "llama_vocab_is_eog"):
        monkeypatch.setattr(llama_cpp, name, counted(calls, name, getattr(llama_cpp, name)))
    vocabulary = LlamaVocabulary.from_gguf(str(model_paths[SMOL]))
    assert calls == {"llama_vocab_is_eog": vocabulary.n_vocab}  # every id's end flag when loaded, not by a request
    tokens = vocabulary.tokenize("hello hello hello", add_special=False)
    text = b"".join(vocabulary.token_bytes(token) for token in [*tokens, *tokens])
    ends = [vocabulary.is_end_of_generation(token) for token in [*tokens, *tokens]]
    assert text == b"hello hello hello" * 2 and not any(ends)
    assert vocabulary.is_end_of_generation(vocabulary.special_ids["eos"])
    # Each token's bytes when first asked for; no end flag asked again.
    assert calls == {"llama_token_to_piece": len(set(tokens)), "llama_vocab_is_eog": vocabulary.n_vocab}
    with pytest.raises(ValueError, match="outside the vocabulary"):  # still checked before llama.cpp sees it
        vocabulary.token_bytes(vocabulary.n_vocab)
