"""Hermes-format tool calls in generated text -> OpenAI `tool_calls`, whole or streamed; and tools in the prompt.

Qwen2.5, Hermes and many other templates ask the model for `<tool_call>\\n{"name": ..., "arguments": {...}}\\n
</tool_call>`, possibly several, after optional content. The answers follow vLLM's `Hermes2ProToolParser`
(vllm/tool_parsers/hermes_tool_parser.py) and its chat server:
- whole: content is the text before the first tag (null when empty); every region must parse as a JSON object
  with a string `name` and an `arguments`, else there is no call and the whole text is content; arguments are
  re-serialised (`json.dumps(..., ensure_ascii=False)`); finish_reason becomes "tool_calls";
- streamed: proxy/wire/tool_stream.py.
Text after the first tag that is not a call (between or after calls) is not returned, as in vLLM.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.errors import BadRequestError

START, END = "<tool_call>", "</tool_call>"
REGIONS = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)
NAME = re.compile(r'"name"\s*:\s*"([^"]+)"')
ARGUMENTS = re.compile(r'"arguments"\s*:')
TOOL_CALLS = "tool_calls"  # the finish reason of an answer that calls tools
STOP = "stop"
PARSED_CHOICES = (None, "auto")  # tool_choice values whose output is parsed ("none": the text is content)


def call_id() -> str:
    """A tool call id in OpenAI's shape."""
    return f"call_{uuid.uuid4().hex[:24]}"


def parses_tool_calls(body: dict) -> bool:
    """Whether a chat request's output is parsed for tool calls: tools given, tool_choice absent or "auto"."""
    tools = body.get("tools")
    return isinstance(tools, list) and bool(tools) and body.get("tool_choice") in PARSED_CHOICES


def request_tools(body: dict) -> list[dict] | None:
    """The request's tools for the chat template (None when it has none); a 400 for anything but a list of objects."""
    tools = body.get("tools")
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise BadRequestError("'tools' must be a list of objects", param="tools")
    return tools


def template_messages(messages: list[dict]) -> list[dict]:
    """Messages as chat templates expect them: assistant tool calls' JSON-string arguments as objects.

    As vLLM renders them (vllm/renderers/chat_utils.py `_postprocess_messages`): arguments that are missing,
    empty, not JSON or not a JSON object become {}.
    """
    return [_template_message(message) for message in messages]


def _template_message(message: dict) -> dict:
    calls = message.get("tool_calls")
    if message.get("role") != "assistant" or not isinstance(calls, list):
        return message
    rendered = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            rendered.append(call)
            continue
        rendered.append({**call, "function": {**function, "arguments": _arguments_object(function.get("arguments"))}})
    return {**message, "tool_calls": rendered}


def _arguments_object(arguments: Any) -> dict:
    if isinstance(arguments, str) and arguments:
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return {}
    return arguments if isinstance(arguments, dict) else {}


def format_problem(prompt_text: str) -> str | None:
    """Why tool calls cannot be parsed from a prompt rendered with tools (None: its template asks for Hermes)."""
    if START not in prompt_text:
        return f"the chat template renders tools without a {START} format the proxy can parse"
    return None


@dataclass(frozen=True)
class ToolMessage:
    """A whole generation read as content and tool calls."""

    content: str | None
    tool_calls: tuple[dict, ...]


def parse_tool_calls(text: str, new_id: Callable[[], str] = call_id) -> ToolMessage:
    """The content and the calls of a whole generation; malformed calls leave the whole text as content."""
    if START not in text:
        return ToolMessage(text, ())
    try:
        calls = [json.loads(closed or unclosed) for closed, unclosed in REGIONS.findall(text)]
        tool_calls = tuple(_call(new_id(), call["name"], json.dumps(call["arguments"], ensure_ascii=False))
                           for call in calls)
    except (ValueError, KeyError, TypeError):  # not JSON, not an object, or a name or arguments missing
        return ToolMessage(text, ())
    content = text[: text.index(START)]
    return ToolMessage(content or None, tool_calls)


def _call(identifier: str, name: Any, arguments: str) -> dict:
    if not isinstance(name, str):
        raise TypeError("a tool call's name must be a string")
    return {"id": identifier, "type": "function", "function": {"name": name, "arguments": arguments}}


def rewrite_body(body: dict[str, Any], text: str, new_id: Callable[[], str] = call_id) -> None:
    """Give a whole chat body the content and tool calls of `text`, as vLLM answers them."""
    parsed = parse_tool_calls(text, new_id)
    if not parsed.tool_calls:
        return
    choice = body["choices"][0]
    choice["message"].update(content=parsed.content, tool_calls=list(parsed.tool_calls))
    choice["finish_reason"] = TOOL_CALLS


def prompt_text(token_bytes: Callable[[int], bytes], prompt_ids: Sequence[int]) -> str:
    """A prompt's text as the output would show it (special tokens render as nothing)."""
    return b"".join(token_bytes(token) for token in prompt_ids).decode("utf-8", errors="replace")
