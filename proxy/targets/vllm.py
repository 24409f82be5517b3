"""The `vllm` protocol: rounds over vLLM's /v1/completions with token-id prompts, used verbatim.

A round asks, where the server's prefix cache is on, one greedy token after each of its K + 1 prefixes
(`context`, `context + d_1`, ..., `context + d_1..d_K`) in one request: vLLM reads the cached context and
computes only each prompt's tail, so a round costs O(K) tokens. Elsewhere it asks prompt log-probs over
`context + drafts`, which never read the cache: every round re-prefills the whole context. The shapes are
read in vllm_answers.py, the server's capabilities in vllm_probe.py, what rounds follow of its sampling (a
repetition penalty) in vllm_sampling.py. Every call names each field vLLM would otherwise fill from the model's
generation_config: rounds as vllm_sampling.py says, plain chunks with the request's fields (as the server's
defaults completed them).
"""

from __future__ import annotations

from typing import Any

from proxy.drafting.base import Draft
from proxy.errors import UpstreamUnavailableError
from proxy.sampling.processors import SamplerOrder, SamplingParams
from proxy.targets import checks
from proxy.targets.base import PositionLogprobs, ScorePlan, Scores, Verification
from proxy.targets.stopping import EndEvidence
from proxy.targets.topn import exactness_problem, logprobs_problem, support_from_top_n
from proxy.targets.upstream import Upstream
from proxy.targets.vllm_answers import ending, output_pairs, parse_prefix_tokens, parse_verification, position
from proxy.targets.vllm_probe import VLLMInfo, defaults_problem, server_info, with_server_defaults
from proxy.targets.vllm_sampling import GREEDY, penalty_problem, request_sampling, round_sampling, samples_rounds
from proxy.targets.warm_prefixes import WarmPrefixes
from proxy.wire.request import CHAT, GenerationRequest

# Chat-template settings vLLM's /tokenize shares with its chat endpoint (serve/tokenize/protocol.py).
CHAT_TEMPLATE_KEYS = ("add_generation_prompt", "continue_final_message", "add_special_tokens",
                      "chat_template", "chat_template_kwargs",
                      "tools")  # rendered whatever tool_choice is, unless --exclude-tools-when-tool-choice-none
UNKNOWN_BLOCK = 16  # tokens: vLLM's default block on GPUs, assumed where /metrics names none


