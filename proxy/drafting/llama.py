"""The llama.cpp draft model: propose K tokens after a context, with their draft distributions.

Each request in flight drafts in a sequence of its own, leased for its lifetime (`reserve` and
`release`), so its KV cache persists across rounds: rejected drafts are rolled back, not
re-evaluated, because the next `propose` shares the accepted prefix with what the sequence holds.
Concurrent requests' draft steps share one llama.cpp decode per step (continuous batching);
drafting stays exact because each token is sampled from the distribution computed for it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import numpy as np

from proxy.drafting.base import Draft, DraftPlan
from proxy.engine.batcher import StepBatcher
from proxy.engine.gate import CoreGate
from proxy.engine.llama import EngineOptions, LlamaEngine
from proxy.engine.prefix import common_prefix_length
from proxy.engine.runner import EngineRunner
from proxy.engine.sequences import SequenceLeases
from proxy.sampling.draft_rows import DraftRows, draft_row
from proxy.sampling.rejection import sample


class LlamaDrafter:
    """A GGUF draft model behind async calls; its engine thread, sequences and batching are private."""

    def __init__(self, engine: LlamaEngine) -> None:
        self._engine = engine
        self._runner = EngineRunner(engine)
        self._batcher = StepBatcher(self._runner)
        self._leases = SequenceLeases(engine.n_seq, engine.held)
        self._sequences: dict[str, int] = {}  # request id -> its sequence
        self._copies: dict[str, asyncio.Future[None]] = {}  # request id -> its sequence's start, being copied
        self.vocabulary = engine.vocabulary
        self.looks_up = False

    @classmethod
    def load(cls, options: EngineOptions) -> LlamaDrafter:
        """Load a GGUF as a draft model (blocking: call at start-up)."""
        return cls(LlamaEngine(options))

    def reserve(self, request_id: str, context: Sequence[int], *, tenant: str = "") -> bool:
        """Lease a sequence for a request (the one sharing most of its context); False when all are in use."""
        lease = self._leases.acquire(context)
        if lease is None:
            return False
        self._sequences[request_id] = lease.seq
        if lease.copy_from is not None:  # queued now, so it runs before anything later touches the source
            self._copies[request_id] = self._runner.submit(self._engine.fork, lease.copy_from, lease.seq,
                                                           lease.shared)
        return True

    def release(self, request_id: str) -> None:
        """End a request's lease; its sequence keeps its cache for the next request that shares it."""
        seq = self._sequences.pop(request_id, None)
        self._copies.pop(request_id, None)
        if seq is not None:
            self._leases.release(seq)

    def take_turns(self, gate: CoreGate) -> None:
        """Compute only in the draft's turns at the gate: the target shares this machine's cores."""
        self._runner.gate = gate

    def occupancy(self) -> tuple[int, int]:
        """(sequences in use, sequences)."""
        return self._engine.n_seq - self._leases.free, self._engine.n_seq

    def prefill(self, request_id: str, context: Sequence[int]) -> asyncio.Future[None] | None:
        """Start evaluating the context in the request's sequence (None when the sequence holds it already)."""
        held = self._engine.held(self._sequences[request_id])
        if request_id not in self._copies and common_prefix_length(held, context) >= len(context) - 1:
            return None
        return asyncio.ensure_future(self._prefill(request_id, context))

    async def _prefill(self, request_id: str, context: Sequence[int]) -> None:
        await self._batcher.evaluate(await self._sequence(request_id), context, len(context) - 1)

    def read(self, request_id: str, context: Sequence[int], tokens: Sequence[int]) -> asyncio.Future[list[int]]:
        """Start evaluating tokens after context in the request's sequence; the greedy choice before each token."""
        return asyncio.ensure_future(self._read(request_id, [*context, *tokens], len(context) - 1, len(tokens)))

    async def _read(self, request_id: str, tokens: list[int], first_row: int, n: int) -> list[int]:
        logits = (await self._batcher.evaluate(await self._sequence(request_id), tokens, first_row)).logits
        return [int(token) for token in np.argmax(logits[:n], axis=-1)]

    async def _sequence(self, request_id: str) -> int:
        """The request's sequence, once the copy of its shared start (if any) is done."""
        if (copy := self._copies.pop(request_id, None)) is not None:
            await copy
        return self._sequences[request_id]

    async def propose(self, context: Sequence[int], plan: DraftPlan) -> Draft:
        """Draft up to plan.k tokens after context (fewer if the draft ends generation)."""
        seq = await self._sequence(plan.request_id)
        started, reading = time.perf_counter(), 0.0
        context = list(context)
        tokens: list[int] = []
        ids: list[np.ndarray] = []
        rows: list[np.ndarray] = []
        for _ in range(plan.k):
            evaluation = await self._batcher.evaluate(seq, context, len(context) - 1)
            reading += evaluation.reading_seconds  # catching up on what it had not read is not drafting
            logits = evaluation.logits[0]
            candidates, probs = draft_row(logits, plan.params, plan.order, plan.support_size)
            token = int(candidates[sample(probs, plan.rng)])  # drawn from exactly the row the Draft carries
            tokens.append(token)
            ids.append(candidates)
            rows.append(probs)
            context.append(token)
            if self.vocabulary.is_end_of_generation(token):
                break
        drafting = time.perf_counter() - started - reading
        return Draft(tuple(tokens), DraftRows.from_rows(ids, rows, self._engine.n_vocab),
                     seconds_per_token=drafting / len(tokens) if tokens else None)

    def fits(self, n_tokens: int) -> bool:
        """Whether a context of n_tokens (plus a round of drafts) fits a sequence."""
        return n_tokens < self._engine.n_ctx

    def close(self) -> None:
        """Stop the engine thread and free the model."""
        self._runner.close()
