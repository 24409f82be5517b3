"""The `sglang` protocol: SGLang's native /generate, which our verifier speaks too.

One request per round: `input_ids = context + drafts`, `logprob_start_len = L - 1`, temperature 0 (raw log-probs:
tempering is ours), `max_new_tokens: 1` (the bonus position). Current SGLang answers K + 1 input entries, a null one
for the last context token first; an older code path put the null entry only at start 0 and answers K. The token ids
tell which (managers/scheduler_components/logprob_result_processor.py and its predecessors). Prompts come from the
server's tokenize and chat template, the context length from /v1/models (sglang_probe.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy.drafting.base import Draft
from proxy.errors import UpstreamUnavailableError
from proxy.sampling.processors import GREEDY_TEMPERATURE_EPS, SamplerOrder, SamplingParams
from proxy.targets import checks
from proxy.targets.base import PositionLogprobs, ScorePlan, Scores, Verification
from proxy.targets.sglang_parse import ending, parse_support, parse_top, parse_verification
from proxy.targets.sglang_probe import EXTENSION, SGLangInfo, probe_sglang, tokens
from proxy.targets.stopping import EndEvidence
from proxy.targets.topn import exactness_problem, logprobs_problem, support_from_top_n
from proxy.targets.upstream import Upstream
from proxy.wire.request import CHAT, GenerationRequest

DRAFT_SUPPORT_EXTENSION = EXTENSION
SGLANG_GREEDY_EPS = 1e-6  # _SAMPLING_EPS in python/sglang/srt/sampling/sampling_params.py
# What a chat completion's prompt depends on besides the messages (entrypoints/openai/protocol.py
# TokenizeRequest, which hands them to the chat template as the chat endpoint does).
CHAT_TEMPLATE_KEYS = ("continue_final_message", "chat_template_kwargs", "reasoning_effort")
# Tools, rendered by SGLang's tokenize as by its chat endpoint (which leaves them out at tool_choice "none") and by
# our verifier's; older SGLang releases ignore them, which the handler sees in the prompt (tools.format_problem).
PROMPT_TOOLS = "tools"
TOOL_KEYS = (PROMPT_TOOLS, "tool_choice")


def sampling_body(params: SamplingParams, max_new_tokens: int, seed: int) -> dict[str, Any]:
    """SGLang's sampling_params for the request's parameters (top_k -1 = off)."""
    return {"max_new_tokens": max_new_tokens, "temperature": params.temperature, "top_k": params.top_k or -1,
            "top_p": params.top_p, "min_p": params.min_p, "sampling_seed": seed}


class SGLangTarget:
    """Verification and tokenization against an SGLang-protocol server."""

    sampling_fields: frozenset[str] = frozenset()  # its penalties are not in the log-probs it answers

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.info: SGLangInfo | None = None  # set by probe()
        self.vocab_size: int | None = None  # the route's vocabulary: answered ids must lie below it
        self.ends_seen = EndEvidence()

    @property
    def exact_support(self) -> bool:
        """Whether the server offers our verifier's exact residual draws."""
        return self.info is not None and self.info.exact_support

    @property
    def order(self) -> SamplerOrder:
        """How the server turns logits into its sampling distribution: our verifier as llama.cpp does
        (proxy/verifier/generate.py), SGLang filtering jointly after temperature (srt/layers/sampler.py)."""
        return (SamplerOrder.TRUNCATE_THEN_TEMPERATURE if self.exact_support
                else SamplerOrder.TEMPERATURE_THEN_JOINT_TRUNCATE)

    async def probe(self) -> SGLangInfo:
        """Learn paths, context length, chat templating, seeds and the draft-support extension."""
        self.info = await probe_sglang(self.upstream)
        return self.info

    def exactness_problem(self, params: SamplingParams, top_n: int) -> str | None:
        """Why a round cannot follow the server's sampling exactly (None: it can)."""
        if params.top_p <= 0.0:
            return "SGLang takes top_p in (0, 1]: the server answers top_p = 0 itself"
        if self.exact_support:
            return None
        if SGLANG_GREEDY_EPS <= params.temperature < GREEDY_TEMPERATURE_EPS:
            return f"SGLang samples at temperatures from {SGLANG_GREEDY_EPS:g}; the proxy decodes greedily below " \
                   f"{GREEDY_TEMPERATURE_EPS:g}"
        return exactness_problem(params, top_n, self.order)

    def prompt_fields(self, kind: str) -> frozenset[str]:
        """What prompt_ids() hands to the tokenize for a conversation: tools, and the chat template's settings, which
        our verifier does not render."""
        templated = CHAT_TEMPLATE_KEYS if not self.exact_support else ()
        return frozenset((PROMPT_TOOLS, *templated)) if kind == CHAT else frozenset()

    def prompt_problem(self, request: GenerationRequest) -> str | None:
        """Why this request's prompt or context cannot be known from the server (None: it can, or not probed yet)."""
        if self.info is None:
            return None
        if self.info.context_length is None:
            return f"the server's context length is unknown ({self.info.context_source})"
        if isinstance(request.prompt, list):
            return None  # token ids need no tokenizer
        if self.info.tokenize_problem is not None:
            return self.info.tokenize_problem
        return self.info.chat.problem if request.kind == CHAT else None

    def round_cost(self) -> str | None:
        """None: a round reads the radix cache up to its last context token (about K + 1 tokens computed)."""
        return None

    def with_defaults(self, request: GenerationRequest) -> GenerationRequest:
        """The request as it is: SGLang does not publish the defaults it fills (answer_problem says when it does)."""
        return request

    def answer_problem(self, request: GenerationRequest) -> str | None:
        """Why the server's arguments make it answer this request otherwise than rounds over /generate."""
        return self.info.args.problem(request) if self.info is not None else None

    async def score(self, context: list[int], draft: Draft, plan: ScorePlan) -> Scores:
        """One /generate call: exact residual draws through the extension, else top-N folded locally."""
        if self.exact_support:
            return await self._score_support(context, draft, plan)
        verification = await self._score_top_n(context, draft.tokens, plan)
        return Scores(*support_from_top_n(verification, draft.tokens, draft.probs, plan.params, self.order),
                      verification.positions)

    def logprobs_problem(self, params: SamplingParams, n: int, top_n: int) -> str | None:
        """Why log-probs cannot be answered (None: they can). Our verifier returns raw log-probs and draws the tokens
        it emits from the whole vocabulary; SGLang returns log-probs after temperature unless at greedy or T = 1
        (SGLANG_RETURN_ORIGINAL_LOGPROB unset), which top-N raw log-probs cannot give."""
        if not (self.exact_support or params.greedy or params.temperature == 1.0):
            return "SGLang answers log-probs after temperature, which raw top-N log-probs cannot give"
        return logprobs_problem(params, n, top_n, sampled_within=not self.exact_support)

    async def _score_support(self, context: list[int], draft: Draft, plan: ScorePlan) -> Scores:
        """The draft-support extension: the target's probabilities on every draft candidate, and one
        target token drawn outside them, per position."""
        support_ids = [ids.tolist() for ids in draft.probs.ids]
        body = {
            "input_ids": context + list(draft.tokens),
            "sampling_params": sampling_body(plan.params, 1, plan.seed),
            "logprob_start_len": len(context) - 1,
            DRAFT_SUPPORT_EXTENSION: support_ids,
        }
        if plan.logprobs:  # the same rows' raw log-probs, in the same call
            body.update(return_logprob=True, top_logprobs_num=plan.top_n, return_text_in_logprobs=False)
        answer = await self.upstream.post_json("/generate", body, client_headers=plan.client_headers)
        support = parse_support(answer, draft.tokens, support_ids, draft.probs, vocab_size=self.vocab_size)
        if not plan.logprobs:
            return Scores(support)
        verification = parse_verification(answer, draft.tokens, context[-1], top_n=plan.top_n,
                                          vocab_size=self.vocab_size)
        return Scores(support, positions=verification.positions)

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
        verification = parse_verification(answer, draft_tokens, context[-1], top_n=plan.top_n,
                                          vocab_size=self.vocab_size)
        if (end := ending(answer.get("meta_info"), verification.bonus_token)) is not None:
            self.ends_seen.saw(*end)  # before the round reads its bonus token
        return verification

    async def generate(self, context: list[int], max_new_tokens: int, params: SamplingParams, seed: int,
                       client_headers: dict[str, str] | None = None, model: str | None = None) -> list[int]:
        """Plain decoding on the target: up to max_new_tokens sampled by the server itself (/generate names no
        model)."""
        body = {"input_ids": context, "sampling_params": sampling_body(params, max_new_tokens, seed)}
        answer = await self.upstream.post_json("/generate", body, client_headers=client_headers)
        return self._plain_tokens(answer, max_new_tokens)

    async def generate_logprobs(self, context: list[int], max_new_tokens: int, params: SamplingParams, seed: int,
                                top_n: int, client_headers: dict[str, str] | None = None,
                                model: str | None = None) -> tuple[list[int], tuple[PositionLogprobs, ...]]:
        """Plain decoding with each sampled token's log-prob and the top `top_n` (output rows only)."""
        body = {"input_ids": context, "sampling_params": sampling_body(params, max_new_tokens, seed),
                "return_logprob": True, "top_logprobs_num": top_n, "return_text_in_logprobs": False}
        answer = await self.upstream.post_json("/generate", body, client_headers=client_headers)
        tokens = self._plain_tokens(answer, max_new_tokens)
        try:
            meta = answer["meta_info"]
            checks.count(meta["output_token_logprobs"], len(tokens), "a plain answer's log-probs", "rows")
            checks.count(meta["output_top_logprobs"], len(tokens), "a plain answer's top log-probs", "rows")
            positions = []
            for index, (token, entry, top) in enumerate(zip(tokens, meta["output_token_logprobs"],
                                                            meta["output_top_logprobs"], strict=True)):
                what = f"plain token {index + 1}"
                if checks.token_id(entry[1], None, what) != token:
                    raise checks.fail(f"{what}'s log-prob is for another token")
                ids, logprobs = parse_top(top, what)
                scored = (token, checks.logprob(entry[0], what))
                checks.top_position(ids, logprobs, width=min(top_n, self.vocab_size or top_n),
                                    vocab_size=self.vocab_size, what=what, scored=scored)
                positions.append(PositionLogprobs(token, scored[1], ids, logprobs))
            return tokens, tuple(positions)
        except checks.MALFORMED as exc:
            raise UpstreamUnavailableError(f"upstream sent malformed log-probs ({type(exc).__name__})") from exc

    def _plain_tokens(self, answer: Any, max_new_tokens: int) -> list[int]:
        try:
            tokens = checks.generated_ids(answer["output_ids"], self.vocab_size, max_new_tokens,
                                          "a plain /generate answer")
        except checks.MALFORMED as exc:
            raise UpstreamUnavailableError("upstream sent a malformed /generate answer") from exc
        self.ends_seen.saw_answer(tokens, ending(answer.get("meta_info"), tokens[-1]) if tokens else None)
        return tokens

    async def prompt_ids(self, body: dict, kind: str,
                         client_headers: dict[str, str] | None = None) -> tuple[list[int], int]:
        """Prompt ids from the server's tokenize (its own chat template), and its context length."""
        info = self.info or await self.probe()
        if info.context_length is None:
            raise UpstreamUnavailableError(f"the upstream's context length is unknown ({info.context_source})")
        if kind != CHAT and isinstance(body["prompt"], list):
            return list(body["prompt"]), info.context_length
        problem = info.tokenize_problem or (info.chat.problem if kind == CHAT else None)
        if problem is not None or info.tokenize_path is None:
            raise UpstreamUnavailableError(f"the upstream cannot tokenize this prompt: {problem}")
        if kind == CHAT:
            # No add_generation_prompt: without it every release renders as its chat endpoint does,
            # generation prompt included (probe() checked that against the chat endpoint).
            request = {"messages": body["messages"],
                       **{key: body[key] for key in (*CHAT_TEMPLATE_KEYS, *TOOL_KEYS) if key in body}}
        else:
            request = {"prompt": body["prompt"]}  # special tokens added as /v1/completions adds them
        ids = await tokens(self.upstream, info.tokenize_path, request, client_headers)
        return checks.token_ids(ids, self.vocab_size, "the prompt's tokenization"), info.context_length
