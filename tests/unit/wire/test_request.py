"""parse_generation_request: tables of bad bodies (with the message they get) and good ones, plus a fuzz."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.errors import BadRequestError
from proxy.wire.request import CHAT, COMPLETION, LEGACY_DEFAULT_MAX_TOKENS, parse_generation_request

MESSAGES = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> dict[str, Any]:
    """A valid chat body with `fields` added (a value of ... removes the key)."""
    body = {"model": "m", "messages": MESSAGES, **fields}
    return {k: v for k, v in body.items() if v is not ...}


def completion(**fields: Any) -> dict[str, Any]:
    """A valid completions body with `fields` added (a value of ... removes the key)."""
    body = {"model": "m", "prompt": "Once upon a time", **fields}
    return {k: v for k, v in body.items() if v is not ...}


# -- bad bodies -----------------------------------------------------------------------------------

BAD = [
    # (id, kind, body, message substring, param)
    ("body is a list", CHAT, [MESSAGES], "must be a JSON object", None),
    ("body is a string", CHAT, "hello", "must be a JSON object", None),
    ("body is null", COMPLETION, None, "must be a JSON object", None),
    ("body is a number", COMPLETION, 3, "must be a JSON object", None),
    ("model missing", CHAT, chat(model=...), "'model' must be a non-empty string", "model"),
    ("model empty", CHAT, chat(model=""), "'model' must be a non-empty string", "model"),
    ("model a number", COMPLETION, completion(model=7), "'model' must be a non-empty string", "model"),
    ("messages missing", CHAT, chat(messages=...), "'messages' must be a non-empty list", "messages"),
    ("messages a string", CHAT, chat(messages="hi"), "'messages' must be a non-empty list", "messages"),
    ("messages empty", CHAT, chat(messages=[]), "'messages' must be a non-empty list", "messages"),
    ("message not an object", CHAT, chat(messages=["hi"]), "each message must be an object", "messages"),
    ("message without role", CHAT, chat(messages=[{"content": "hi"}]), "with a 'role'", "messages"),
    ("message role not a string", CHAT, chat(messages=[{"role": 1, "content": "hi"}]), "with a 'role'", "messages"),
    ("message content a number", CHAT, chat(messages=[{"role": "user", "content": 5}]), "'content'", "messages"),
    ("max_tokens a string", CHAT, chat(max_tokens="x"), "'max_tokens' must be an integer", "max_tokens"),
    ("max_tokens a float", CHAT, chat(max_tokens=1.5), "'max_tokens' must be an integer", "max_tokens"),
    ("max_tokens a bool", CHAT, chat(max_tokens=True), "'max_tokens' must be an integer", "max_tokens"),
    ("max_tokens zero", CHAT, chat(max_tokens=0), "'max_tokens' must be at least 1", "max_tokens"),
    ("max_tokens negative", COMPLETION, completion(max_tokens=-5), "'max_tokens' must be at least 1", "max_tokens"),
    ("max_completion_tokens zero", CHAT, chat(max_completion_tokens=0), "'max_completion_tokens' must be at least 1",
     "max_completion_tokens"),
    ("max_tokens invalid beside a valid max_completion_tokens", CHAT, chat(max_completion_tokens=5, max_tokens="x"),
     "'max_tokens' must be an integer", "max_tokens"),
    ("max_completion_tokens a string", CHAT, chat(max_completion_tokens="9"),
     "'max_completion_tokens' must be an integer", "max_completion_tokens"),
    ("temperature a string", CHAT, chat(temperature="hot"), "'temperature' must be a number", "temperature"),
    ("temperature a bool", CHAT, chat(temperature=False), "'temperature' must be a number", "temperature"),
    ("temperature too high", CHAT, chat(temperature=2.5), "'temperature' must be between", "temperature"),
    ("temperature negative", CHAT, chat(temperature=-0.1), "'temperature' must be between", "temperature"),
    ("temperature NaN", CHAT, chat(temperature=math.nan), "'temperature' must be between", "temperature"),
    ("temperature infinite", CHAT, chat(temperature=math.inf), "'temperature' must be between", "temperature"),
    ("top_p above 1", CHAT, chat(top_p=1.5), "'top_p' must be between", "top_p"),
    ("top_p a list", CHAT, chat(top_p=[1]), "'top_p' must be a number", "top_p"),
    ("min_p negative", CHAT, chat(min_p=-1), "'min_p' must be between", "min_p"),
    ("repetition_penalty zero", CHAT, chat(repetition_penalty=0), "'repetition_penalty' must be greater than 0",
     "repetition_penalty"),
    ("repetition_penalty a string", CHAT, chat(repetition_penalty="1.1"), "'repetition_penalty' must be a number",
     "repetition_penalty"),
    ("top_k below -1", CHAT, chat(top_k=-2), "'top_k' must be at least -1", "top_k"),
    ("top_k a float", CHAT, chat(top_k=1.5), "'top_k' must be an integer", "top_k"),
    ("stream a string", CHAT, chat(stream="yes"), "'stream' must be a boolean", "stream"),
    ("stream a number", COMPLETION, completion(stream=1), "'stream' must be a boolean", "stream"),
    ("stream_options without stream", CHAT, chat(stream_options={"include_usage": True}),
     "'stream_options' needs 'stream': true", "stream_options"),
    ("stream_options with stream false", CHAT, chat(stream=False, stream_options={"include_usage": True}),
     "'stream_options' needs 'stream': true", "stream_options"),
    ("stream_options not an object", CHAT, chat(stream=True, stream_options="usage"), "must be an object",
     "stream_options"),
    ("stop a number", CHAT, chat(stop=5), "'stop' must be a string or a list of strings", "stop"),
    ("stop list with a number", CHAT, chat(stop=["a", 1]), "'stop' must be a string or a list of strings", "stop"),
    ("stop an object", CHAT, chat(stop={"a": 1}), "'stop' must be a string or a list of strings", "stop"),
    ("five stop strings", CHAT, chat(stop=list("abcde")), "'stop' takes at most 4 strings", "stop"),
    ("n zero", CHAT, chat(n=0), "'n' must be at least 1", "n"),
    ("n a string", CHAT, chat(n="2"), "'n' must be an integer", "n"),
    ("seed a string", CHAT, chat(seed="1"), "'seed' must be an integer", "seed"),
    ("seed a float", CHAT, chat(seed=1.5), "'seed' must be an integer", "seed"),
    ("seed a bool", CHAT, chat(seed=True), "'seed' must be an integer", "seed"),
    ("prompt missing", COMPLETION, completion(prompt=...), "'prompt' must be a string or a list of token ids",
     "prompt"),
    ("prompt a number", COMPLETION, completion(prompt=5), "'prompt'", "prompt"),
    ("prompt empty list", COMPLETION, completion(prompt=[]), "'prompt'", "prompt"),
    ("prompt ids with a string", COMPLETION, completion(prompt=[1, "a"]), "'prompt'", "prompt"),
    ("prompt ids with a bool", COMPLETION, completion(prompt=[1, True]), "'prompt'", "prompt"),
    ("prompt batch of two strings", COMPLETION, completion(prompt=["a", "b"]), "'prompt'", "prompt"),
    ("prompt batch of one empty list", COMPLETION, completion(prompt=[[]]), "'prompt'", "prompt"),
    ("prompt batch of one bad list", COMPLETION, completion(prompt=[[1, "x"]]), "'prompt'", "prompt"),
    ("prediction a string", CHAT, chat(prediction="x"), "'prediction'", "prediction"),
    ("prediction content a number", CHAT, chat(prediction={"type": "content", "content": 5}), "'prediction.content'",
     "prediction"),
    ("prediction content a lone surrogate", CHAT, chat(prediction={"type": "content", "content": "x = '\ud800'"}),
     "not valid Unicode", "prediction"),
    ("prediction part a lone surrogate", CHAT,
     chat(prediction={"type": "content", "content": [{"type": "text", "text": "\udfff"}]}), "not valid Unicode",
     "prediction"),
    ("prediction content an image part", CHAT,
     chat(prediction={"type": "content", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}),
     "'prediction.content'", "prediction"),
]


@pytest.mark.parametrize("kind, body, message, param", [pytest.param(*case[1:], id=case[0]) for case in BAD])
def test_bad_bodies_are_rejected_with_a_message(kind: str, body: Any, message: str, param: str | None) -> None:
    with pytest.raises(BadRequestError) as caught:
        parse_generation_request(body, kind)  # type: ignore[arg-type]
    assert message in caught.value.message
    assert caught.value.param == param
    assert caught.value.status == 400
    error = caught.value.to_body()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"


# -- good bodies ----------------------------------------------------------------------------------

GOOD = [
    # (id, kind, body, {attribute: expected})
    ("chat defaults", CHAT, chat(), {"max_tokens": None, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
                                     "min_p": 0.0, "stop": (), "stream": False, "include_usage": False,
                                     "seed": None, "unsupported": (), "greedy": False, "messages": MESSAGES,
                                     "prompt": None}),
    ("legacy completions default to 16 tokens", COMPLETION, completion(), {"max_tokens": LEGACY_DEFAULT_MAX_TOKENS,
                                                                           "prompt": "Once upon a time",
                                                                           "messages": None}),
    ("max_tokens", CHAT, chat(max_tokens=9), {"max_tokens": 9}),
    ("max_completion_tokens", CHAT, chat(max_completion_tokens=5), {"max_tokens": 5}),
    ("max_completion_tokens wins over max_tokens", CHAT, chat(max_completion_tokens=5, max_tokens=9),
     {"max_tokens": 5}),
    ("max_completion_tokens null falls back to max_tokens", CHAT, chat(max_completion_tokens=None, max_tokens=9),
     {"max_tokens": 9}),
    ("completions honour max_completion_tokens", COMPLETION, completion(max_completion_tokens=3), {"max_tokens": 3}),
    ("completions max_tokens null is the legacy default", COMPLETION, completion(max_tokens=None),
     {"max_tokens": LEGACY_DEFAULT_MAX_TOKENS}),
    ("stop as a string", CHAT, chat(stop="\n"), {"stop": ("\n",)}),
    ("stop as a list", CHAT, chat(stop=["a", "bc"]), {"stop": ("a", "bc")}),
    ("four stop strings", CHAT, chat(stop=list("abcd")), {"stop": ("a", "b", "c", "d")}),
    ("stop null", CHAT, chat(stop=None), {"stop": ()}),
    ("stop empty list", CHAT, chat(stop=[]), {"stop": ()}),
    ("stream without options", CHAT, chat(stream=True), {"stream": True, "include_usage": False}),
    ("stream_options include_usage", CHAT, chat(stream=True, stream_options={"include_usage": True}),
     {"stream": True, "include_usage": True}),
    ("stream_options include_usage false", CHAT, chat(stream=True, stream_options={"include_usage": False}),
     {"include_usage": False}),
    ("stream_options empty", COMPLETION, completion(stream=True, stream_options={}), {"include_usage": False}),
    ("stream_options null without stream", CHAT, chat(stream_options=None), {"stream": False}),
    ("temperature 0 is greedy", CHAT, chat(temperature=0), {"temperature": 0.0, "greedy": True}),
    ("integer temperature", CHAT, chat(temperature=1), {"temperature": 1.0, "greedy": False}),
    ("temperature at the upper bound", CHAT, chat(temperature=2), {"temperature": 2.0}),
    ("temperature null is the default", CHAT, chat(temperature=None), {"temperature": 1.0}),
    ("top_k -1 means off", CHAT, chat(top_k=-1), {"top_k": 0}),
    ("top_k", CHAT, chat(top_k=40), {"top_k": 40}),
    ("sampling knobs", CHAT, chat(top_p=0.9, min_p=0.05, seed=7), {"top_p": 0.9, "min_p": 0.05, "seed": 7}),
    ("repetition penalty", CHAT, chat(repetition_penalty=1.3), {"repetition_penalty": 1.3}),
    ("prompt as token ids", COMPLETION, completion(prompt=[1, 2, 3]), {"prompt": [1, 2, 3]}),
    ("prompt as a batch of one string", COMPLETION, completion(prompt=["hello"]), {"prompt": "hello"}),
    ("prompt as a batch of one id list", COMPLETION, completion(prompt=[[4, 5]]), {"prompt": [4, 5]}),
    ("empty string prompt", COMPLETION, completion(prompt=""), {"prompt": ""}),
    ("message content parts and null", CHAT, chat(messages=[{"role": "user", "content": [{"type": "text",
                                                                                         "text": "hi"}]},
                                                            {"role": "assistant", "content": None}]), {}),
    ("extra unknown fields are kept in the body", CHAT, chat(user="u-1"), {"unsupported": ()}),
    ("no prediction", CHAT, chat(), {"prediction": None}),
    ("prediction content", CHAT, chat(prediction={"type": "content", "content": "def f():\n"}),
     {"prediction": "def f():\n", "unsupported": ()}),
    ("prediction text parts joined", CHAT, chat(prediction={"type": "content", "content": [
        {"type": "text", "text": "a = 1\n"}, {"type": "text", "text": "b = 2\n"}]}), {"prediction": "a = 1\nb = 2\n"}),
    ("prediction on completions", COMPLETION, completion(prediction={"type": "content", "content": "x"}),
     {"prediction": "x", "unsupported": ()}),
    ("prediction of another type is the upstream's", CHAT, chat(prediction={"type": "diff", "content": "x"}),
     {"prediction": None, "unsupported": ("prediction",)}),
    ("prediction without a type is the upstream's", CHAT, chat(prediction={"content": "x"}),
     {"prediction": None, "unsupported": ("prediction",)}),
]


@pytest.mark.parametrize("kind, body, expected", [pytest.param(*case[1:], id=case[0]) for case in GOOD])
def test_good_bodies(kind: str, body: dict, expected: dict[str, Any]) -> None:
    parsed = parse_generation_request(body, kind)  # type: ignore[arg-type]
    assert parsed.kind == kind
    assert parsed.model == "m"
    assert parsed.body == body
    for name, value in expected.items():
        assert getattr(parsed, name) == value, name


UNSUPPORTED = [
    # (id, fields, unsupported names)
    ("logit_bias", {"logit_bias": {"50256": -100}}, ("logit_bias",)),
    ("empty logit_bias is neutral", {"logit_bias": {}}, ()),
    ("null logit_bias is neutral", {"logit_bias": None}, ()),
    ("logprobs", {"logprobs": True}, ("logprobs",)),
    ("top_logprobs", {"logprobs": True, "top_logprobs": 3}, ("logprobs", "top_logprobs")),
    ("tools", {"tools": [{"type": "function", "function": {"name": "f"}}]}, ("tools",)),
    ("empty tools are neutral", {"tools": []}, ()),
    ("functions", {"functions": [{"name": "f"}]}, ("functions",)),
    ("tool_choice required", {"tool_choice": "required"}, ("tool_choice",)),
    ("tool_choice none is neutral", {"tool_choice": "none"}, ()),
    ("tool_choice auto is neutral (tools decide)", {"tool_choice": "auto"}, ()),
    ("response_format", {"response_format": {"type": "json_object"}}, ("response_format",)),
    ("guided_json", {"guided_json": {"type": "object"}}, ("guided_json",)),
    ("n > 1", {"n": 2}, ("n",)),
    ("n = 1 is neutral", {"n": 1}, ()),
    ("best_of", {"best_of": 3}, ("best_of",)),
    ("presence_penalty", {"presence_penalty": 0.5}, ("presence_penalty",)),
    ("presence_penalty 0 is neutral", {"presence_penalty": 0}, ()),
    ("presence_penalty 0.0 is neutral", {"presence_penalty": 0.0}, ()),
    ("frequency_penalty", {"frequency_penalty": -1.0}, ("frequency_penalty",)),
    ("repetition_penalty", {"repetition_penalty": 1.1}, ("repetition_penalty",)),
    ("repetition_penalty 1 is neutral", {"repetition_penalty": 1}, ()),
    ("echo", {"echo": True}, ("echo",)),
    ("suffix", {"suffix": "}"}, ("suffix",)),
    ("min_tokens", {"min_tokens": 10}, ("min_tokens",)),
    ("several, sorted", {"tools": [{}], "n": 3, "logit_bias": {"1": 1}}, ("logit_bias", "n", "tools")),
]


@pytest.mark.parametrize("fields, names", [pytest.param(*case[1:], id=case[0]) for case in UNSUPPORTED])
@pytest.mark.parametrize("kind", [CHAT, COMPLETION])
def test_unsupported_fields_are_detected(kind: str, fields: dict, names: tuple[str, ...]) -> None:
    body = chat(**fields) if kind == CHAT else completion(**fields)
    assert parse_generation_request(body, kind).unsupported == names  # type: ignore[arg-type]


# -- fuzz -----------------------------------------------------------------------------------------

FIELDS = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
          "min_p", "stop", "stream", "stream_options", "n", "seed", "logit_bias", "logprobs", "top_logprobs",
          "tools", "tool_choice", "presence_penalty", "frequency_penalty", "response_format", "echo", "best_of"]

json_scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
                | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8) | st.sampled_from(["role", "content"]), inner,
                                             max_size=4), max_leaves=12)
# Plausible bodies: mostly-valid fields with some values replaced by arbitrary JSON.
plausible_values = {
    "model": st.sampled_from(["m", ""]) | json_values,
    "messages": st.just(MESSAGES) | st.lists(st.fixed_dictionaries({"role": st.just("user")},
                                                                    optional={"content": json_values}),
                                             max_size=2) | json_values,
    "prompt": st.sampled_from(["p", [1, 2], [[3]], ["x"]]) | json_values,
    "stream": st.booleans() | json_values,
    "stream_options": st.just({"include_usage": True}) | json_values,
    "stop": st.sampled_from(["\n", ["a", "b"]]) | json_values,
}
bodies = st.fixed_dictionaries(
    {}, optional={name: plausible_values.get(name, json_values) for name in FIELDS}
) | json_values


@settings(max_examples=300, deadline=None)
@given(body=bodies, kind=st.sampled_from([CHAT, COMPLETION]))
def test_any_json_either_parses_or_is_a_bad_request(body: Any, kind: str) -> None:
    body = json.loads(json.dumps(body))  # exactly what a JSON body decodes to (NaN and all)
    try:
        parsed = parse_generation_request(body, kind)  # type: ignore[arg-type]
    except BadRequestError as exc:
        assert exc.message and exc.status == 400
        return
    # What parsed is sound enough for the rest of the proxy to use without checking again.
    assert isinstance(parsed.model, str) and parsed.model
    assert parsed.max_tokens is None or (isinstance(parsed.max_tokens, int) and parsed.max_tokens >= 1)
    assert 0.0 <= parsed.temperature <= 2.0 and 0.0 <= parsed.top_p <= 1.0 and 0.0 <= parsed.min_p <= 1.0
    assert isinstance(parsed.top_k, int) and parsed.top_k >= 0
    assert all(isinstance(s, str) for s in parsed.stop) and len(parsed.stop) <= 4
    assert isinstance(parsed.stream, bool) and isinstance(parsed.include_usage, bool)
    assert parsed.include_usage <= parsed.stream
    assert isinstance(parsed.unsupported, tuple)
    if kind == CHAT:
        assert isinstance(parsed.messages, list) and parsed.messages
    else:
        assert isinstance(parsed.prompt, str) or (isinstance(parsed.prompt, list) and parsed.prompt)
