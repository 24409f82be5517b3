"""The verifier's model: its engine thread, its sequences, and whether concurrent requests share decodes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing, asynccontextmanager
from functools import partial

from proxy.engine.batcher import StepBatcher
from proxy.engine.llama import Evaluation, LlamaEngine
from proxy.engine.runner import EngineRunner
from proxy.engine.sequences import SequenceLeases, SequencePool
from proxy.verifier.plain import PlainSteps


class VerifierModel:
    """One loaded GGUF serving several requests at once, each in a sequence of its own."""

    def __init__(self, engine: LlamaEngine, *, shared_decode: bool = False, max_waiting: int | None = None) -> None:
        self.engine = engine
        self.vocabulary = engine.vocabulary
        self.shared_decode = shared_decode
        self._runner = EngineRunner(engine)
        # Off by default: a request's returned rows are then evaluated as a batch of their own, so
        # its logits do not depend on what else runs. On: concurrent requests' rows share decodes
        # (more throughput; logits, and so near-tie outputs, then depend on the load).
        self._batcher = StepBatcher(self._runner) if shared_decode else None
        self._pool = SequencePool(SequenceLeases(engine.n_seq, engine.held), max_waiting=max_waiting)

    async def evaluate(self, seq: int, tokens: Sequence[int], first_logit_row: int) -> Evaluation:
        """Logits for rows >= first_logit_row of tokens, evaluated in sequence `seq`."""
        if self._batcher is not None:
            return await self._batcher.evaluate(seq, tokens, first_logit_row)
        return await self._runner.run(self.engine.evaluate, seq, tokens, first_logit_row)

    async def decode_plain(self, seq: int, steps: PlainSteps) -> AsyncIterator[int]:
        """Decode on from `steps` in sequence `seq`, yielding each token as it is picked."""
        if steps.limit <= 0:
            return
        if self._batcher is None:  # each step picks its token on the engine's thread and queues the next
            async with aclosing(self._runner.chain(partial(self._step, seq, steps))) as tokens:
                async for token in tokens:
                    yield token
            return
        more = True
        while more:  # each step shares a decode with the other requests' steps
            row = steps.known_row()
            if row is None:
                row = (await self._batcher.evaluate(seq, steps.context, len(steps.context) - 1)).logits[0]
            token, more = steps.take(row)
            yield token

    def _step(self, seq: int, steps: PlainSteps) -> tuple[int, bool]:
        """One plain step on the engine's thread."""
        row = steps.known_row()
        if row is None:
            row = self.engine.next_row(seq, steps.context)  # read before anything else decodes
        return steps.take(row)

    @asynccontextmanager
    async def sequence(self, context: Sequence[int]) -> AsyncIterator[int]:
        """A sequence for one request (the free one sharing most of its context), waiting while all are in use.

        Raises OverloadedError when all are in use and the queue of waiting requests is full. A request
        cancelled meanwhile (its client left) gives its sequence back at once: whatever it queued on the
        engine's thread and had not started is dropped, so the engine stops at the step it is on.
        """
        lease = await self._pool.acquire(context)
        try:
            if lease.copy_from is not None:
                await self._runner.run(self.engine.fork, lease.copy_from, lease.seq, lease.shared)
            yield lease.seq
        finally:
            self._pool.release(lease.seq)

    def occupancy(self) -> tuple[int, int]:
        """(sequences held by requests now, sequences)."""
        return self.engine.n_seq - self._pool.leases.free, self.engine.n_seq

    @property
    def waiting(self) -> int:
        """Requests waiting for a sequence."""
        return self._pool.waiting

    def close(self) -> None:
        """Stop the engine thread and free the model."""
        self._runner.close()
