"""Hermes-format tool calls: whole answers as vLLM's hermes parser gives them, streamed deltas that add up to the
same, and the messages and tools a chat template is given."""

from __future__ import annotations

import itertools
import json
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.errors import BadRequestError
from proxy.wire import tool_stream
from proxy.wire.tool_stream import ToolCallStream
from proxy.wire.tools import (
    format_problem,
    parse_tool_calls,
    parses_tool_calls,
    request_tools,
    rewrite_body,
    template_messages,
)

WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TIME = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET", "24h": true}}\n</tool_call>'
NESTED = ('<tool_call>\n{"name": "write_file", "arguments": {"path": "a.py", "content": "def f():\\n    return {\\"'
          'a\\": [1, 2]}\\n"}}\n</tool_call>')


def numbered_ids() -> Any:
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


WHOLE = [
    # (id, text, content, [(name, arguments)]): vLLM's Hermes2ProToolParser.extract_tool_calls
    ("no call", "Paris is sunny.", "Paris is sunny.", []),
    ("one call", WEATHER, None, [("get_weather", '{"city": "Paris"}')]),
    ("content before", "Let me check.\n" + WEATHER, "Let me check.\n", [("get_weather", '{"city": "Paris"}')]),
    ("two calls", WEATHER + "\n" + TIME, None,
     [("get_weather", '{"city": "Paris"}'), ("get_time", '{"zone": "CET", "24h": true}')]),
    ("text after a call is dropped", WEATHER + "\nDone.", None, [("get_weather", '{"city": "Paris"}')]),
    ("unclosed last call", '<tool_call>\n{"name": "f", "arguments": {}}', None, [("f", "{}")]),
    ("arguments re-serialised", '<tool_call>{"name":"f","arguments":{"a":1,"b":[1,2]}}</tool_call>', None,
     [("f", '{"a": 1, "b": [1, 2]}')]),
    ("non-ASCII kept", '<tool_call>{"name": "f", "arguments": {"city": "Zürich 東京"}}</tool_call>', None,
     [("f", '{"city": "Zürich 東京"}')]),
    ("escapes and braces in strings", NESTED, None,
     [("write_file", json.dumps({"path": "a.py", "content": 'def f():\n    return {"a": [1, 2]}\n'}))]),
    ("malformed JSON: all content", '<tool_call>\n{"name": "f", "arguments": {"x": }\n</tool_call>',
     '<tool_call>\n{"name": "f", "arguments": {"x": }\n</tool_call>', []),
    ("one malformed of two: all content", WEATHER + "<tool_call>{oops}</tool_call>",
     WEATHER + "<tool_call>{oops}</tool_call>", []),
    ("no arguments: all content", '<tool_call>{"name": "f"}</tool_call>', '<tool_call>{"name": "f"}</tool_call>', []),
    ("name not a string: all content", '<tool_call>{"name": 3, "arguments": {}}</tool_call>',
     '<tool_call>{"name": 3, "arguments": {}}</tool_call>', []),
    ("not an object: all content", "<tool_call>[1]</tool_call>", "<tool_call>[1]</tool_call>", []),
    ("empty region: all content", "<tool_call></tool_call>", "<tool_call></tool_call>", []),
    ("a partial tag is text", "x <tool_cal", "x <tool_cal", []),
]


@pytest.mark.parametrize(("text", "content", "calls"), [case[1:] for case in WHOLE], ids=[case[0] for case in WHOLE])
def test_whole_answers_read_as_vllm_reads_them(text: str, content: str | None, calls: list[tuple[str, str]]) -> None:
    parsed = parse_tool_calls(text, numbered_ids())
    assert parsed.content == content
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in parsed.tool_calls] == calls
    assert [c["id"] for c in parsed.tool_calls] == [f"call_{i}" for i in range(len(calls))]
    assert all(c["type"] == "function" for c in parsed.tool_calls)


def stream_all(pieces: list[str], finish: str = "stop") -> tuple[str, list[dict], str, list[dict]]:
    """Content, calls (index order: id, name, arguments) and finish reason of a streamed answer, and its deltas."""
    stream, deltas = ToolCallStream(numbered_ids()), []
    for piece in pieces:
        deltas.append(stream.push(piece))
    held, reason = stream.finish(finish)
    deltas.append(held)
    calls: dict[int, dict] = {}
    for delta in deltas:
        for entry in delta.get("tool_calls", []):
            call = calls.setdefault(entry["index"], {"id": None, "name": None, "arguments": ""})
            if "id" in entry:
                assert call["id"] is None and entry["type"] == "function", "id and type on a call's first entry only"
                call.update(id=entry["id"], name=entry["function"]["name"])
            call["arguments"] += entry["function"].get("arguments", "")
    assert sorted(calls) == list(range(len(calls)))
    return "".join(d.get("content", "") for d in deltas), [calls[i] for i in sorted(calls)], reason, deltas


