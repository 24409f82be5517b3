"""A request's Target, recording the target's raw log-probs at every position it scores or decodes.

A request that asks for log-probs is answered from the verification answers themselves: each
score() and generate() records, per absolute position of the context, the log-prob entry of the
position (the token scored or sampled there, and the top-N). Rounds with several candidate paths
score one position under different prefixes, so a record is kept with the prefix it was scored
after; the emitter looks each emitted token up by its position and the tokens before it, the latest
matching record winning (a later scoring of a position supersedes an earlier one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from proxy.drafting.base import Draft
from proxy.errors import UpstreamUnavailableError
from proxy.sampling.processors import SamplingParams
from proxy.targets.base import PositionLogprobs, ScorePlan, Scores, Target
from proxy.wire.logprobs import TokenLogprobs


@dataclass(frozen=True)
class _Record:
    start: int  # where the call's context ended
    prefix: tuple[int, ...]  # the tokens between start and the position, as the call had them
    scored: PositionLogprobs


class LogprobRecorder:
    """The route's Target for one request, remembering the raw log-probs of what it scored and decoded."""

    def __init__(self, target: Target, prompt_ids: Sequence[int], top_n: int) -> None:
        self.target = target
        self.prompt = tuple(prompt_ids)
        self.top_n = top_n  # top log-probs asked of the target per position: the route's top-N
        self._records: dict[int, list[_Record]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)  # the rest of the Target protocol is the route's target's own

    def _record(self, start: int, tokens: Sequence[int], positions: Sequence[PositionLogprobs]) -> None:
        """Position start + i was scored after tokens[:i] (tokens: the draft or the decoded chunk)."""
        for index, scored in enumerate(positions):
            self._records.setdefault(start + index, []).append(_Record(start, tuple(tokens[:index]), scored))

    async def score(self, context: list[int], draft: Draft, plan: ScorePlan) -> Scores:
        """The target's scores, their raw log-probs recorded."""
        scores = await self.target.score(context, draft, replace(plan, logprobs=True))
        if scores.positions is None:
            raise UpstreamUnavailableError("the upstream's verification answer holds no log-probs")
        self._record(len(context), draft.tokens, scores.positions)
        return scores

    async def generate(self, context: list[int], max_new_tokens: int, params: SamplingParams, seed: int,
                       client_headers: dict[str, str] | None = None, model: str | None = None) -> list[int]:
        """Plain decoding, each sampled token's log-prob and the top-N recorded."""
        tokens, positions = await self.target.generate_logprobs(context, max_new_tokens, params, seed, self.top_n,
                                                                client_headers, model)
        self._record(len(context), tokens, positions)
        return tokens

    def lookup(self, completion: Sequence[int]) -> TokenLogprobs:
        """The last emitted token's log-prob and the top-N where it stands, after the completion before it."""
        position = len(self.prompt) + len(completion) - 1
        token = completion[-1]
        # Every record after the same tokens scored the same row (candidate paths share their first positions):
        # the latest gives the top-N, any of them the token's own log-prob.
        matching = [record.scored for record in reversed(self._records.pop(position, []))
                    if record.start >= len(self.prompt)
                    and tuple(completion[record.start - len(self.prompt):-1]) == record.prefix]
        if not matching:
            raise UpstreamUnavailableError(f"no log-probs were recorded for the token at position {position}")
        known: dict[int, float] = {}
        for scored in reversed(matching):  # the latest last: it supersedes
            known.update(zip(scored.top_ids.tolist(), scored.top_logprobs.tolist()))
            if scored.token_id is not None and scored.token_logprob is not None:
                known[scored.token_id] = scored.token_logprob
        if token not in known:
            raise UpstreamUnavailableError(f"the target's answer holds no log-prob for emitted token {token}")
        top = tuple(zip(matching[0].top_ids.tolist(), matching[0].top_logprobs.tolist()))
        return TokenLogprobs(token, known[token], top)
