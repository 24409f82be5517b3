"""One llama.cpp model and context with several KV-cached sequences: the blocking core of the verifier and the draft.

Everything here blocks; callers run it on one worker thread (`EngineRunner`). Each sequence has its
own cache stream (`kv_unified` off), so a request's attention never runs over another request's
cells, and the engine remembers which tokens each sequence holds: a call reuses the longest
prefix its sequence already holds and drops only the suffix that differs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp import Llama
from llama_cpp._internals import LlamaBatch, LlamaContext

from proxy.engine.prefix import common_prefix_length
from proxy.engine.threads import usable_cores
from proxy.engine.vocabulary import LlamaVocabulary
from proxy.errors import BadRequestError, ContextOverflowError

DEFAULT_BATCH = 512
LOADER_CTX = 64  # the context llama-cpp-python's loader builds: unused, so kept tiny


@dataclass(frozen=True)
class EngineOptions:
    """How to load a GGUF model."""

    model_path: Path
    n_ctx: int = 4096  # per sequence
    n_threads: int | None = None  # None: every core this process may run on
    n_batch: int = DEFAULT_BATCH
    n_gpu_layers: int = 0
    n_seq: int = 1  # sequences (concurrent requests) with a cache of their own


@dataclass(frozen=True)
class Evaluation:
    """Logits for the requested rows of one evaluation, and how much of the prefix was reused."""

    logits: np.ndarray  # [rows, vocab] float32; row i predicts token first_logit_row + i + 1
    cached_tokens: int
    reading_seconds: float = 0.0  # spent decoding the uncached tokens before the returned rows


@dataclass(frozen=True)
class Step:
    """One sequence's part of a shared decode: its whole context, and the first row whose logits it wants."""

    seq: int
    tokens: Sequence[int]
    first_logit_row: int


@dataclass(frozen=True)
class _Row:
    """One token placed in a batch."""

    step: int  # index of the Step it belongs to
    seq: int
    position: int
    token: int
    out: int  # its row in the step's returned logits; -1 where none is returned

    @property
    def wanted(self) -> bool:
        """Whether its logits are returned."""
        return self.out >= 0


