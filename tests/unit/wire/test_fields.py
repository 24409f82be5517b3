"""The field table: every request field of the OpenAI, vLLM and SGLang chat and completions APIs either speculates
or passes the request through with its name in the reason.

Field names from the openai SDK's `CompletionCreateParams` (chat and legacy completions), vLLM's
`ChatCompletionRequest` and `CompletionRequest` and SGLang's (see proxy/wire/fields.py). Each field is
sent alone at a value other than its default, to a route whose target is a real `VLLMTarget` or
`SGLangTarget` (admission asks them which prompt fields their tokenize honours; nothing is sent).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from proxy.admission import RouteSnapshot, passthrough_reason
from proxy.config.schema import SpeculationConfig
from proxy.errors import BadRequestError
from proxy.targets.sglang import SGLangTarget
from proxy.targets.upstream import Timeouts, Upstream
from proxy.targets.vllm import VLLMTarget
from proxy.wire.control import RequestControl
from proxy.wire.fields import is_neutral
from proxy.wire.request import CHAT, COMPLETION, parse_generation_request

OPENAI_CHAT = ["messages", "model", "audio", "frequency_penalty", "function_call", "functions", "logit_bias",
               "logprobs", "max_completion_tokens", "max_tokens", "metadata", "modalities", "moderation", "n",
               "parallel_tool_calls", "prediction", "presence_penalty", "prompt_cache_key", "prompt_cache_options",
               "prompt_cache_retention", "reasoning_effort", "response_format", "safety_identifier", "seed",
               "service_tier", "stop", "store", "stream", "stream_options", "temperature", "tool_choice", "tools",
               "top_logprobs", "top_p", "user", "verbosity", "web_search_options"]
OPENAI_COMPLETION = ["model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens",
                     "n", "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature",
                     "top_p", "user"]
VLLM_SAMPLING = ["use_beam_search", "top_k", "min_p", "repetition_penalty", "watermarking", "length_penalty",
                 "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "min_tokens", "skip_special_tokens",
                 "spaces_between_special_tokens", "truncate_prompt_tokens", "truncation_side", "prompt_logprobs",
                 "logprob_token_ids", "allowed_token_ids", "bad_words"]
VLLM_EXTRA = ["priority", "request_id", "session_id", "return_tokens_as_token_ids", "return_token_ids",
              "routed_experts_prompt_start", "return_token_offsets", "return_mm_kwargs", "cache_salt",
              "kv_transfer_params", "ec_transfer_params", "vllm_xargs", "repetition_detection", "stream_interval",
              "response_format", "structured_outputs", "thinking_token_budget"]
VLLM_CHAT = [*OPENAI_CHAT, *VLLM_SAMPLING, *VLLM_EXTRA, "include_reasoning", "echo", "add_generation_prompt",
             "continue_final_message", "add_special_tokens", "documents", "chat_template", "chat_template_kwargs",
             "media_io_kwargs", "mm_processor_kwargs", "return_prompt_text"]
VLLM_COMPLETION = [*OPENAI_COMPLETION, *VLLM_SAMPLING, *VLLM_EXTRA, "prompt_embeds", "add_special_tokens"]
SGLANG_COMMON = ["return_hidden_states", "return_routed_experts", "routed_experts_start_len",
                 "return_cached_tokens_details", "return_token_ids", "top_k", "min_p", "min_tokens", "regex", "ebnf",
                 "repetition_penalty", "stop_token_ids", "stop_regex", "no_stop_trim", "ignore_eos",
                 "skip_special_tokens", "lora_path", "session_id", "session_params", "response_format",
                 "custom_params", "custom_logit_processor", "images_config", "bootstrap_host", "bootstrap_port",
                 "bootstrap_room", "routed_dp_rank", "disagg_prefill_dp_rank", "data_parallel_rank", "rid",
                 "extra_key", "cache_salt", "ngram_corpus_id", "priority", "custom_labels"]
SGLANG_CHAT = [*OPENAI_CHAT, *SGLANG_COMMON, "return_prompt_token_ids", "return_meta_info", "task",
               "continue_final_message", "separate_reasoning", "stream_reasoning", "chat_template_kwargs",
               "max_dynamic_patch", "min_dynamic_patch", "use_audio_in_video", "input_ids"]
SGLANG_COMPLETION = [*OPENAI_COMPLETION, *SGLANG_COMMON, "json_schema"]
APIS = {CHAT: sorted({*OPENAI_CHAT, *VLLM_CHAT, *SGLANG_CHAT}),
        COMPLETION: sorted({*OPENAI_COMPLETION, *VLLM_COMPLETION, *SGLANG_COMPLETION})}

# A value other than the field's default (booleans flipped, numbers off their neutral value, objects filled in).
SAMPLE: dict[str, Any] = {
    "audio": {"voice": "alloy", "format": "wav"}, "frequency_penalty": 0.5, "function_call": "auto",
    "functions": [{"name": "f"}], "logit_bias": {"5": 10}, "max_completion_tokens": 7, "max_tokens": 7,
    "metadata": {"team": "a"}, "modalities": ["text", "audio"], "moderation": {"enabled": True}, "n": 2,
    "parallel_tool_calls": False, "prediction": {"type": "content", "content": "x"}, "presence_penalty": -0.5,
    "prompt_cache_key": "k", "prompt_cache_options": {"ttl": "1h"}, "prompt_cache_retention": "24h",
    "reasoning_effort": "low", "response_format": {"type": "json_object"}, "safety_identifier": "s",
    "seed": 7, "service_tier": "flex", "stop": ["\n"], "store": True, "stream": True,
    "stream_options": {"include_usage": True}, "temperature": 0, "tool_choice": "required",
    "tools": [{"type": "function", "function": {"name": "f"}}], "top_logprobs": 2, "top_p": 0.5, "user": "u",
    "verbosity": "low", "web_search_options": {}, "best_of": 2, "echo": True, "suffix": "}",
    "use_beam_search": True, "top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1, "watermarking": True,
    "length_penalty": 0.5, "stop_token_ids": [3], "include_stop_str_in_output": True, "ignore_eos": True,
    "min_tokens": 3, "skip_special_tokens": False, "spaces_between_special_tokens": False,
    "truncate_prompt_tokens": 5, "truncation_side": "left", "prompt_logprobs": 1, "logprob_token_ids": [3],
    "allowed_token_ids": [3, 4], "bad_words": ["x"], "priority": 1, "request_id": "r-1", "session_id": "s-1",
    "return_tokens_as_token_ids": True, "return_token_ids": True, "routed_experts_prompt_start": 2,
    "return_token_offsets": True, "return_mm_kwargs": False, "cache_salt": "salt", "kv_transfer_params": {"a": 1},
    "ec_transfer_params": {"a": 1}, "vllm_xargs": {"a": 1}, "repetition_detection": {"max_pattern_size": 4},
    "stream_interval": 4, "structured_outputs": {"regex": "a+"}, "thinking_token_budget": 5,
    "include_reasoning": False, "add_generation_prompt": False, "continue_final_message": True,
    "add_special_tokens": "flipped", "documents": [{"title": "t", "text": "x"}], "chat_template": "{{ messages }}",
    "chat_template_kwargs": {"enable_thinking": False}, "media_io_kwargs": {"image": {}},
    "mm_processor_kwargs": {"a": 1}, "return_prompt_text": True, "prompt_embeds": "AAAA",
    "return_hidden_states": True, "return_routed_experts": True, "routed_experts_start_len": 2,
    "return_cached_tokens_details": True, "regex": "a+", "ebnf": "root ::= 'a'", "stop_regex": "\\d",
    "no_stop_trim": True, "lora_path": "adapter", "session_params": {"id": "s"}, "custom_params": {"a": 1},
    "custom_logit_processor": "{}", "images_config": {"a": 1}, "bootstrap_host": "h", "bootstrap_port": 1,
    "bootstrap_room": 1, "routed_dp_rank": 1, "disagg_prefill_dp_rank": 1, "data_parallel_rank": 1, "rid": "r",
    "extra_key": "e", "ngram_corpus_id": "c", "custom_labels": {"a": "b"}, "return_prompt_token_ids": True,
    "return_meta_info": True, "task": "domain", "separate_reasoning": False, "stream_reasoning": False,
    "max_dynamic_patch": 4, "min_dynamic_patch": 1, "use_audio_in_video": True, "input_ids": [1, 2],
    "json_schema": "{}", "logprobs": True, "model": "m", "messages": [{"role": "user", "content": "hello"}],
    "prompt": "hello",
}
COMPLETION_SAMPLE = {"logprobs": 0, "add_special_tokens": False}  # completions' own types and defaults

# Fields served speculatively at the values above: reproduced by the proxy, or without effect on the output.
SPECULATES = {"messages", "model", "prompt", "max_completion_tokens", "max_tokens", "seed", "stop", "stream",
              "stream_options", "temperature", "top_p", "top_k", "min_p", "user", "metadata", "store",
              "safety_identifier", "prompt_cache_key", "prompt_cache_retention", "request_id", "rid", "custom_labels",
              "return_token_offsets", "return_mm_kwargs", "prediction",
              "logprobs"}  # chat's true and completions' 0: answered from the verification answers
# Prompt fields the target's tokenize renders as its chat endpoint does (prompt_ids in targets/).
TEMPLATED = {("vllm", CHAT): {"add_generation_prompt", "continue_final_message", "add_special_tokens",
                              "chat_template", "chat_template_kwargs", "tools"},
             ("vllm", COMPLETION): {"add_special_tokens"},
             ("sglang", CHAT): {"continue_final_message", "chat_template_kwargs", "reasoning_effort", "tools"},
             ("sglang", COMPLETION): set()}
TARGETS = ("vllm", "sglang")


def base_body(kind: str) -> dict[str, Any]:
    """A greedy request (exact whatever the target's top-N), to which a field is added."""
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0} if kind == CHAT else \
        {"model": "m", "prompt": "Once upon a time", "temperature": 0}


