"""Does the draft tokenize exactly like the target? Speculation is only valid in one shared vocabulary."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.drafting.base import Vocabulary
from proxy.targets.upstream import Upstream, UpstreamStatusError

# Probe strings chosen to exercise pre-tokenization: code, whitespace runs, multi-byte UTF-8,
# numbers, and chat special tokens.
PROBES = (
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "def fibonacci(n: int) -> int:\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "  \t leading whitespace,\r\n\r\nCRLF lines and    runs   of spaces",
    "Ünïcödé: naïve café, 数学, русский, emoji 🙂🚀, math ∑∫√",
    "1234567890 3.14159 -42 1e-9 0xFF",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|></s><s>",
)


@dataclass(frozen=True)
class TokenizerVerdict:
    """Whether draft and target share a tokenizer, and why not."""

    compatible: bool
    reason: str


async def check_tokenizer(draft: Vocabulary, upstream: Upstream) -> TokenizerVerdict:
    """Compare vocabulary size, special ids and the tokenization of probe strings."""
    try:
        info = await upstream.get_json("/get_model_info")
    except UpstreamStatusError:
        info = {}  # not every server has it (vLLM does not): the probes still decide
    vocab = info.get("vocab_size") if isinstance(info, dict) else None
    if isinstance(vocab, int) and vocab != draft.n_vocab:
        return TokenizerVerdict(False, f"vocabulary sizes differ: draft {draft.n_vocab}, target {vocab}")
    eos = info.get("eos_token_id") if isinstance(info, dict) else None
    if isinstance(eos, int) and eos != draft.special_ids["eos"]:
        return TokenizerVerdict(False, f"EOS ids differ: draft {draft.special_ids['eos']}, target {eos}")
    for number, probe in enumerate(PROBES):
        answer = await upstream.post_json("/tokenize", {"prompt": probe, "add_special_tokens": False})
        target_ids = answer.get("tokens") if isinstance(answer, dict) else None
        draft_ids = draft.tokenize(probe, add_special=False)
        if target_ids != draft_ids:
            return TokenizerVerdict(
                False, f"probe {number} tokenizes differently (draft {draft_ids[:8]}…, target {(target_ids or [])[:8]}…)"
            )
    return TokenizerVerdict(True, f"{len(PROBES)} probes tokenize identically; vocabulary {draft.n_vocab}")
