"""One llama.cpp model and context with a reusable KV prefix: the blocking core of the verifier and the draft.

Everything here blocks; callers run it in a worker thread and serialize access (one context, one
sequence). State switching between requests is the prefix reuse itself: a request that shares no
prefix with what was evaluated before simply re-evaluates its context.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp import Llama
from llama_cpp._internals import LlamaBatch
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from proxy.errors import BadRequestError, ContextOverflowError

DEFAULT_BATCH = 512
SEQUENCE = 0  # the single llama.cpp sequence this context uses


@dataclass(frozen=True)
class EngineOptions:
    """How to load a GGUF model."""

    model_path: Path
    n_ctx: int = 4096
    n_threads: int | None = None
    n_batch: int = DEFAULT_BATCH
    n_gpu_layers: int = 0


@dataclass(frozen=True)
class Evaluation:
    """Logits for the requested rows of one evaluation, and how much of the prefix was reused."""

    logits: np.ndarray  # [rows, vocab] float32; row i predicts token first_logit_row + i + 1
    cached_tokens: int


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class LlamaEngine:
    """A llama.cpp model with one KV-cached sequence; evaluates token ids and returns chosen logit rows."""

    def __init__(self, options: EngineOptions) -> None:
        threads = options.n_threads or max(1, os.cpu_count() or 1)
        self.options = options
        self._llama = Llama(
            model_path=str(options.model_path),
            n_ctx=options.n_ctx,
            n_batch=options.n_batch,
            n_ubatch=options.n_batch,
            n_threads=threads,
            n_threads_batch=threads,
            n_gpu_layers=options.n_gpu_layers,
            logits_all=False,
            verbose=False,
        )
        self._model = self._llama._model
        self._ctx = self._llama._ctx
        self._batch = LlamaBatch(n_tokens=options.n_batch, embd=0, n_seq_max=1, verbose=False)
        self._evaluated: list[int] = []
        self.n_vocab: int = self._model.n_vocab()
        self.n_ctx: int = self._ctx.n_ctx()
        self.metadata: dict[str, str] = dict(self._llama.metadata)
        self._chat_formatters = {
            flag: self._make_chat_formatter(add_generation_prompt=flag) for flag in (True, False)
        }

    # -- evaluation ---------------------------------------------------------------------------

    def evaluate(self, tokens: Sequence[int], first_logit_row: int) -> Evaluation:
        """Evaluate `tokens`, reusing the cached prefix, and return logits for rows >= first_logit_row."""
        if not tokens:
            raise BadRequestError("no input tokens")
        if len(tokens) > self.n_ctx:
            raise ContextOverflowError(
                f"{len(tokens)} tokens exceed the context size of {self.n_ctx}"
            )
        if not 0 <= first_logit_row < len(tokens):
            raise BadRequestError(f"logit row {first_logit_row} is outside 0..{len(tokens) - 1}")
        bad = [t for t in tokens if not 0 <= t < self.n_vocab]
        if bad:
            raise BadRequestError(f"token id {bad[0]} is outside the vocabulary 0..{self.n_vocab - 1}")
        # Rows whose logits we return must be computed now, so reuse stops at the first of them.
        reused = min(common_prefix_length(self._evaluated, tokens), first_logit_row)
        self._truncate(reused)
        logits = np.empty((len(tokens) - first_logit_row, self.n_vocab), dtype=np.float32)
        for start, end in self._chunks(reused, len(tokens), first_logit_row):
            chunk = tokens[start:end]
            wanted = self._fill_batch(chunk, start, first_logit_row)
            try:
                self._ctx.decode(self._batch)
            except RuntimeError:
                self._truncate(start)
                raise
            self._evaluated.extend(chunk)
            for index in wanted:
                row = np.ctypeslib.as_array(self._ctx.get_logits_ith(index), shape=(self.n_vocab,))
                logits[start + index - first_logit_row] = row
        return Evaluation(logits=logits, cached_tokens=reused)

    def _chunks(self, start: int, end: int, first_logit_row: int) -> list[tuple[int, int]]:
        """Batch boundaries for evaluating tokens[start:end]: the prefix, then the returned rows on their own.

        llama.cpp's logits for a row depend on how the sequence was split into batches (a row
        evaluated together with its whole context differs from one evaluated after a cached
        prefix, by up to ~0.5 logits on Qwen2.5 Q4_K_M). Evaluating the returned rows as one batch
        after the prefix, whatever was cached before, makes a request's logits independent of
        cache history: cold and warm requests agree, and seeded requests reproduce.
        """
        bounds = []
        for lo, hi in ((start, first_logit_row), (max(start, first_logit_row), end)):
            bounds += [(s, min(s + self.options.n_batch, hi)) for s in range(lo, hi, self.options.n_batch)]
        return bounds

    def _fill_batch(self, chunk: Sequence[int], start: int, first_logit_row: int) -> list[int]:
        """Load one chunk into the batch; return the batch indices whose logits are requested."""
        batch = self._batch.batch
        batch.n_tokens = len(chunk)
        wanted = []
        for i, token in enumerate(chunk):
            batch.token[i] = token
            batch.pos[i] = start + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = SEQUENCE
            want = start + i >= first_logit_row
            batch.logits[i] = want
            if want:
                wanted.append(i)
        return wanted

    def _truncate(self, length: int) -> None:
        """Forget evaluated tokens from `length` on, in the KV cache and in our record."""
        if length >= len(self._evaluated):
            return
        if not self._ctx.kv_cache_seq_rm(SEQUENCE, length, -1):
            # Some architectures (recurrent ones) cannot drop a suffix: start over.
            self._ctx.kv_cache_clear()
            length = 0
        del self._evaluated[length:]

    # -- vocabulary -----------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        """Token ids for text; special-token text (like <|im_start|>) is parsed as such."""
        add_bos = add_special and self._model.add_bos_token()
        return self._model.tokenize(text.encode("utf-8"), add_bos, True)

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token renders to in output text (special tokens render as nothing)."""
        size = 64
        buffer = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_token_to_piece(self._model.vocab, token, buffer, size, 0, False)
        if n < 0:  # a piece longer than the buffer: ask again with the size llama.cpp needs
            buffer = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._model.vocab, token, buffer, -n, 0, False)
        return buffer.raw[:n]

    def is_end_of_generation(self, token: int) -> bool:
        """True for EOS and the template's end-of-turn tokens."""
        return bool(llama_cpp.llama_vocab_is_eog(self._model.vocab, token))

    @property
    def special_ids(self) -> dict[str, int]:
        """BOS and EOS ids (-1 when the model has none)."""
        return {"bos": self._model.token_bos(), "eos": self._model.token_eos()}

    # -- chat template --------------------------------------------------------------------------

    def _make_chat_formatter(self, *, add_generation_prompt: bool) -> Jinja2ChatFormatter | None:
        template = self.metadata.get("tokenizer.chat_template")
        if not template:
            return None
        eos, bos = self._model.token_eos(), self._model.token_bos()
        return Jinja2ChatFormatter(
            template=template,
            eos_token=self._model.token_get_text(eos) if eos >= 0 else "",
            bos_token=self._model.token_get_text(bos) if bos >= 0 else "",
            add_generation_prompt=add_generation_prompt,
        )

    def chat_prompt_ids(self, messages: list[dict], *, add_generation_prompt: bool = True) -> list[int]:
        """Token ids of chat messages rendered with the model's own chat template."""
        formatter = self._chat_formatters[add_generation_prompt]
        if formatter is None:
            raise BadRequestError("this model has no chat template; use /v1/completions")
        try:
            rendered = formatter(messages=messages)
        except Exception as exc:  # jinja raises many types; all mean the messages did not fit the template
            raise BadRequestError(f"chat template failed: {exc}") from exc
        # The template writes its own special tokens, so no BOS is added (as llama-cpp-python does).
        return self._model.tokenize(rendered.prompt.encode("utf-8"), False, True)

    def close(self) -> None:
        """Free the native model, context and batch."""
        self._batch.close()
        self._llama.close()
