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

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.drafting.base import Vocabulary

LISTED = "eos_token_ids"  # our verifier's extension of SGLang's model info
NAMED = "eos_token_id"


class EndEvidence:
    """What the server's answers showed of its ends of generation, where it differs from the ids first assumed (so
    it holds a few ids, not every one the server generated)."""

    def __init__(self) -> None:
        self._assumed: frozenset[int] = frozenset()
        self._differ: dict[int, bool] = {}  # id -> whether the server ends there, where not as assumed

    def assume(self, ids: frozenset[int]) -> None:
        """The ids taken to end generations until an answer shows otherwise."""
        self._assumed = ids
        self._differ = {token: ended for token, ended in self._differ.items() if ended != (token in ids)}

    def saw(self, token: int, ended: bool) -> None:
        """The server generated `token` and then ended (or went on)."""
        if ended == (token in self._assumed):
            self._differ.pop(token, None)
        else:
            self._differ[token] = ended

    def saw_answer(self, tokens: Sequence[int], last: tuple[int, bool] | None) -> None:
        """One answer's ids: the server went on past all but the last, and `last` says whether it ended there (None:
        its finish reason says neither)."""
        for token in tokens[:-1]:
            self.saw(token, False)
        if last is not None:
            self.saw(*last)

    def is_end(self, token: int) -> bool:
        """Whether the server ends at `token`: as its answers showed, else as assumed."""
        shown = self._differ.get(token)
        return token in self._assumed if shown is None else shown


@dataclass(frozen=True)
class StopSet:
    """The ids at which the target ends a generation, where that was learned, and what its answers showed since."""

    ids: frozenset[int]
    source: str
    seen: EndEvidence = field(default_factory=EndEvidence)

    def __post_init__(self) -> None:
        self.seen.assume(self.ids)

    def is_end(self, token: int) -> bool:
        """Whether the target ends its generation at this token: as its answers showed, else as the set says."""
        return self.seen.is_end(token)


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