def sample(name: str, kind: str) -> Any:
    """The field's non-default value for this endpoint."""
    value = COMPLETION_SAMPLE.get(name, SAMPLE[name]) if kind == COMPLETION else SAMPLE[name]
    return {**SAMPLE, "add_special_tokens": True}[name] if (name, kind) == ("add_special_tokens", CHAT) else value


@pytest.fixture(scope="module")
async def targets() -> AsyncIterator[dict[str, Any]]:
    """The two verifying clients, around an upstream that is never contacted."""
    upstream = Upstream("http://127.0.0.1:9", Timeouts(1.0, 1.0, 1.0))
    yield {"vllm": VLLMTarget(upstream, "m"), "sglang": SGLangTarget(upstream)}
    await upstream.close()


def reason_for(target: Any, kind: str, body: dict[str, Any]) -> str | None:
    route = RouteSnapshot(SpeculationConfig(), True, target, vocabulary_size=100)
    return passthrough_reason(route, parse_generation_request(body, kind), RequestControl())  # type: ignore[arg-type]


CASES = [pytest.param(target, kind, name, id=f"{target}-{kind}-{name}")
         for target in TARGETS for kind in (CHAT, COMPLETION) for name in APIS[kind]]


@pytest.mark.parametrize(("target", "kind", "name"), CASES)
async def test_every_field_speculates_or_passes_through_by_name(targets: dict, target: str, kind: str,
                                                                name: str) -> None:
    body = {**base_body(kind), name: sample(name, kind)}
    if name == "stream_options":
        body["stream"] = True
    reason = reason_for(targets[target], kind, body)
    if name in SPECULATES or name in TEMPLATED[target, kind]:
        assert reason is None, reason
    else:
        assert reason is not None and name in reason, reason


