"""The `sglang` protocol: SGLang's native /generate, which our verifier speaks too.

One request per round: `input_ids = context + drafts`, `logprob_start_len = L - 1`, so the
answer starts at the last context token (a null entry) and then scores d_1..d_K; the bonus
position comes back as the one generated token (`max_new_tokens: 1`, temperature 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from proxy.drafting.base import Draft
from proxy.errors import UpstreamUnavailableError
from proxy.sampling.processors import SamplerOrder, SamplingParams
from proxy.sampling.rejection import KnownSupport
from proxy.targets.base import PositionLogprobs, ScorePlan, Scores, Verification
from proxy.targets.topn import exactness_problem, support_from_top_n
from proxy.targets.upstream import Upstream, UpstreamStatusError
from proxy.wire.request import CHAT

DRAFT_SUPPORT_EXTENSION = "draft_support_ids"


def _top(entries: Any) -> tuple[np.ndarray, np.ndarray]:
    """Parse [[logprob, id, text], ...] into id and logprob arrays."""
    if not isinstance(entries, list) or not entries:
        raise UpstreamUnavailableError("upstream returned no top logprobs")
    ids = np.array([int(e[1]) for e in entries], dtype=np.int64)
    logprobs = np.array([float(e[0]) for e in entries], dtype=np.float64)
    return ids, logprobs


def parse_verification(answer: Any, draft_tokens: Sequence[int]) -> Verification:
    """Turn a /generate answer into per-position logprobs; raise on anything malformed."""
    try:
        meta = answer["meta_info"]
        actual = meta["input_token_logprobs"][1:]
        tops = meta["input_top_logprobs"][1:]
        positions = []
        for token, entry, top in zip(draft_tokens, actual, tops, strict=True):
            if int(entry[1]) != token:
                raise UpstreamUnavailableError("upstream scored a different token than the draft")
            ids, logprobs = _top(top)
            positions.append(PositionLogprobs(token, float(entry[0]), ids, logprobs))
        ids, logprobs = _top(meta["output_top_logprobs"][0])
        positions.append(PositionLogprobs(None, None, ids, logprobs))
        return Verification(tuple(positions), int(answer["output_ids"][0]), int(meta.get("cached_tokens", 0)))
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise UpstreamUnavailableError(f"upstream sent a malformed verification answer ({type(exc).__name__})") from exc


def parse_support(answer: Any, draft_tokens: Sequence[int], support_ids: list[list[int]],
                  draft_probs: np.ndarray) -> KnownSupport:
    """Turn a /generate answer with `draft_support` into the sampler's KnownSupport."""
    try:
        extension = answer["meta_info"]["draft_support"]
        bonus = int(answer["output_ids"][0])
        k = len(draft_tokens)
        target = [np.asarray(row, dtype=np.float64) for row in extension["target_probs"]]
        outside_mass = [*map(float, extension["outside_mass"]), 1.0]  # the bonus row: all "outside"
        outside_tokens = [-1 if t is None else int(t) for t in extension["outside_tokens"]] + [bonus]
        if not len(target) == len(outside_mass) - 1 == len(outside_tokens) - 1 == k:
            raise ValueError("draft_support has the wrong length")
        draft = [draft_probs[position, ids] for position, ids in enumerate(support_ids)]
        return KnownSupport.from_rows([*support_ids, []], [*target, []], draft, np.array(outside_mass),
                                      np.array(outside_tokens))
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise UpstreamUnavailableError(f"upstream sent a malformed draft_support answer ({type(exc).__name__})") from exc


def sampling_body(params: SamplingParams, max_new_tokens: int, seed: int) -> dict[str, Any]:
    """SGLang's sampling_params for the request's parameters (top_k -1 = off)."""
    return {"max_new_tokens": max_new_tokens, "temperature": params.temperature, "top_k": params.top_k or -1,
            "top_p": params.top_p, "min_p": params.min_p, "sampling_seed": seed}