STREAMED = [
    # (id, text, content, [(name, arguments)], finish in, finish out)
    ("plain", "Paris is sunny.", "Paris is sunny.", [], "stop", "stop"),
    ("one call", WEATHER, "", [("get_weather", '{"city": "Paris"}')], "stop", "tool_calls"),
    ("content before", "Checking.\n" + WEATHER, "Checking.\n", [("get_weather", '{"city": "Paris"}')], "stop",
     "tool_calls"),
    ("two calls", WEATHER + "\n" + TIME, "",
     [("get_weather", '{"city": "Paris"}'), ("get_time", '{"zone": "CET", "24h": true}')], "stop", "tool_calls"),
    ("escapes and braces in strings", NESTED, "",
     [("write_file", '{"path": "a.py", "content": "def f():\\n    return {\\"a\\": [1, 2]}\\n"}')], "stop",
     "tool_calls"),
    ("cut at length mid-call", '<tool_call>\n{"name": "f", "arguments": {"x": [1, 2', "", [("f", '{"x": [1, 2')],
     "length", "length"),
    ("cut before the name", '<tool_call>\n{"na', "", [], "length", "length"),
    ("a held partial tag is flushed at the end", "a <tool_ca", "a <tool_ca", [], "stop", "stop"),
    ("a less-than sign is text", "if a < b: <b>", "if a < b: <b>", [], "stop", "stop"),
]


@pytest.mark.parametrize(("text", "content", "calls", "finish", "reason"), [case[1:] for case in STREAMED],
                         ids=[case[0] for case in STREAMED])
@pytest.mark.parametrize("split", ["whole", "by character"])
def test_streamed_deltas_add_up_to_the_answer(text: str, content: str, calls: list[tuple[str, str]], finish: str,
                                              reason: str, split: str) -> None:
    pieces = [text] if split == "whole" else list(text)
    streamed, streamed_calls, streamed_reason, deltas = stream_all(pieces, finish)
    assert streamed == content
    assert [(c["name"], c["arguments"]) for c in streamed_calls] == calls
    assert [c["id"] for c in streamed_calls] == [f"call_{i}" for i in range(len(calls))]
    assert streamed_reason == reason
    if "<" not in content:
        assert not [d for d in deltas if "<" in d.get("content", "")], "no piece of a tag goes out as content"


@given(st.lists(st.integers(min_value=0, max_value=len(WEATHER + TIME)), max_size=12))
def test_any_split_streams_what_the_whole_answer_holds(cuts: list[int]) -> None:
    text = "Sure.\n" + WEATHER + "\n" + TIME
    bounds = [0, *sorted(cuts), len(text)]
    content, calls, reason, _ = stream_all([text[a:b] for a, b in itertools.pairwise(bounds)])
    whole = parse_tool_calls(text)
    assert content == whole.content
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == \
        [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in whole.tool_calls]
    assert reason == "tool_calls"


def chat_body(text: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                         "finish_reason": "stop"}]}