@pytest.mark.parametrize("name", sorted(set(SAMPLE) - {"model", "messages", "prompt"}))
def test_every_sample_is_off_its_default(name: str) -> None:
    """A sample at its neutral value would prove nothing about the field."""
    from proxy.wire.fields import NEUTRAL, NEUTRAL_BY_KIND
    for kind in (CHAT, COMPLETION):
        neutral = {**NEUTRAL, **NEUTRAL_BY_KIND[kind]}.get(name, ())
        assert not is_neutral(sample(name, kind), neutral), (name, kind)


NEUTRAL_CASES = [
    # (id, kind, fields): values that change nothing, so the request speculates
    ("n 1", CHAT, {"n": 1}), ("best_of 1", COMPLETION, {"best_of": 1}), ("echo false", COMPLETION, {"echo": False}),
    ("chat logprobs false", CHAT, {"logprobs": False}), ("logprobs null", COMPLETION, {"logprobs": None}),
    ("ignore_eos false", CHAT, {"ignore_eos": False}),
    ("skip_special_tokens true", CHAT, {"skip_special_tokens": True}),
    ("include_stop_str_in_output false", COMPLETION, {"include_stop_str_in_output": False}),
    ("stop_token_ids empty", CHAT, {"stop_token_ids": []}), ("min_tokens 0", CHAT, {"min_tokens": 0}),
    ("presence_penalty 0.0", CHAT, {"presence_penalty": 0.0}),
    ("repetition_penalty 1.0", CHAT, {"repetition_penalty": 1.0}),
    ("tool_choice none", CHAT, {"tool_choice": "none"}), ("tools empty", CHAT, {"tools": []}),
    ("tools, auto", CHAT, {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"}),
    ("parallel_tool_calls true", CHAT, {"parallel_tool_calls": True}),
    ("response_format text", CHAT, {"response_format": {"type": "text"}}), ("unknown null", CHAT, {"frobnicate": None}),
    ("lora_path null", CHAT, {"lora_path": None}), ("usage off", CHAT, {"stream": True, "stream_options": {}}),
    ("continuous usage off", CHAT, {"stream": True, "stream_options": {"continuous_usage_stats": False}}),
    ("text parts", CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
    ("speculoos control", CHAT, {"speculoos": {"mode": "on"}}),
    ("prediction as text parts", CHAT,
     {"prediction": {"type": "content", "content": [{"type": "text", "text": "x"}]}}),
    ("prediction on completions", COMPLETION, {"prediction": {"type": "content", "content": "x"}}),
    ("prediction null", CHAT, {"prediction": None}),
]
PASSING_CASES = [
    # (id, kind, fields, name in the reason): values that the output depends on
    ("completions logprobs beyond the route's top-N", COMPLETION, {"logprobs": 21}, "beyond the route's top-N"),
    ("chat top_logprobs above OpenAI's 20", CHAT, {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("chat top_logprobs without logprobs", CHAT, {"top_logprobs": 2}, "top_logprobs"),
    ("completions logprobs false is 0", COMPLETION, {"logprobs": False}, "logprobs"),
    ("chat logprobs 0 is not false", CHAT, {"logprobs": 0}, "logprobs"),
    ("n 1.0 is not the integer", COMPLETION, {"n": 2}, "n"),
    ("ignore_eos 0 is not false", CHAT, {"ignore_eos": 0}, "ignore_eos"),
    ("an unknown field", CHAT, {"frobnicate": 1}, "frobnicate"),
    ("continuous usage stats", CHAT, {"stream": True, "stream_options": {"continuous_usage_stats": True}},
     "stream_options.continuous_usage_stats"),
    ("include_usage not a boolean", CHAT, {"stream": True, "stream_options": {"include_usage": 1}},
     "stream_options.include_usage"),
    ("an unknown stream option", CHAT, {"stream": True, "stream_options": {"other": True}}, "stream_options.other"),
    ("an image", CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "image_url"),
    ("a part that is not an object", CHAT, {"messages": [{"role": "user", "content": ["hi"]}]}, "messages content"),
    ("several, sorted", CHAT, {"tool_choice": "required", "n": 3, "logit_bias": {"1": 1}},
     "logit_bias, n, tool_choice"),
    ("a named tool", CHAT, {"tools": [{}], "tool_choice": {"type": "function", "function": {"name": "f"}}},
     "tool_choice"),
    ("a prediction of another type", CHAT, {"prediction": {"type": "diff", "content": "x"}}, "prediction"),
]


@pytest.mark.parametrize(("kind", "fields"), [pytest.param(*c[1:], id=c[0]) for c in NEUTRAL_CASES])
@pytest.mark.parametrize("target", TARGETS)
async def test_neutral_values_speculate(targets: dict, target: str, kind: str, fields: dict[str, Any]) -> None:
    assert reason_for(targets[target], kind, {**base_body(kind), **fields}) is None


@pytest.mark.parametrize(("kind", "fields", "name"), [pytest.param(*c[1:], id=c[0]) for c in PASSING_CASES])
@pytest.mark.parametrize("target", TARGETS)
async def test_other_values_pass_through_by_name(targets: dict, target: str, kind: str, fields: dict[str, Any],
                                                 name: str) -> None:
    reason = reason_for(targets[target], kind, {**base_body(kind), **fields})
    assert reason is not None and name in reason, reason


async def test_our_verifier_renders_no_prompt_fields_but_tools(targets: dict) -> None:
    """Behind the SGLang protocol, the speculoos verifier's tokenize ignores chat template settings."""
    target = SGLangTarget(targets["sglang"].upstream)
    assert target.prompt_fields(CHAT) == {"continue_final_message", "chat_template_kwargs", "reasoning_effort",
                                          "tools"}
    target.info = type("Info", (), {"exact_support": True})()  # type: ignore[assignment]
    assert target.prompt_fields(CHAT) == {"tools"}


@pytest.mark.parametrize("prompt", [[5, 100], [-1], [10**30]], ids=["at the size", "negative", "huge"])
async def test_prompt_ids_outside_the_vocabulary_are_a_bad_request(targets: dict, prompt: list[int]) -> None:
    with pytest.raises(BadRequestError, match="outside the vocabulary") as caught:
        reason_for(targets["sglang"], COMPLETION, {**base_body(COMPLETION), "prompt": prompt})
    assert caught.value.status == 400 and caught.value.param == "prompt"


async def test_prompt_ids_inside_the_vocabulary_speculate(targets: dict) -> None:
    assert reason_for(targets["sglang"], COMPLETION, {**base_body(COMPLETION), "prompt": [0, 99]}) is None
