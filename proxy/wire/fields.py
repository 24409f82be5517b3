"""Which request fields a speculative answer honours exactly: an allowlist, and every other field's neutral values.

Read from the servers' request models: the openai SDK's `CompletionCreateParams` (chat and legacy
completions), vLLM's `ChatCompletionRequest` and `CompletionRequest`
(vllm/entrypoints/openai/{chat_completion,completion}/protocol.py) and SGLang's
(python/sglang/srt/entrypoints/openai/protocol.py). A field is
- honoured: the proxy reproduces it (parsed and validated in request.py, or the `speculoos` control);
- inert: it never changes the output (ids, labels, storage on OpenAI's side);
- prompt-shaping: the target's tokenize endpoint may render it as its chat endpoint does, which
  admission asks the target about;
- anything else: honoured only at a neutral value (JSON null always is), else the request passes
  through with the field's name in the reason. Unknown fields have no neutral value but null.
"""

from __future__ import annotations

from typing import Any

from proxy.wire.control import CONTROL_FIELD

CHAT = "chat"
COMPLETION = "completion"

HONOURED = frozenset({
    "model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
    "stop", "stream", "stream_options", "seed", CONTROL_FIELD,
    "prediction",  # type content: a draft source (other types: see _prediction)
})
INERT = frozenset({
    "user", "metadata", "store", "safety_identifier", "prompt_cache_key", "prompt_cache_retention",
    "request_id", "rid", "custom_labels",
    "return_token_offsets", "return_mm_kwargs",  # vLLM: read by its render endpoints only
})
# Fields that only add to the response (ids, hidden states, server metadata) and never change its text: the proxy's
# speculative answers leave them out, so they pass through; a server without them may ignore them.
RESPONSE_EXTRAS = frozenset({
    "return_tokens_as_token_ids", "return_token_ids", "return_prompt_text", "return_hidden_states",
    "return_routed_experts", "return_cached_tokens_details", "return_prompt_token_ids", "return_meta_info",
})
STREAM_OPTIONS = {"include_usage": (True, False), "continuous_usage_stats": (False,)}

# Neutral values besides null, compared with their JSON types (`logprobs: 0` is not `false`).
NEUTRAL: dict[str, tuple[Any, ...]] = {
    # OpenAI
    "n": (1,), "best_of": (1,), "echo": (False,), "top_logprobs": (0,), "logit_bias": ({},),
    "presence_penalty": (0,), "frequency_penalty": (0,), "tools": ([],), "functions": ([],),
    "tool_choice": ("none", "auto"), "function_call": ("none",), "response_format": ({"type": "text"},),
    "modalities": (["text"],),
    # vLLM and SGLang sampling extensions
    "repetition_penalty": (1,), "repeat_penalty": (1,), "min_tokens": (0,), "stop_token_ids": ([],),
    "ignore_eos": (False,), "skip_special_tokens": (True,), "spaces_between_special_tokens": (True,),
    "include_stop_str_in_output": (False,), "no_stop_trim": (False,), "bad_words": ([],), "stop_regex": ([],),
    "use_beam_search": (False,), "length_penalty": (1,), "watermarking": (False,), "include_reasoning": (True,),
    "separate_reasoning": (True,), "stream_reasoning": (True,), "use_audio_in_video": (False,),
    "priority": (0,), "routed_experts_prompt_start": (0,), "routed_experts_start_len": (0,),
    "return_tokens_as_token_ids": (False,), "return_token_ids": (False,), "return_prompt_text": (False,),
    "return_hidden_states": (False,), "return_routed_experts": (False,), "return_cached_tokens_details": (False,),
    "return_prompt_token_ids": (False,), "return_meta_info": (False,), "vllm_xargs": ({},),
    "mm_processor_kwargs": ({},), "chat_template_kwargs": ({},), "documents": ([],),
    # Tools are prompt-shaping (the target renders them) and their calls parsed from the output (tools.py); a forced
    # choice ("required", a named function) and one call at most (parallel_tool_calls false) are the upstream's.
    "parallel_tool_calls": (True,),
}
NEUTRAL_BY_KIND: dict[str, dict[str, tuple[Any, ...]]] = {
    CHAT: {"logprobs": (False,), "add_generation_prompt": (True,), "continue_final_message": (False,),
           "add_special_tokens": (False,)},
    COMPLETION: {"add_special_tokens": (True,)},  # `logprobs: 0` asks for the sampled token's log-prob
}
TEXT_PART = "text"
PREDICTED_CONTENT = "content"  # the one prediction type (Predicted Outputs)


def is_neutral(value: Any, neutrals: tuple[Any, ...]) -> bool:
    """Null, or equal to a neutral value of the same JSON type (a bool is not a number)."""
    return value is None or any(
        value == neutral and isinstance(value, bool) == isinstance(neutral, bool) for neutral in neutrals)


def _stream_options(options: Any) -> list[str]:
    if not isinstance(options, dict):
        return []  # null, or refused by the parser
    return [f"stream_options.{key}" for key, value in options.items()
            if not is_neutral(value, STREAM_OPTIONS.get(key, ()))]


def _prediction(prediction: Any) -> list[str]:
    """A prediction of a type other than content (only that one is a draft source): the upstream's to honour."""
    if prediction is None or (isinstance(prediction, dict) and prediction.get("type") == PREDICTED_CONTENT):
        return []
    return ["prediction"]


def _content_parts(messages: Any) -> list[str]:
    """Message content the proxy cannot tokenize as the server does: anything but text parts (images, audio...)."""
    kinds: set[str] = set()
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else ():
            if not isinstance(part, dict) or part.get("type") != TEXT_PART or not isinstance(part.get("text"), str):
                kinds.add(str(part.get("type")) if isinstance(part, dict) else type(part).__name__)
    return [f"messages content {kind}" for kind in sorted(kinds)]


def unsupported_fields(body: dict, kind: str) -> tuple[str, ...]:
    """The fields of a request body, at their values, that only the upstream can honour (sorted)."""
    neutral = {**NEUTRAL, **NEUTRAL_BY_KIND.get(kind, {})}
    names = [name for name, value in body.items()
             if name not in HONOURED and name not in INERT and not is_neutral(value, neutral.get(name, ()))]
    names += _stream_options(body.get("stream_options"))
    names += _prediction(body.get("prediction"))
    names += _content_parts(body.get("messages")) if kind == CHAT else []
    return tuple(sorted(names))
