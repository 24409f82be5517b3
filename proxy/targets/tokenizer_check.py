"""Does the draft tokenize exactly like the target? Speculation is only valid in one shared vocabulary.

The probe strings decide; a vocabulary size and EOS id are compared too where the server names them
(our verifier's model info does, SGLang's never does). On an SGLang server, whose model info names
no EOS, the token a short greedy answer ends with must end generation for the draft as well.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.drafting.base import Vocabulary
from proxy.targets.sglang_probe import MODEL_INFO_PATHS, ending_token, first_json, tokenize_path, tokens
from proxy.targets.stopping import EndEvidence, StopSet, target_stop_set
from proxy.targets.upstream import Upstream

# Probe strings chosen to exercise pre-tokenization: code, whitespace runs, multi-byte UTF-8,
# numbers, and chat special tokens. Not the text `</s>`: llama.cpp reads it as one token in any
# vocabulary that holds it (an end marker by its own rule, Qwen's included) where HF tokenizers split
# it, and the draft's tokenizer only ever turns text into drafts (a prediction, the calibration), where
# a different split costs a draft, never a token of output.
PROBES = (
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "def fibonacci(n: int) -> int:\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "  \t leading whitespace,\r\n\r\nCRLF lines and    runs   of spaces",
    "Ünïcödé: naïve café, 数学, русский, emoji 🙂🚀, math ∑∫√",
    "1234567890 3.14159 -42 1e-9 0xFF",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|><s>",
)


@dataclass(frozen=True)
class TokenizerVerdict:
    """Whether draft and target share a tokenizer, and why not."""

    compatible: bool
    reason: str
    stop: StopSet | None = None  # the target's ends of generation, once compatible


async def check_tokenizer(draft: Vocabulary, upstream: Upstream, seen: EndEvidence | None = None) -> TokenizerVerdict:
    """Compare vocabulary size, special ids, the tokenization of probe strings and the end of a generation (the
    stop set then follows what `seen` gathers from the server's answers)."""
    info = await first_json(upstream, MODEL_INFO_PATHS)  # {} on servers without one (vLLM)
    vocab = info.get("vocab_size")
    if isinstance(vocab, int) and vocab != draft.n_vocab:
        return TokenizerVerdict(False, f"vocabulary sizes differ: draft {draft.n_vocab}, target {vocab}")
    eos = info.get("eos_token_id")
    if isinstance(eos, int) and eos != draft.special_ids["eos"]:
        return TokenizerVerdict(False, f"EOS ids differ: draft {draft.special_ids['eos']}, target {eos}")
    path, problem = await tokenize_path(upstream)
    if path is None or problem is not None:
        return TokenizerVerdict(False, f"cannot compare tokenizers: {problem}")
    for number, probe in enumerate(PROBES):
        target_ids = await tokens(upstream, path, {"prompt": probe, "add_special_tokens": False})
        draft_ids = draft.tokenize(probe, add_special=False)
        if target_ids != draft_ids:
            return TokenizerVerdict(
                False, f"probe {number} tokenizes differently (draft {draft_ids[:8]}…, target {target_ids[:8]}…)"
            )
    ending, end = "EOS id compared" if isinstance(eos, int) else "EOS not named by the server", None
    if info and not isinstance(eos, int):  # an SGLang server: let a generation show how it ends
        end = await ending_token(upstream, path)
        # Past the draft's vocabulary, llama.cpp's lookup would throw through ctypes and abort the process.
        if end is not None and not (end < draft.n_vocab and draft.is_end_of_generation(end)):
            return TokenizerVerdict(False, f"the target ends generations with id {end}, which does not end the "
                                           "draft's")
        ending = f"generations end with id {end}, an end for the draft too" if end is not None else \
            "EOS unknown: a probe generation did not end"
    stop = target_stop_set(info, draft, () if end is None else (end,), seen)
    return TokenizerVerdict(True, f"{len(PROBES)} probes tokenize identically; vocabulary {draft.n_vocab}; {ending}; "
                                  f"ends of generation from {stop.source}", stop)
