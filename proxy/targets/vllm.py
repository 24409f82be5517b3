"""The `vllm` protocol: vLLM's /v1/completions with prompt logprobs over a token-id prompt.

One request per round: `prompt = context + drafts` (token ids, used verbatim), `max_tokens: 1`,
temperature 0. vLLM scores every prompt position: entry 0 is null and entry j predicts token j,
so entries L..L+K-1 score d_1..d_K; the one generated token is the bonus. Each entry holds the
top-N plus the token that stands there, an extra entry when that token is outside the top-N.
A request with prompt logprobs does not read vLLM's prefix cache: every round re-prefills the
whole context. Shapes: vllm/entrypoints/openai/completion/ in vLLM.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from proxy.drafting.base import Draft
from proxy.errors import UpstreamUnavailableError
from proxy.sampling.processors import SamplerOrder, SamplingParams
from proxy.targets import checks
from proxy.targets.base import PositionLogprobs, ScorePlan, Scores, Verification
from proxy.targets.topn import exactness_problem, logprobs_problem, support_from_top_n
from proxy.targets.upstream import Upstream, UpstreamStatusError
from proxy.wire.request import CHAT, GenerationRequest

CLAMPED_NEG_INF = -9999.0  # vLLM writes max(logprob, -9999.0): -inf does not survive JSON
TOKEN_ID_PREFIX = "token_id:"  # output logprob keys with return_tokens_as_token_ids
# More than any vocabulary: vLLM answers 400 "... greater than max allowed: N" (sampling_params.py).
OVER_ANY_CAP = 1_000_000_000
MAX_ALLOWED = re.compile(r"max allowed: (\d+)")
# Chat-template settings vLLM's /tokenize shares with its chat endpoint (serve/tokenize/protocol.py).
CHAT_TEMPLATE_KEYS = ("add_generation_prompt", "continue_final_message", "add_special_tokens",
                      "chat_template", "chat_template_kwargs",
                      "tools")  # rendered whatever tool_choice is, unless --exclude-tools-when-tool-choice-none


@dataclass(frozen=True)
class VLLMInfo:
    """What probe() learns about the server."""

    version: str
    model: str
    max_model_len: int
    max_logprobs: int | None  # the --max-logprobs cap on top_n; None if the server did not say


def _logprob(value: Any, what: str) -> float:
    """A logprob from the wire, checked, with vLLM's clamp undone."""
    logprob = checks.logprob(value, what)
    return -np.inf if logprob <= CLAMPED_NEG_INF else logprob


def _position(entries: list[tuple[int, float]], top_n: int, actual: int, vocab_size: int | None,
              what: str) -> tuple[np.ndarray, np.ndarray]:
    """One position's top-N, checked: the top-N and, when it is outside them, the standing token (`actual`)."""
    known = dict(entries)
    if not top_n <= len(known) <= top_n + 1:
        raise checks.fail(f"{what} has {len(known)} log-probs where the top {top_n} were asked for")
    ids, logprobs = _top(known.items(), top_n, actual)
    scored = (actual, known[actual]) if actual in known else None
    checks.top_position(ids, logprobs, width=top_n, vocab_size=vocab_size, what=what, scored=scored)
    return ids, logprobs


def _top(entries: Iterable[tuple[int, float]], top_n: int, actual: int) -> tuple[np.ndarray, np.ndarray]:
    """Id and logprob arrays best first (ties to the lower id), without `actual` when it is an extra."""
    pairs = dict(entries)
    if len(pairs) > top_n:  # vLLM added the standing token beyond the top-N
        pairs.pop(actual, None)
    if not pairs:
        raise UpstreamUnavailableError("upstream returned no top logprobs")
    ids = np.fromiter(pairs.keys(), dtype=np.int64, count=len(pairs))
    logprobs = np.fromiter(pairs.values(), dtype=np.float64, count=len(pairs))
    order = np.lexsort((ids, -logprobs))
    return ids[order], logprobs[order]


