"""Tool-call requests as a coding agent sends them, and one greedy answer read as content, calls and finish."""

from __future__ import annotations

import json
from typing import Any

import openai

ON, OFF = {"X-Speculoos": "on"}, {"X-Speculoos": "off"}
MAX_TOKENS = 48

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city's name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
WRITE_FILE = {"type": "function", "function": {
    "name": "write_file", "description": "Write text to a file, replacing what it held.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                   "required": ["path", "content"]}}}
TOOLS = [WEATHER, WRITE_FILE]
CALLED = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}

# Qwen2.5-Coder (0.5B and 1.5B, Q4) answers these with the call as JSON in a code block rather than in <tool_call>
# tags: whatever they write, the proxy must answer what the target answers.
CASES = {
    "one call": [{"role": "user", "content": "What is the weather in Paris right now?"}],
    "a file": [{"role": "user", "content": "Save a Python script that prints 'hello' to hello.py."}],
    "after the tool answered": [{"role": "user", "content": "What is the weather in Paris right now?"}, CALLED,
                                {"role": "tool", "tool_call_id": "call_1",
                                 "content": '{"temperature": 21, "sky": "clear"}'}],
}


def answer(client: openai.OpenAI, messages: list[dict], stream: bool, model: str = "test",
           **extra: Any) -> tuple[str, tuple, str, str | None]:
    """(content, calls as (name, arguments object), finish reason, the proxy's mode) of one greedy request."""
    common = {"model": model, "messages": messages, "tools": TOOLS, "max_tokens": MAX_TOKENS, "temperature": 0,
              **extra}
    raw = client.chat.completions.with_raw_response.create(stream=stream, **common)
    mode = raw.headers.get("x-speculoos-mode")
    if not stream:
        choice = raw.parse().choices[0]
        calls = tuple((c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or ())
        assert all(c.id and c.type == "function" for c in choice.message.tool_calls or ())
        return choice.message.content or "", calls, choice.finish_reason, mode
    content, pieces, finish = "", {}, []
    for chunk in raw.parse():
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or ():
            if call.id is not None:
                assert call.index not in pieces and call.function.name, "a call is named once, on its first chunk"
                pieces[call.index] = [call.function.name, ""]
            pieces[call.index][1] += call.function.arguments or ""
        if chunk.choices[0].finish_reason:
            finish.append(chunk.choices[0].finish_reason)
    assert len(finish) == 1, "exactly one chunk carries finish_reason"
    assert "<tool_call" not in content
    calls = tuple((name, json.loads(arguments)) for _, (name, arguments) in sorted(pieces.items()))
    return content, calls, finish[0], mode
