"""Hermes-format tool calls in generated text -> OpenAI `tool_calls`, whole or streamed; and tools in the prompt.

Qwen2.5, Hermes and many other templates ask the model for `<tool_call>\\n{"name": ..., "arguments": {...}}\\n
</tool_call>`, possibly several, after optional content. The answers follow vLLM's `Hermes2ProToolParser`
(vllm/tool_parsers/hermes_tool_parser.py) and its chat server:
- whole: content is the text before the first tag (null when empty); every region must parse as a JSON object
  with a string `name` and an `arguments`, else there is no call and the whole text is content; arguments are
  re-serialised (`json.dumps(..., ensure_ascii=False)`); finish_reason becomes "tool_calls";
- streamed: content up to the first tag, holding back a tail that may begin one; a call's index, id, type and
  name once its name is complete, then its arguments' raw text as it grows (matched by braces, so the object
  that closes the call is left out); finish_reason becomes "tool_calls" where generation stopped on its own.
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
ARGUMENTS = re.compile(r'"arguments"\s*:\s*')
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


def _overlap(text: str, tag: str) -> int:
    """Length of the longest tail of text that begins tag (text that may still become the tag)."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


def _regions(text: str) -> list[tuple[str, bool]]:
    """(JSON text, closed) of each call region so far; an unclosed one without a tail that may begin its end."""
    regions, position = [], 0
    while (start := text.find(START, position)) >= 0:
        body_start = start + len(START)
        end = text.find(END, body_start)
        if end < 0:
            body = text[body_start:]
            regions.append((body[: len(body) - _overlap(body, END)].strip(), False))
            break
        regions.append((text[body_start:end].strip(), True))
        position = end + len(END)
    return regions


def _arguments_text(region: str) -> str | None:
    """The raw text of a region's arguments so far: an object or array up to its matching close, or what has come."""
    match = ARGUMENTS.search(region)
    if match is None:
        return None
    raw = region[match.end():]
    if not raw or raw[0] not in "{[":
        return raw.rstrip().removesuffix("}").rstrip()  # a scalar (rare): the call's closing brace is not its own
    opening, closing = raw[0], "}" if raw[0] == "{" else "]"
    depth, in_string, escaped = 0, False, False
    for index, char in enumerate(raw):
        if in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
            continue
        if char == '"':
            in_string = True
        elif char == opening:
            depth += 1
        elif char == closing:
            depth -= 1
            if depth == 0:
                return raw[: index + 1]
    return raw


class ToolCallStream:
    """One streamed chat answer's text -> deltas of content and tool calls."""

    def __init__(self, new_id: Callable[[], str] = call_id) -> None:
        self._new_id = new_id
        self._text = ""
        self._content_sent = 0
        self._names_sent = 0  # calls whose id and name went out
        self._arguments_sent: list[str] = []

    def push(self, text: str) -> dict[str, Any]:
        """The delta for new text: `content` and `tool_calls` when there are any (may be empty)."""
        self._text += text
        delta: dict[str, Any] = {}
        if content := self._content():
            delta["content"] = content
        if calls := self._call_deltas():
            delta[TOOL_CALLS] = calls
        return delta

    def finish(self, finish_reason: str) -> tuple[dict[str, Any], str]:
        """What was held back as possibly a tag (it was not), and the answer's finish reason."""
        delta: dict[str, Any] = {}
        if START not in self._text and self._content_sent < len(self._text):
            delta["content"] = self._text[self._content_sent:]
            self._content_sent = len(self._text)
        return delta, TOOL_CALLS if self._names_sent and finish_reason == STOP else finish_reason

    def _content(self) -> str:
        start = self._text.find(START)
        sendable = start if start >= 0 else len(self._text) - _overlap(self._text, START)
        if sendable <= self._content_sent:
            return ""
        content, self._content_sent = self._text[self._content_sent: sendable], sendable
        return content

    def _call_deltas(self) -> list[dict[str, Any]]:
        deltas = []
        for index, (region, closed) in enumerate(_regions(self._text)):
            entry: dict[str, Any] = {"index": index}
            if index >= self._names_sent:
                name = NAME.search(region)
                if name is None:
                    break  # a later call cannot start before this one is named
                entry.update(id=self._new_id(), type="function", function={"name": name.group(1), "arguments": ""})
                self._names_sent = index + 1
                self._arguments_sent.append("")
            arguments, sent = _arguments_text(region) or "", self._arguments_sent[index]
            if len(arguments) > len(sent) and arguments.startswith(sent):
                entry.setdefault("function", {})["arguments"] = arguments[len(sent):]
                self._arguments_sent[index] = arguments
            if "function" in entry:
                deltas.append(entry)
        return deltas

    def rewrite_chunk(self, chunk: dict[str, Any], text: str | None, finish_reason: str | None) -> bool:
        """Give a chat chunk the delta and finish reason of `text`; False when it has nothing left to send."""
        choice = chunk["choices"][0]
        delta = self.push(text or "")
        if finish_reason is not None:
            held, finish_reason = self.finish(finish_reason)
            if "content" in held:
                delta["content"] = delta.get("content", "") + held["content"]
        choice["delta"], choice["finish_reason"] = delta, finish_reason
        return bool(delta) or finish_reason is not None or choice.get("logprobs") is not None


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