class SGLangTarget:
    """Verification and tokenization against an SGLang-protocol server."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.exact_support = False  # set by probe(): our verifier returns exact residual draws

    @property
    def order(self) -> SamplerOrder:
        """How the server turns logits into its sampling distribution."""
        # Our verifier samples like llama.cpp (proxy/verifier/generate.py); SGLang filters jointly
        # after temperature (python/sglang/srt/layers/sampler.py).
        return SamplerOrder.TRUNCATE_THEN_TEMPERATURE if self.exact_support else SamplerOrder.TEMPERATURE_THEN_JOINT_TRUNCATE

    async def probe(self) -> dict[str, Any]:
        """Read /get_model_info and learn whether the server offers the draft-support extension."""
        try:
            info = await self.upstream.get_json("/get_model_info")
        except UpstreamStatusError:
            return {}
        if isinstance(info, dict):
            self.exact_support = DRAFT_SUPPORT_EXTENSION in (info.get("speculoos_extensions") or [])
            return info
        return {}

    def exactness_problem(self, params: SamplingParams, top_n: int) -> str | None:
        """None through the draft-support extension; otherwise what top-N log-probs allow."""
        return None if self.exact_support else exactness_problem(params, top_n, self.order)

    async def score(self, context: list[int], draft: Draft, plan: ScorePlan) -> Scores:
        """One /generate call: exact residual draws through the extension, else top-N folded locally."""
        if self.exact_support:
            return Scores(await self._score_support(context, draft, plan))
        verification = await self._score_top_n(context, draft.tokens, plan)
        return Scores(*support_from_top_n(verification, draft.tokens, draft.probs, plan.params, self.order))

    async def _score_support(self, context: list[int], draft: Draft, plan: ScorePlan) -> KnownSupport:
        """The draft-support extension: the target's probabilities on every draft candidate, and one
        target token drawn outside them, per position."""
        support_ids = [np.flatnonzero(row).tolist() for row in draft.probs]
        body = {
            "input_ids": context + list(draft.tokens),
            "sampling_params": sampling_body(plan.params, 1, plan.seed),
            "logprob_start_len": len(context) - 1,
            DRAFT_SUPPORT_EXTENSION: support_ids,
        }
        answer = await self.upstream.post_json("/generate", body, client_headers=plan.client_headers)
        return parse_support(answer, draft.tokens, support_ids, draft.probs)

    async def _score_top_n(self, context: list[int], draft_tokens: Sequence[int], plan: ScorePlan) -> Verification:
        """Raw top-N log-probs at every draft position and the bonus position."""
        body = {
            "input_ids": context + list(draft_tokens),
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            "return_logprob": True,
            "logprob_start_len": len(context) - 1,
            "top_logprobs_num": plan.top_n,
            "return_text_in_logprobs": False,
        }
        answer = await self.upstream.post_json("/generate", body, client_headers=plan.client_headers)
        return parse_verification(answer, draft_tokens)

    async def generate(self, context: list[int], max_new_tokens: int, params: SamplingParams, seed: int,
                       client_headers: dict[str, str] | None = None) -> list[int]:
        """Plain decoding on the target: up to max_new_tokens sampled by the server itself."""
        body = {
            "input_ids": context,
            "sampling_params": sampling_body(params, max_new_tokens, seed),
        }
        answer = await self.upstream.post_json("/generate", body, client_headers=client_headers)
        try:
            return [int(t) for t in answer["output_ids"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise UpstreamUnavailableError("upstream sent a malformed /generate answer") from exc

    async def prompt_ids(self, body: dict, kind: str, client_headers: dict[str, str] | None = None) -> tuple[list[int], int]:
        """Prompt ids from the server's /tokenize (its own chat template), and its context size."""
        if kind == CHAT:
            request = {"messages": body["messages"], "add_generation_prompt": True, "add_special_tokens": False}
        elif isinstance(body["prompt"], list):
            return list(body["prompt"]), await self.context_size(client_headers)
        else:
            request = {"prompt": body["prompt"]}
        answer = await self.upstream.post_json("/tokenize", request, client_headers=client_headers)
        try:
            return [int(t) for t in answer["tokens"]], int(answer["max_model_len"])
        except (KeyError, TypeError, ValueError) as exc:
            raise UpstreamUnavailableError("upstream sent a malformed /tokenize answer") from exc

    async def context_size(self, client_headers: dict[str, str] | None = None) -> int:
        """The server's context size, from a one-token /tokenize call."""
        answer = await self.upstream.post_json("/tokenize", {"prompt": ""}, client_headers=client_headers)
        return int(answer["max_model_len"])