class VLLMTarget:
    """Verification and tokenization against a vLLM server."""

    order = SamplerOrder.TEMPERATURE_THEN_TRUNCATE  # vllm/v1/sample/sampler.py
    sampling_fields = frozenset({"repetition_penalty"})

    def __init__(self, upstream: Upstream, model: str | None = None) -> None:
        self.upstream = upstream
        self.model = model  # the served model id; discovered from /v1/models when None
        self.vocab_size: int | None = None  # the route's vocabulary: answered ids must lie below it
        self.ends_seen = EndEvidence()
        self.info: VLLMInfo | None = None  # set by probe(); until then rounds take the prompt log-probs path
        self._max_model_len: int | None = None
        self._warm = WarmPrefixes()  # contexts vLLM computed lately: their blocks are in its prefix cache

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
        """Version, model, context size, the --max-logprobs cap (from the error a huge request gets), the prefix
        cache, the server's sampling defaults and whether it splits off chat answers' reasoning."""
        await self._model_card()
        self.info = await server_info(self.upstream, await self.served_model(), await self.context_size())
        return self.info

    def round_cost(self) -> str | None:
        """Why a round costs the server the whole context (None: it reads the prefix cache, O(K) tokens)."""
        return None if self.round_reads_cache else "prompt log-probs never read vLLM's prefix cache"

    def with_defaults(self, request: GenerationRequest) -> GenerationRequest:
        """The request with the server's generation_config defaults in the sampling fields it omits."""
        return with_server_defaults(self._defaults(), request)

    def answer_problem(self, request: GenerationRequest) -> str | None:
        """Why the server would answer otherwise than rounds: generation_config defaults for the fields this request
        omits that cannot be followed, or a chat answer's reasoning split off."""
        if request.kind == CHAT and self.info is not None and self.info.reasoning:
            return "the server parts reasoning from chat answers (--reasoning-parser)"
        return defaults_problem(self._defaults(), request.body)

    def _defaults(self) -> tuple[tuple[str, float], ...] | None:
        return self.info.sampling_defaults if self.info is not None else None

    def exactness_problem(self, params: SamplingParams, top_n: int) -> str | None:
        """What top-N log-probs allow (vLLM returns no more), and what rounds follow of a repetition penalty."""
        if params.repetition_penalty != 1.0:
            return penalty_problem(params, top_n, self.info)
        return exactness_problem(params, top_n, self.order)

    @property
    def round_reads_cache(self) -> bool:
        """Whether rounds ask one token per prefix over the prefix cache (else prompt log-probs)."""
        return self.info is not None and self.info.rounds_read_cache

    def prompt_fields(self, kind: str) -> frozenset[str]:
        """What prompt_ids() hands to /tokenize: the chat template's settings, or whether to add special tokens."""
        return frozenset(CHAT_TEMPLATE_KEYS if kind == CHAT else ("add_special_tokens",))

    def prompt_problem(self, request: GenerationRequest) -> str | None:
        """None: vLLM's /tokenize takes prompts and conversations, and /v1/models gives the context length."""
        return None

    async def score(self, context: list[int], draft: Draft, plan: ScorePlan) -> Scores:
        """One /v1/completions call, its top-N folded with the draft into the sampler's support."""
        verification = await self.verify(context, list(draft.tokens), plan.top_n, plan.client_headers, plan.model,
                                         params=plan.params)
        # A sampled round's log-probs are the distribution vLLM samples from, which top_k N leaves as it is.
        params = SamplingParams(1.0, top_k=plan.top_n) if samples_rounds(plan.params) else plan.params
        return Scores(*support_from_top_n(verification, draft.tokens, draft.probs, params, self.order),
                      verification.positions)

    def logprobs_problem(self, params: SamplingParams, n: int, top_n: int) -> str | None:
        """vLLM returns raw log-probs (its default logprobs_mode), as the rounds' prompt log-probs are; a round
        samples among the ids they hold. Under a repetition penalty a round keeps only vLLM's choices."""
        if params.repetition_penalty != 1.0:
            return "log-probs under a repetition penalty: rounds keep vLLM's penalised choices, not its log-probs"
        if self.info is not None and self.info.processed_logprobs and not params.greedy:
            return "the server answers processed log-probs (--logprobs-mode processed_logprobs), rounds raw ones"
        return logprobs_problem(params, n, top_n, sampled_within=True)

    async def verify(self, context: list[int], draft_tokens: list[int], top_n: int,
                     client_headers: dict[str, str] | None = None, model: str | None = None, *,
                     params: SamplingParams = GREEDY) -> Verification:
        """Score the drafts and get the bonus position: over the prefix cache where it is on, else in one prompt
        log-probs call. Under a repetition penalty each position is vLLM's penalised greedy choice, or at T > 0 the
        processed distribution it sampled from."""
        if top_n < 1:
            raise ValueError("top_n must be at least 1: the argmax comes from the top list")
        penalised, sampled = params.repetition_penalty != 1.0, samples_rounds(params)
        if penalised and not self.round_reads_cache:
            raise ValueError("prompt log-probs cannot follow a repetition penalty")
        if sampled and not (self.info and self.info.processed_logprobs):
            raise ValueError("raw log-probs cannot give a penalised distribution")
        body = {"model": model or await self.served_model(),  # the client's (a LoRA adapter verifies as itself)
                "max_tokens": 1, **round_sampling(params), "logprobs": top_n, "return_tokens_as_token_ids": True,
                "return_token_ids": True}
        if not self.round_reads_cache:
            body.update(prompt=context + list(draft_tokens), prompt_logprobs=top_n)
            answer = await self.upstream.post_json("/v1/completions", body, client_headers=client_headers)
            return self._saw(parse_verification(answer, len(context), draft_tokens, top_n, vocab_size=self.vocab_size))
        prompts = [context + list(draft_tokens[:length]) for length in range(len(draft_tokens) + 1)]
        del body["return_token_ids"]  # it would echo each prompt's ids: the answer would grow with the context
        block = self.info.prefix_cache.block_size if self.info.prefix_cache is not None else None
        answer = await self._prefix_tokens(body, prompts, block or UNKNOWN_BLOCK, client_headers)
        self._warm.add(context)
        return self._saw(parse_prefix_tokens(answer, draft_tokens, top_n, vocab_size=self.vocab_size,
                                             chosen_only=penalised and not sampled))

    def _saw(self, verification: Verification) -> Verification:
        """The verification, its ends of generation noted before the round reads them."""
        for token, ended in verification.ends:
            self.ends_seen.saw(token, ended)
        return verification

    async def _prefix_tokens(self, body: dict[str, Any], prompts: list[list[int]], block: int,
                             client_headers: dict[str, str] | None) -> dict[str, Any]:
        """One token after each prompt; a context vLLM has not computed lately is computed once first, alone, so
        that the K + 1 prompts do not each prefill it."""
        if len(prompts) == 1 or self._warm.covers(prompts[0], gap=block):
            return await self.upstream.post_json("/v1/completions", {**body, "prompt": prompts},
                                                 client_headers=client_headers)
        first = await self.upstream.post_json("/v1/completions", {**body, "prompt": prompts[:1]},
                                              client_headers=client_headers)
        rest = await self.upstream.post_json("/v1/completions", {**body, "prompt": prompts[1:]},
                                             client_headers=client_headers)
        try:
            shifted = [{**choice, "index": int(choice["index"]) + 1} for choice in rest["choices"]]
            return {**first, "choices": [*first["choices"], *shifted]}
        except checks.MALFORMED as exc:
            raise UpstreamUnavailableError("upstream sent a malformed verification answer") from exc

    async def generate(self, context: list[int], max_new_tokens: int, params: SamplingParams, seed: int,
                       client_headers: dict[str, str] | None = None, model: str | None = None) -> list[int]:
        """Plain decoding on the target: up to max_new_tokens sampled by vLLM itself (EOS included)."""
        answer = await self._generate(context, max_new_tokens, params, seed, None, client_headers, model)
        return self._plain_tokens(context, answer, max_new_tokens)

    async def generate_logprobs(self, context: list[int], max_new_tokens: int, params: SamplingParams, seed: int,
                                top_n: int, client_headers: dict[str, str] | None = None,
                                model: str | None = None) -> tuple[list[int], tuple[PositionLogprobs, ...]]:
        """Plain decoding with each sampled token's raw log-prob and the top `top_n`."""
        answer = await self._generate(context, max_new_tokens, params, seed, top_n, client_headers, model)
        tokens = self._plain_tokens(context, answer, max_new_tokens)
        try:
            logprobs = answer["choices"][0]["logprobs"]
            checks.count(logprobs["top_logprobs"], len(tokens), "a plain completion's log-probs", "rows")
            positions = []
            for index, (token, top) in enumerate(zip(tokens, logprobs["top_logprobs"], strict=True)):
                what = f"plain token {index + 1}"
                pairs = output_pairs(top, self.vocab_size, what)
                ids, values = position(pairs, top_n, token, self.vocab_size, what)
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
            **request_sampling(params),
            "seed": seed,
            "return_token_ids": True,
        }
        if top_n is not None:
            body.update(logprobs=top_n, return_tokens_as_token_ids=True)
        return await self.upstream.post_json("/v1/completions", body, client_headers=client_headers)

    def _plain_tokens(self, context: list[int], answer: Any, max_new_tokens: int) -> list[int]:
        """The generated ids, checked; vLLM now holds the context and them in its prefix cache."""
        try:
            choice = answer["choices"][0]
            tokens = checks.generated_ids(choice["token_ids"], self.vocab_size, max_new_tokens, "a plain completion")
        except checks.MALFORMED as exc:
            raise UpstreamUnavailableError("upstream sent a malformed /v1/completions answer") from exc
        self.ends_seen.saw_answer(tokens, ending(choice, tokens[-1]) if tokens else None)
        self._warm.add(context + tokens)
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
