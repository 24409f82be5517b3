"""The target's end-of-generation ids: where the server stops, which is not always where the draft's GGUF would.

llama.cpp counts the fill-in-the-middle separators (`<|fim_pad|>`, `<|repo_name|>`, `<|file_sep|>` on
Qwen) and ordinary tokens that read like an end marker (Qwen's `</s>`) as ends of generation
(llama-vocab.cpp); vLLM and SGLang stop at the tokenizer's EOS and the generation config's
`eos_token_id` ids only, and go on past them. Where the set comes from:
- our verifier's model info lists its own (llama.cpp's) set as `eos_token_ids`;
- SGLang's model info and vLLM name none: the fallback is the draft's set without llama.cpp's own
  additions, which is the generation config's list for the model families llama.cpp knows (Qwen:
  `<|endoftext|>` and `<|im_end|>`), plus any id named as `eos_token_id` and the one a probe
  generation ended with.
Then the server's answers have the last word: a token an answer ended on (`finish_reason` "stop" for an id,
not a stop string) ends generations, one it generated and went on past does not (a base model behind vLLM
goes on past `<|im_end|>`; an id only the model's generation_config names ends there).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from proxy.drafting.base import Vocabulary

LISTED = "eos_token_ids"  # our verifier's extension of SGLang's model info
NAMED = "eos_token_id"


class EndEvidence:
    """What the server's answers showed of its ends of generation: ids it ended on, ids it went on past."""

    def __init__(self) -> None:
        self._ended: dict[int, bool] = {}

    def saw(self, token: int, ended: bool) -> None:
        """The server generated `token` and then ended (or went on)."""
        self._ended[token] = ended

    def verdict(self, token: int) -> bool | None:
        """Whether the server ends at `token`, as its answers showed (None: no answer showed it yet)."""
        return self._ended.get(token)


@dataclass(frozen=True)
class StopSet:
    """The ids at which the target ends a generation, where that was learned, and what its answers showed since."""

    ids: frozenset[int]
    source: str
    seen: EndEvidence = field(default_factory=EndEvidence)

    def is_end(self, token: int) -> bool:
        """Whether the target ends its generation at this token: as its answers showed, else as the set says."""
        shown = self.seen.verdict(token)
        return token in self.ids if shown is None else shown


def _ids(value: Any) -> list[int]:
    """The ids in an `eos_token_id(s)` value: one id or a list of them (anything else names none)."""
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0]


def draft_ends(vocabulary: Vocabulary) -> frozenset[int]:
    """The draft GGUF's ends of generation without those llama.cpp adds by its own rules."""
    ends = (token for token in range(vocabulary.n_vocab) if vocabulary.is_end_of_generation(token))
    return frozenset(ends) - vocabulary.llama_only_ends


def target_stop_set(info: dict[str, Any], vocabulary: Vocabulary, seen_ending: Iterable[int] = (),
                    seen: EndEvidence | None = None) -> StopSet:
    """The server's own list when its model info has one, else the draft's ends (FIM aside) and what the server
    named or was seen to end with; `seen` gathers what its answers show from then on."""
    seen = seen or EndEvidence()
    if listed := _ids(info.get(LISTED)):
        return StopSet(frozenset(listed), f"the server's {LISTED}", seen)
    named = [*_ids(info.get(NAMED)), *seen_ending]
    return StopSet(draft_ends(vocabulary) | frozenset(named),
                   "the draft's ends of generation without llama.cpp's own" + (", and the server's" if named else ""),
                   seen)