def parse_verification(answer: Any, context_len: int, draft_tokens: Sequence[int], top_n: int, *,
                       vocab_size: int | None = None) -> Verification:
    """Turn a /v1/completions answer into per-position logprobs; raise on anything malformed or out of range
    (ids below `vocab_size` when given)."""
    try:
        choice = answer["choices"][0]
        prompt = choice["prompt_logprobs"]
        if prompt is not None and len(prompt) != context_len + len(draft_tokens):
            raise checks.fail(f"the answer scores {len(prompt)} prompt positions for a prompt of "
                              f"{context_len + len(draft_tokens)}")
        scored = prompt[context_len:]
        positions = []
        for index, (token, entry) in enumerate(zip(draft_tokens, scored, strict=True)):
            if str(token) not in entry:
                raise UpstreamUnavailableError("upstream did not score the draft token")
            what = f"draft position {index + 1}"
            pairs = [(checks.token_id(key, vocab_size, what), _logprob(value["logprob"], what))
                     for key, value in entry.items()]
            ids, logprobs = _position(pairs, top_n, token, vocab_size, what)
            positions.append(PositionLogprobs(token, dict(pairs)[token], ids, logprobs))
        checks.count(choice["token_ids"], 1, "the answer", "output ids")
        bonus = checks.token_id(choice["token_ids"][0], vocab_size, "the bonus token")
        checks.count(choice["logprobs"]["top_logprobs"], 1, "the bonus position", "rows")
        top = choice["logprobs"]["top_logprobs"][0]
        pairs = [(checks.token_id(key.removeprefix(TOKEN_ID_PREFIX), vocab_size, "the bonus position"),
                  _logprob(value, "the bonus position")) for key, value in top.items()]
        ids, logprobs = _position(pairs, top_n, bonus, vocab_size, "the bonus position")
        positions.append(PositionLogprobs(None, None, ids, logprobs))
        details = (answer.get("usage") or {}).get("prompt_tokens_details") or {}
        return Verification(tuple(positions), bonus, checks.tokens(details.get("cached_tokens") or 0, "cached_tokens"))
    except checks.MALFORMED as exc:
        raise UpstreamUnavailableError(f"upstream sent a malformed verification answer ({type(exc).__name__})") from exc


def parse_max_logprobs(message: str) -> int | None:
    """The cap from vLLM's "greater than max allowed: N" error, or None."""
    match = MAX_ALLOWED.search(message)
    return int(match.group(1)) if match else None


