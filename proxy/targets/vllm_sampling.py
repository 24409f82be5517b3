"""What a vLLM round asks for and what it can follow of vLLM's sampling, given what the server answers.

A repetition penalty applies to every id in the prompt or the output, so a round's prompt (context + drafts) is
penalised as the generation would be: at temperature 0 the token vLLM picks after each prefix is the server's own
choice, and stands for the position. Raw log-probs are not the penalised distribution: at T > 0 a round asks vLLM
to sample each prefix as the request does and takes the distribution it sampled from, which a server started with
`--logprobs-mode processed_logprobs` answers; elsewhere such a request passes through.
"""

from __future__ import annotations

from proxy.sampling.processors import SamplingParams
from proxy.targets.topn import PENALTY_NOT_IN_LOGPROBS
from proxy.targets.vllm_probe import VLLMInfo

GREEDY = SamplingParams(temperature=0.0)
# Penalties on generated ids alone, which rounds cannot follow: named neutral, whatever the server's generation_config
# says (admission passes through a request whose own or defaulted value is not).
NEUTRAL_PENALTIES = {"presence_penalty": 0.0, "frequency_penalty": 0.0}
GREEDY_NEUTRAL = {"temperature": 0.0, "top_k": -1, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0,
                  **NEUTRAL_PENALTIES}


def samples_rounds(params: SamplingParams) -> bool:
    """Whether a round asks vLLM to sample each prefix as the request does (under a repetition penalty at T > 0),
    rather than for its greedy token."""
    return params.repetition_penalty != 1.0 and not params.greedy


def request_sampling(params: SamplingParams) -> dict[str, float]:
    """The sampling fields of a call vLLM samples as the request does (a plain chunk, a sampled round)."""
    return {"temperature": params.temperature, "top_k": params.top_k or -1, "top_p": params.top_p,
            "min_p": params.min_p, "repetition_penalty": params.repetition_penalty, **NEUTRAL_PENALTIES}


def round_sampling(params: SamplingParams) -> dict[str, float]:
    """The sampling fields of a round's request: greedy under the request's penalty, or the request's own where
    rounds sample."""
    if samples_rounds(params):
        return request_sampling(params)
    return {**GREEDY_NEUTRAL, "repetition_penalty": params.repetition_penalty}


def penalty_problem(params: SamplingParams, top_n: int, info: VLLMInfo | None) -> str | None:
    """Why rounds cannot follow the request's repetition penalty on this server (None: they can)."""
    if info is None or not info.rounds_read_cache:
        return f"{PENALTY_NOT_IN_LOGPROBS}: rounds follow it over the prefix cache only"
    if params.greedy:
        return None
    if not info.processed_logprobs:
        return (f"{PENALTY_NOT_IN_LOGPROBS}: rounds follow it at temperature 0 only (at any with "
                "--logprobs-mode processed_logprobs)")
    if not 1 <= params.top_k <= top_n:
        return f"a penalised distribution is known whole from the top {top_n} only with top_k in 1..{top_n}"
    return None