def test_a_body_with_calls_has_null_content_and_finishes_with_tool_calls() -> None:
    body = chat_body(WEATHER)
    rewrite_body(body, WEATHER, numbered_ids())
    assert body["choices"][0] == {
        "index": 0, "logprobs": None, "finish_reason": "tool_calls",
        "message": {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_0", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}}


def test_a_body_without_calls_is_left_as_it_is() -> None:
    body = chat_body("Paris is sunny.")
    rewrite_body(body, "Paris is sunny.")
    assert body == chat_body("Paris is sunny.")


def chunk(text: str | None, finish: str | None, logprobs: Any = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": text}, "logprobs": logprobs, "finish_reason": finish}]}


CHUNKS = [
    # (id, [(text, finish)], [(delta, finish) sent]): what goes out
    ("content goes out as it comes", [("Hi", None), (" there", "stop")],
     [({"content": "Hi"}, None), ({"content": " there"}, "stop")]),
    ("a possible tag is held, then sent", [("a <tool", None), ("kit>", None), ("", "stop")],
     [({"content": "a "}, None), ({"content": "<toolkit>"}, None), ({}, "stop")]),
    ("a call's pieces", [("<tool_call>\n", None), ('{"name": "f", ', None), ('"arguments": {"x": 1}}', None),
                         ("\n</tool_call>", "stop")],
     [({"tool_calls": [{"index": 0, "id": "call_0", "type": "function", "function": {"name": "f", "arguments": ""}}]},
       None), ({"tool_calls": [{"index": 0, "function": {"arguments": '{"x": 1}'}}]}, None), ({}, "tool_calls")]),
]


@pytest.mark.parametrize(("pushed", "sent"), [case[1:] for case in CHUNKS], ids=[case[0] for case in CHUNKS])
def test_chunks_carry_the_tool_deltas_and_empty_ones_are_not_sent(pushed: list, sent: list) -> None:
    stream, out = ToolCallStream(numbered_ids()), []
    for text, finish in pushed:
        built = chunk(text, finish)
        if stream.shape_chunk(built, text, finish):
            out.append((built["choices"][0]["delta"], built["choices"][0]["finish_reason"]))
    assert out == sent


def test_a_chunk_with_log_probs_is_sent_even_while_text_is_held() -> None:
    built = chunk("<tool", None, logprobs={"content": []})
    assert ToolCallStream().shape_chunk(built, "<tool", None)
    assert built["choices"][0]["delta"] == {}


PARSED = [
    # (id, body fields, parsed for tool calls)
    ("tools, no choice", {"tools": [{"type": "function"}]}, True),
    ("tools, auto", {"tools": [{"type": "function"}], "tool_choice": "auto"}, True),
    ("tools, none", {"tools": [{"type": "function"}], "tool_choice": "none"}, False),
    ("tools, required", {"tools": [{"type": "function"}], "tool_choice": "required"}, False),
    ("no tools", {"tool_choice": "auto"}, False),
    ("empty tools", {"tools": []}, False),
]


@pytest.mark.parametrize(("body", "parsed"), [case[1:] for case in PARSED], ids=[case[0] for case in PARSED])
def test_which_requests_are_parsed_for_tool_calls(body: dict, parsed: bool) -> None:
    assert parses_tool_calls(body) is parsed


def assistant(arguments: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}]}


TEMPLATED = [
    # (id, arguments sent, arguments the template sees): vLLM's _postprocess_messages
    ("a JSON string", '{"x": 1}', {"x": 1}), ("an object", {"x": 1}, {"x": 1}), ("empty", "", {}),
    ("missing", None, {}), ("not JSON", "{x", {}), ("not an object", "[1]", {}),
]


@pytest.mark.parametrize(("sent", "seen"), [case[1:] for case in TEMPLATED], ids=[case[0] for case in TEMPLATED])
def test_the_template_sees_tool_call_arguments_as_objects(sent: Any, seen: dict) -> None:
    messages = [{"role": "user", "content": "hi"}, assistant(sent),
                {"role": "tool", "content": "42", "tool_call_id": "c"}]
    rendered = template_messages(messages)
    assert rendered[1]["tool_calls"][0]["function"] == {"name": "f", "arguments": seen}
    assert rendered[0] == messages[0] and rendered[2] == messages[2]
    assert messages[1] == assistant(sent), "the request's own messages are left as they are"


@pytest.mark.parametrize(("tools", "expected"),
                         [(None, None), ([], None), ([{"type": "function"}], [{"type": "function"}])])
def test_request_tools(tools: Any, expected: Any) -> None:
    assert request_tools({"tools": tools}) == expected


@pytest.mark.parametrize("tools", ["f", [1], {"type": "function"}])
def test_request_tools_refuses_what_is_not_a_list_of_objects(tools: Any) -> None:
    with pytest.raises(BadRequestError, match="'tools' must be a list of objects"):
        request_tools({"tools": tools})


def test_a_prompt_without_the_hermes_format_is_a_problem() -> None:
    assert format_problem("<|im_start|>system\n...<tool_call>\n{...}\n</tool_call><|im_end|>") is None
    assert "<tool_call>" in (format_problem("<|im_start|>system\nYou are a helpful assistant.") or "")


def lines_run(module_file: str, work) -> int:
    """How many lines of the module's code ran during work(): its work, counted in Python steps."""
    count = 0

    def local(frame, event, arg):
        nonlocal count
        count += event == "line"
        return local

    def calls(frame, event, arg):
        return local if frame.f_code.co_filename == module_file else None

    sys.settrace(calls)
    try:
        work()
    finally:
        sys.settrace(None)
    return count


LONG_ARGUMENTS = json.dumps({"path": "a.py", "content": "x = {'a': [1, 2]}\n" * 120})  # about 2,500 characters


@pytest.mark.parametrize("piece", [4, 16])
def test_a_long_call_streams_in_steps_that_grow_with_its_length_not_its_square(piece: int) -> None:
    text = f'Sure.\n<tool_call>\n{{"name": "write_file", "arguments": {LONG_ARGUMENTS}}}\n</tool_call>'
    pieces = [text[at:at + piece] for at in range(0, len(text), piece)]
    results: list = []
    steps = lines_run(tool_stream.__file__, lambda: results.append(stream_all(pieces)))
    content, calls, reason, _ = results[0]
    assert (content, calls[0]["arguments"], reason) == ("Sure.\n", LONG_ARGUMENTS, "tool_calls")
    assert steps <= 40 * len(text)  # about 20: rescanning the whole text on every push takes 300 to 1,200