class LlamaEngine:
    """A llama.cpp model with n_seq KV-cached sequences; evaluates token ids and returns chosen logit rows."""

    def __init__(self, options: EngineOptions) -> None:
        threads = options.n_threads or usable_cores()
        self.options = options
        self._llama = Llama(model_path=str(options.model_path), n_ctx=LOADER_CTX, n_batch=LOADER_CTX,
                            n_threads=threads, n_gpu_layers=options.n_gpu_layers, verbose=False)
        # llama-cpp-python's own context has one sequence; ours is built from the context parameters.
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = options.n_ctx * options.n_seq  # split evenly between the sequences' streams
        params.n_batch = params.n_ubatch = options.n_batch
        params.n_seq_max = options.n_seq
        params.kv_unified = False
        # As llama-cpp-python's loader does (same logits). On the CPU flash attention skips the cache's padding
        # to 256 cells but costs more a cell: measured 0-3 % faster up to 400 tokens, 15 % slower at 2,000.
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        params.n_threads = params.n_threads_batch = threads
        self._ctx = LlamaContext(model=self._llama._model, params=params, verbose=False)
        self._memory = llama_cpp.llama_get_memory(self._ctx.ctx)
        self._batch = LlamaBatch(n_tokens=options.n_batch, embd=0, n_seq_max=1, verbose=False)
        self._held: list[list[int]] = [[] for _ in range(options.n_seq)]
        self.vocabulary = LlamaVocabulary(self._llama._model, dict(self._llama.metadata))
        self.n_vocab: int = self.vocabulary.n_vocab
        self.n_ctx: int = options.n_ctx
        self.n_seq: int = options.n_seq
        self.threads: int = threads

    def held(self, seq: int) -> list[int]:
        """The tokens sequence `seq` holds in its cache."""
        return self._held[seq]

    # -- evaluation ---------------------------------------------------------------------------

    def check(self, tokens: Sequence[int], first_logit_row: int) -> None:
        """Raise the client's error for a context this engine cannot evaluate."""
        if not tokens:
            raise BadRequestError("no input tokens")
        if len(tokens) > self.n_ctx:
            raise ContextOverflowError(f"{len(tokens)} tokens exceed the context size of {self.n_ctx}")
        if not 0 <= first_logit_row < len(tokens):
            raise BadRequestError(f"logit row {first_logit_row} is outside 0..{len(tokens) - 1}")
        if min(tokens) < 0 or max(tokens) >= self.n_vocab:  # min and max scan in C: this runs every step
            bad = next(t for t in tokens if not 0 <= t < self.n_vocab)
            raise BadRequestError(f"token id {bad} is outside the vocabulary 0..{self.n_vocab - 1}")

    def evaluate(self, seq: int, tokens: Sequence[int], first_logit_row: int) -> Evaluation:
        """Evaluate `tokens` in sequence `seq`, reusing its cached prefix; logits for rows >= first_logit_row.

        llama.cpp's logits for a row depend on how the sequence was split into batches (a row
        evaluated together with its whole context differs from one evaluated after a cached
        prefix, by up to ~0.5 logits on Qwen2.5 Q4_K_M). So the uncached prefix is evaluated first
        and the returned rows then as one batch of their own, whatever was cached: a request whose
        own rounds built its cache gets the same logits cold or warm, and seeded requests reproduce.
        A prefix cached by another request keeps the split it was computed in, so near-tie logits
        can still move with what was cached before.
        """
        return self.evaluate_steps([Step(seq, tokens, first_logit_row)])[0]

    def evaluate_steps(self, steps: Sequence[Step]) -> list[Evaluation]:
        """Evaluate several sequences' new tokens: each prefix on its own, the returned rows in shared decodes.

        Faster than one call each when many sequences advance a token at a time (drafting).
        """
        for step in steps:
            self.check(step.tokens, step.first_logit_row)
        if len({step.seq for step in steps}) != len(steps):
            raise ValueError("each sequence may appear once in a shared decode")
        reused = [self._reuse(s.seq, s.tokens, s.first_logit_row) for s in steps]
        rows = [_Row(i, s.seq, p, s.tokens[p], p - s.first_logit_row)
                for i, (s, start) in enumerate(zip(steps, reused)) for p in range(start, len(s.tokens))]
        # The returned rows go straight into one array a step: llama.cpp overwrites its logits at the next decode.
        logits = [np.empty((len(s.tokens) - s.first_logit_row, self.n_vocab), np.float32) for s in steps]
        # Each step's prefix in a decode of its own, then every step's returned rows together: a
        # row's cache values depend on the batch it was computed in, so only the returned rows are
        # shared (one a step when drafting, and a single row per sequence was measured to give the
        # same logits alone or beside others), and a step gets the logits it would get alone.
        prefixes = [[r for r in rows if r.step == i and not r.wanted] for i in range(len(steps))]
        reading = [0.0] * len(steps)
        for index, prefix in enumerate(prefixes):
            if prefix:
                started = time.perf_counter()
                self._decode(prefix, logits)
                reading[index] = time.perf_counter() - started
        self._decode([r for r in rows if r.wanted], logits)
        return [Evaluation(returned, cached, seconds)
                for returned, cached, seconds in zip(logits, reused, reading, strict=True)]

    def fork(self, source: int, target: int, length: int) -> None:
        """Make sequence `target` hold the first `length` tokens of `source` (a cache copy, no decoding)."""
        if source == target:
            raise ValueError("a sequence cannot be forked into itself")
        # Between separate cache streams llama.cpp copies whole sequences only: copy, then cut.
        llama_cpp.llama_memory_seq_rm(self._memory, target, -1, -1)
        llama_cpp.llama_memory_seq_cp(self._memory, source, target, -1, -1)
        self._held[target] = list(self._held[source])
        self._truncate(target, length)

    def _reuse(self, seq: int, tokens: Sequence[int], first_logit_row: int) -> int:
        """Drop what `seq` holds beyond the prefix shared with `tokens`; return the length kept."""
        # Rows whose logits we return must be computed now, so reuse stops at the first of them.
        reused = min(common_prefix_length(self._held[seq], tokens), first_logit_row)
        self._truncate(seq, reused)
        return reused

    def next_row(self, seq: int, tokens: Sequence[int]) -> np.ndarray:
        """The logits after `tokens` (a plain step's row): a view of llama.cpp's buffer, valid until the next decode.

        Where `seq` holds all of `tokens` but the last, that token is decoded alone, as `evaluate` would, without
        copying the row out; otherwise this is `evaluate`'s last row.
        """
        held, token = self._held[seq], tokens[-1]
        if not (len(tokens) == len(held) + 1 <= self.n_ctx and 0 <= token < self.n_vocab and held == tokens[:-1]):
            return self.evaluate(seq, tokens, len(tokens) - 1).logits[0]
        self._run_batch([_Row(0, seq, len(held), token, 0)])
        return np.ctypeslib.as_array(self._ctx.get_logits_ith(0), shape=(self.n_vocab,))

    def _decode(self, rows: list[_Row], logits: list[np.ndarray]) -> None:
        """Decode rows in chunks of n_batch, copying each wanted row's logits into its step's array."""
        for start in range(0, len(rows), self.options.n_batch):
            chunk = rows[start : start + self.options.n_batch]
            self._run_batch(chunk)
            for index, row in enumerate(chunk):
                if row.wanted:
                    decoded = np.ctypeslib.as_array(self._ctx.get_logits_ith(index), shape=(self.n_vocab,))
                    logits[row.step][row.out] = decoded

    def _run_batch(self, chunk: Sequence[_Row]) -> None:
        """One llama_decode of the chunk; each sequence then holds its rows' tokens."""
        self._fill_batch(chunk)
        try:
            self._ctx.decode(self._batch)
        except RuntimeError:
            for row in chunk:  # what this chunk may have written is forgotten
                self._truncate(row.seq, min(row.position, len(self._held[row.seq])))
            raise
        for row in chunk:
            self._held[row.seq].append(row.token)

    def _fill_batch(self, chunk: Sequence[_Row]) -> None:
        batch = self._batch.batch
        batch.n_tokens = len(chunk)
        for i, row in enumerate(chunk):
            batch.token[i] = row.token
            batch.pos[i] = row.position
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = row.seq
            batch.logits[i] = row.wanted

    def _truncate(self, seq: int, length: int) -> None:
        """Forget what `seq` holds from `length` on, in the KV cache and in our record."""
        if length >= len(self._held[seq]):
            return
        if not llama_cpp.llama_memory_seq_rm(self._memory, seq, length, -1):
            # Some architectures (recurrent ones) cannot drop a suffix: start the sequence over.
            llama_cpp.llama_memory_seq_rm(self._memory, seq, -1, -1)
            length = 0
        del self._held[seq][length:]

    def close(self) -> None:
        """Free the native model, context and batch."""
        self._batch.close()
        self._ctx.close()
        self._llama.close()

