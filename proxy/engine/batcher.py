"""Continuous batching: concurrent callers' steps, each in its own sequence, share one decode.

While a decode runs, new steps queue; when it ends, everything queued goes into the next one. A
caller that drafts token after token in lockstep with others therefore costs one shared decode
per step instead of one decode each.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from proxy.engine.llama import Evaluation, Step
from proxy.engine.runner import EngineRunner


class StepBatcher:
    """Gathers `evaluate` calls into `LlamaEngine.evaluate_steps` on the engine's thread."""

    def __init__(self, runner: EngineRunner) -> None:
        self._runner = runner
        self._queued: list[tuple[Step, asyncio.Future[Evaluation]]] = []
        self._draining: asyncio.Task[None] | None = None

    async def evaluate(self, seq: int, tokens: Sequence[int], first_logit_row: int) -> Evaluation:
        """Evaluate tokens in sequence `seq` in the next shared decode."""
        self._runner.engine.check(tokens, first_logit_row)  # a bad step must not fail the others
        future: asyncio.Future[Evaluation] = asyncio.get_running_loop().create_future()
        self._queued.append((Step(seq, list(tokens), first_logit_row), future))
        if self._draining is None:
            self._draining = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            while self._queued:
                # A caller that went away (a client that hung up) has cancelled its future: its step is
                # dropped, and its sequence may already serve another request.
                batch, self._queued = [(s, f) for s, f in self._queued if not f.done()], []
                if not batch:
                    continue
                try:
                    results = await self._runner.run(self._runner.engine.evaluate_steps, [s for s, _ in batch])
                except Exception as exc:  # every caller in the decode sees its failure
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), result in zip(batch, results):
                    if not future.done():  # a caller that went away has cancelled its future
                        future.set_result(result)
                await asyncio.sleep(0)  # let the callers just answered queue their next steps
        finally:
            self._draining = None