class VLLMTarget:
    """Verification and tokenization against a vLLM server."""

    order = SamplerOrder.TEMPERATURE_THEN_TRUNCATE  # vllm/v1/sample/sampler.py

    def __init__(self, upstream: Upstream, model: str | None = None) -> None:
        self.upstream = upstream
        self.model = model  # the served model id; discovered from /v1/models when None
        self.vocab_size: int | None = None  # the route's vocabulary: answered ids must lie below it
        self._max_model_len: int | None = None

    async def _model_card(self) -> dict[str, Any]:
        """The first entry of /v1/models, remembered as model id and context size."""
        answer = await self.upstream.get_json("/v1/models")
        try:
            card = answer["data"][0]
            self.model = self.model or str(card["id"])
            self._max_model_len = checks.tokens(card["max_model_len"], "/v1/models' context length", least=1)
            return card
        except checks.MALFORMED as exc:
            raise UpstreamUnavailableError("upstream sent a malformed /v1/models answer") from exc

    async def served_model(self) -> str:
        """The model id to name in requests."""
        if self.model is None:
            await self._model_card()
        return str(self.model)

    async def context_size(self) -> int:
        """The server's max_model_len."""
        if self._max_model_len is None:
            await self._model_card()
        return int(self._max_model_len or 0)

    async def probe(self) -> VLLMInfo:
        """Version, model, context size and the --max-logprobs cap (from the error a huge request gets)."""
        await self._model_card()
        version = await self.upstream.get_json("/version")
        body = {"model": await self.served_model(), "prompt": [0], "max_tokens": 1, "prompt_logprobs": OVER_ANY_CAP}
        try:
            await self.upstream.post_json("/v1/completions", body)
            max_logprobs = None
        except UpstreamStatusError as exc:
            max_logprobs = parse_max_logprobs(exc.message)
        try:
            return VLLMInfo(str(version["version"]), str(self.model), await self.context_size(), max_logprobs)
        except checks.MALFORMED as exc:
            raise UpstreamUnavailableError("upstream sent a malformed /version answer") from exc

    def exactness_problem(self, params: SamplingParams, top_n: int) -> str | None:
        """What top-N log-probs allow: vLLM returns no more."""
        return exactness_problem(params, top_n, self.order)

    def prompt_fields(self, kind: str) -> frozenset[str]:
        """What prompt_ids() hands to /tokenize: the chat template's settings, or whether to add special tokens."""
        return frozenset(CHAT_TEMPLATE_KEYS if kind == CHAT else ("add_special_tokens",))

    def prompt_problem(self, request: GenerationRequest) -> str | None:
        """None: vLLM's /tokenize takes prompts and conversations, and /v1/models gives the context length."""
        return None

    async def score(self, context: list[int], draft: Draft, plan: ScorePlan) -> Scores:
        """One /v1/completions call, its top-N folded with the draft into the sampler's support."""
        verification = await self.verify(context, list(draft.tokens), plan.top_n, plan.client_headers, plan.model)
        return Scores(*support_from_top_n(verification, draft.tokens, draft.probs, plan.params, self.order),
                      verification.positions)

    def logprobs_problem(self, params: SamplingParams, n: int, top_n: int) -> str | None:
        """vLLM returns raw log-probs (its default logprobs_mode), as the rounds' prompt log-probs are; a round
        samples among the ids they hold."""
        return logprobs_problem(params, n, top_n, sampled_within=True)

    async def verify(self, context: list[int], draft_tokens: list[int], top_n: int,
                     client_headers: dict[str, str] | None = None, model: str | None = None) -> Verification:
        """Score the drafts and get the bonus position in one /v1/completions call."""
        if top_n < 1:
            raise ValueError("top_n must be at least 1: the argmax comes from the top list")
        body = {
            "model": model or await self.served_model(),  # the client's (a LoRA adapter verifies as itself)
            "prompt": context + list(draft_tokens),
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": top_n,
            "logprobs": top_n,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
        }
        answer = await self.upstream.post_json("/v1/completions", body, client_headers=client_headers)
        return parse_verification(answer, len(context), draft_tokens, top_n, vocab_size=self.vocab_size)

    async def generate(self, context: list[int], max_new_tokens: int, params: SamplingParams, seed: int,
                       client_headers: dict[str, str] | None = None, model: str | None = None) -> list[int]:
        """Plain decoding on the target: up to max_new_tokens sampled by vLLM itself (EOS included)."""
        answer = await self._generate(context, max_new_tokens, params, seed, None, client_headers, model)
        return self._plain_tokens(answer, max_new_tokens)

    async def generate_logprobs(self, context: list[int], max_new_tokens: int, params: SamplingParams, seed: int,
                                top_n: int, client_headers: dict[str, str] | None = None,
                                model: str | None = None) -> tuple[list[int], tuple[PositionLogprobs, ...]]:
        """Plain decoding with each sampled token's raw log-prob and the top `top_n`."""
        answer = await self._generate(context, max_new_tokens, params, seed, top_n, client_headers, model)
        tokens = self._plain_tokens(answer, max_new_tokens)
        try:
            logprobs = answer["choices"][0]["logprobs"]
            checks.count(logprobs["top_logprobs"], len(tokens), "a plain completion's log-probs", "rows")
            positions = []
            for index, (token, top) in enumerate(zip(tokens, logprobs["top_logprobs"], strict=True)):
                what = f"plain token {index + 1}"
                pairs = [(checks.token_id(key.removeprefix(TOKEN_ID_PREFIX), self.vocab_size, what),
                          _logprob(value, what)) for key, value in top.items()]
                ids, values = _position(pairs, top_n, token, self.vocab_size, what)
                if token not in dict(pairs):
                    raise checks.fail(f"{what} has no log-prob for the sampled token")
                positions.append(PositionLogprobs(token, dict(pairs)[token], ids, values))
            return tokens, tuple(positions)
        except checks.MALFORMED as exc:
            raise UpstreamUnavailableError(f"upstream sent malformed log-probs ({type(exc).__name__})") from exc

    async def _generate(self, context: list[int], max_new_tokens: int, params: SamplingParams, seed: int,
                        top_n: int | None, client_headers: dict[str, str] | None, model: str | None) -> Any:
        body = {
            "model": model or await self.served_model(),  # the client's (a LoRA adapter verifies as itself)
            "prompt": context,
            "max_tokens": max_new_tokens,
            "temperature": params.temperature,
            "top_k": params.top_k or -1,
            "top_p": params.top_p,
            "min_p": params.min_p,
            "seed": seed,
            "return_token_ids": True,
        }
        if top_n is not None:
            body.update(logprobs=top_n, return_tokens_as_token_ids=True)
        return await self.upstream.post_json("/v1/completions", body, client_headers=client_headers)

    def _plain_tokens(self, answer: Any, max_new_tokens: int) -> list[int]:
        try:
            tokens = checks.token_ids(answer["choices"][0]["token_ids"], self.vocab_size, "a plain completion")
        except checks.MALFORMED as exc:
            raise UpstreamUnavailableError("upstream sent a malformed /v1/completions answer") from exc
        if len(tokens) > max_new_tokens:
            raise checks.fail(f"a plain completion has {len(tokens)} tokens where at most {max_new_tokens} were "
                              "asked for")
        return tokens

    async def prompt_ids(self, body: dict, kind: str,
                         client_headers: dict[str, str] | None = None) -> tuple[list[int], int]:
        """Prompt ids from the server's /tokenize (its own chat template), and its context size."""
        if kind == CHAT:
            request = {"messages": body["messages"], "add_generation_prompt": True, "add_special_tokens": False,
                       **{key: body[key] for key in CHAT_TEMPLATE_KEYS if key in body}}
        elif isinstance(body["prompt"], list):
            return list(body["prompt"]), await self.context_size()
        else:
            request = {"prompt": body["prompt"], "add_special_tokens": body.get("add_special_tokens", True)}
        request["model"] = body.get("model") or await self.served_model()
        answer = await self.upstream.post_json("/tokenize", request, client_headers=client_headers)
        try:
            return (checks.token_ids(answer["tokens"], self.vocab_size, "the prompt's tokenization"),
                    checks.tokens(answer["max_model_len"], "/tokenize's context length", least=1))
        except checks.MALFORMED as exc:
            raise UpstreamUnavailableError("upstream sent a malformed /tokenize answer") from exc
