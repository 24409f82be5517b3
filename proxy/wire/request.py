"""OpenAI request bodies -> validated `GenerationRequest`s, with the errors a client should see.

Shared by the proxy and the verifier's own OpenAI endpoints. Shapes follow the openai SDK's types
and vLLM's server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from proxy.errors import BadRequestError, ContextOverflowError
from proxy.sampling.processors import SamplingParams
from proxy.wire.fields import CHAT, COMPLETION, PREDICTED_CONTENT, TEXT_PART, unsupported_fields
from proxy.wire.logprobs import requested_logprobs

LEGACY_DEFAULT_MAX_TOKENS = 16  # /v1/completions default on vLLM and SGLang
MAX_STOP_STRINGS = 4
MAX_REPETITION_PENALTY = 1e6  # vLLM takes any positive value; past this a request is surely a mistake


@dataclass(frozen=True)
class GenerationRequest:
    """A validated chat or completions request."""

    kind: Literal["chat", "completion"]
    model: str
    messages: list[dict] | None
    prompt: str | list[int] | None
    max_tokens: int | None  # None: until the context is full
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    seed: int | None
    unsupported: tuple[str, ...]  # fields, at their values, that only the upstream can honour (fields.py)
    body: dict = field(repr=False)
    prediction: str | None = field(default=None, repr=False)  # Predicted Outputs: the output the client expects
    logprobs: int | None = None  # top log-probs per token the client asks for (0: the token's own); None: none
    repetition_penalty: float = 1.0  # vLLM's and SGLang's extension; 1 = off

    @property
    def greedy(self) -> bool:
        """Temperature 0: the output is the argmax at every step."""
        return self.temperature == 0

    @property
    def sampling_params(self) -> SamplingParams:
        """The request's sampling parameters."""
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.min_p, self.repetition_penalty)

    def max_tokens_within(self, prompt_tokens: int, context_size: int, whose: str = "the") -> int:
        """The tokens to generate: max_tokens, or what is left of the context; a 400 if it does not fit."""
        room = context_size - prompt_tokens
        if room < 1 or (self.max_tokens or 0) > room:
            raise ContextOverflowError(
                f"the prompt ({prompt_tokens} tokens) plus max_tokens ({self.max_tokens}) exceed {whose} "
                f"context of {context_size} tokens", param="max_tokens")
        return self.max_tokens or room


def _number(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequestError(f"'{name}' must be a number", param=name)
    if not low <= value <= high:
        raise BadRequestError(f"'{name}' must be between {low} and {high}, got {value}", param=name)
    return float(value)


def _integer(body: dict, name: str, low: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequestError(f"'{name}' must be an integer", param=name)
    if value < low:
        raise BadRequestError(f"'{name}' must be at least {low}, got {value}", param=name)
    return value


def _stop_strings(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise BadRequestError("'stop' must be a string or a list of strings", param="stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise BadRequestError(f"'stop' takes at most {MAX_STOP_STRINGS} strings", param="stop")
    return tuple(stops)


def _messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequestError("'messages' must be a non-empty list", param="messages")
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequestError("each message must be an object with a 'role'", param="messages")
        if "content" in message and not isinstance(message["content"], (str, list, type(None))):
            raise BadRequestError("message 'content' must be a string or a list of parts", param="messages")
    return messages


def _prompt(body: dict) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    raise BadRequestError("'prompt' must be a string or a list of token ids", param="prompt")


def _prediction(body: dict) -> str | None:
    """The text of a prediction of type content (other types are the upstream's to honour), or None."""
    prediction = body.get("prediction")
    if prediction is None:
        return None
    if not isinstance(prediction, dict):
        raise BadRequestError("'prediction' must be an object", param="prediction")
    if prediction.get("type") != PREDICTED_CONTENT:
        return None
    content = prediction.get("content")
    if isinstance(content, list) and all(isinstance(part, dict) and part.get("type") == TEXT_PART
                                         and isinstance(part.get("text"), str) for part in content):
        content = "".join(part["text"] for part in content)
    if not isinstance(content, str):
        raise BadRequestError("'prediction.content' must be a string or a list of text parts", param="prediction")
    try:
        content.encode("utf-8")  # JSON's \ud800 escapes decode to lone surrogates, which no tokenizer reads
    except UnicodeEncodeError:
        raise BadRequestError("'prediction.content' is not valid Unicode (a lone surrogate)",
                              param="prediction") from None
    return content


def parse_generation_request(body: Any, kind: Literal["chat", "completion"]) -> GenerationRequest:
    """Validate a /v1/chat/completions or /v1/completions body."""
    if not isinstance(body, dict):
        raise BadRequestError("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequestError("'model' must be a non-empty string", param="model")
    legacy_max_tokens = _integer(body, "max_tokens", 1)
    max_tokens = _integer(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = legacy_max_tokens
    if max_tokens is None and kind == COMPLETION:
        max_tokens = LEGACY_DEFAULT_MAX_TOKENS
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequestError("'stream' must be a boolean", param="stream")
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or not stream):
        raise BadRequestError("'stream_options' needs 'stream': true and must be an object", param="stream_options")
    _integer(body, "n", 1)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequestError("'seed' must be an integer", param="seed")
    top_k = _integer(body, "top_k", -1)
    repetition_penalty = _number(body, "repetition_penalty", 1.0, 0.0, MAX_REPETITION_PENALTY)
    if repetition_penalty == 0:
        raise BadRequestError("'repetition_penalty' must be greater than 0", param="repetition_penalty")
    return GenerationRequest(
        kind=kind,
        model=model,
        messages=_messages(body) if kind == CHAT else None,
        prompt=_prompt(body) if kind == COMPLETION else None,
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
        top_k=0 if top_k in (None, -1) else top_k,
        min_p=_number(body, "min_p", 0.0, 0.0, 1.0),
        stop=_stop_strings(body),
        stream=stream,
        include_usage=bool(options and options.get("include_usage")),
        seed=seed,
        prediction=_prediction(body),
        unsupported=unsupported_fields(body, kind),
        body=body,
        logprobs=requested_logprobs(body, kind),
        repetition_penalty=repetition_penalty,
    )
