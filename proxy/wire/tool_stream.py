"""Hermes-format tool calls streamed: one chat answer's text -> deltas of content and tool calls, each push reading
only what is new.

As vLLM's `Hermes2ProToolParser` streams them (proxy/wire/tools.py has the format): content up to the first tag,
holding back a tail that may begin one; a call's index, id, type and name once its name is complete, then its
arguments' raw text as it grows (matched by braces, so the object that closes the call is left out); finish_reason
becomes "tool_calls" where generation stopped on its own.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from proxy.wire.shapers import ResponseShaper
from proxy.wire.tools import ARGUMENTS, END, NAME, START, STOP, TOOL_CALLS, call_id, rewrite_body


def _overlap(text: str, tag: str) -> int:
    """Length of the longest tail of text that begins tag (text that may still become the tag)."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


def _search(pattern: re.Pattern[str], literal: str, text: str, start: int, stop: int) -> tuple[re.Match | None, int]:
    """The first match in text[start:stop] of a pattern that begins with literal, and where to search on if none:
    the last occurrence of literal (the patterns hold none inside a match but a complete one), or the tail."""
    last = text.rfind(literal, start, stop)
    return pattern.search(text, start, stop), last if last >= 0 else max(start, stop - len(literal) + 1)


class _Arguments:
    """Where a call's arguments are in the stream's text: from the first character after `"arguments":` that is
    not a space; an object or array up to its matching close, found by looking at each character once (strings
    and escapes skipped), or as far as the call's text has come; a scalar (rare) up to the call's closing brace."""

    def __init__(self, after_colon: int) -> None:
        self.start: int | None = None
        self._from = after_colon  # where the text is looked at next
        self._depth, self._in_string, self._escaped = 0, False, False
        self._end: int | None = None  # just after the matching close, once found

    def span(self, text: str, kept: int, solid: int) -> tuple[int, int]:
        """Where they begin and end (so far) in text whose call region ends at kept, its last non-space at solid."""
        if self.start is None:
            self._from = kept - len(text[self._from:kept].lstrip())
            if self._from == kept:
                return 0, 0
            self.start = self._from
        opening = text[self.start]
        if opening not in "{[":
            return self.start, self.start + len(text[self.start:solid].removesuffix("}").rstrip())
        closing = "}" if opening == "{" else "]"
        for at in range(self._from, kept if self._end is None else self._from):  # once closed, nothing to look at
            char = text[at]
            if self._in_string:
                self._escaped, self._in_string = (False, True) if self._escaped else (char == "\\", char != '"')
            elif char == '"':
                self._in_string = True
            elif char == opening or char == closing:
                self._depth += 1 if char == opening else -1
                if self._depth == 0:
                    self._end = at + 1
                    break
        self._from = kept
        return self.start, solid if self._end is None else self._end


class _Region:
    """One call region of the stream's text (after the start tag, up to the end tag or on), read as it comes."""

    def __init__(self, body: int) -> None:
        self.end: int | None = None  # where its end tag begins, once there
        self.name: str | None = None
        # Its text so far ends at _kept (a tail that may begin the end tag is held back), its last non-space at _solid.
        self._kept = self._solid = body
        self._end_from = self._name_from = self._arguments_from = body  # where each search goes on
        self._arguments: _Arguments | None = None

    def read(self, text: str) -> tuple[int, int]:
        """Take in the text that came since the last read; where the arguments so far are."""
        if self.end is None:
            end = text.find(END, self._end_from)
            self.end = end if end >= 0 else None
            self._end_from = max(self._end_from, len(text) - len(END) + 1)
        kept = self.end if self.end is not None else len(text) - _overlap(text[self._end_from:], END)
        if solid := len(text[self._kept:kept].rstrip()):
            self._solid = self._kept + solid
        self._kept = kept
        if self.name is None:
            match, self._name_from = _search(NAME, '"name"', text, self._name_from, kept)
            self.name = match.group(1) if match else None
        if self._arguments is None:
            match, self._arguments_from = _search(ARGUMENTS, '"arguments"', text, self._arguments_from, kept)
            self._arguments = _Arguments(match.end()) if match else None
        return (0, 0) if self._arguments is None else self._arguments.span(text, kept, self._solid)


class ToolCallStream(ResponseShaper):
    """One chat answer's text -> content and tool calls: streamed as deltas (each push reads only what is new), or
    whole."""

    def __init__(self, new_id: Callable[[], str] = call_id) -> None:
        self._new_id = new_id
        self._text, self._content_sent = "", 0
        self._first_tag: int | None = None
        self._next_tag = 0  # where the next call region's start tag is searched for
        self._region: _Region | None = None  # the call region being read
        self._read = 0  # call regions read to their end
        self._stuck = False  # a closed region had no name: no later call is read
        self._arguments_sent: list[int] = []  # per call whose id and name went out, its arguments' length sent

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
        if self._first_tag is None and self._content_sent < len(self._text):
            delta["content"] = self._text[self._content_sent:]
            self._content_sent = len(self._text)
        return delta, TOOL_CALLS if self._arguments_sent and finish_reason == STOP else finish_reason

    def _content(self) -> str:
        if self._first_tag is None:
            self._first_tag = self._region_start()
        sendable = self._first_tag if self._first_tag is not None else len(self._text) - _overlap(self._text, START)
        if sendable <= self._content_sent:
            return ""
        content, self._content_sent = self._text[self._content_sent: sendable], sendable
        return content

    def _region_start(self) -> int | None:
        """Where the next call region's start tag is (the region is then read), if it has come."""
        start = self._text.find(START, self._next_tag)
        self._next_tag = max(self._next_tag, len(self._text) - len(START) + 1)
        self._region = _Region(start + len(START)) if start >= 0 else None  # none was being read
        return start if start >= 0 else None

    def _call_deltas(self) -> list[dict[str, Any]]:
        deltas = []
        while not self._stuck and (self._region is not None or self._region_start() is not None):
            region, index = self._region, self._read
            arguments_start, arguments_end = region.read(self._text)
            entry: dict[str, Any] = {"index": index}
            if index >= len(self._arguments_sent):
                if region.name is None:
                    self._stuck = region.end is not None
                    break  # a later call cannot start before this one is named
                entry.update(id=self._new_id(), type="function", function={"name": region.name, "arguments": ""})
                self._arguments_sent.append(0)
            sent_end = arguments_start + self._arguments_sent[index]
            if arguments_end > sent_end:
                entry.setdefault("function", {})["arguments"] = self._text[sent_end:arguments_end]
                self._arguments_sent[index] = arguments_end - arguments_start
            if "function" in entry:
                deltas.append(entry)
            if region.end is None:
                break  # what comes next may still belong to it
            self._region, self._read, self._next_tag = None, index + 1, region.end + len(END)
        return deltas

    def shape_chunk(self, chunk: dict[str, Any], text: str | None, finish_reason: str | None) -> bool:
        """Give a chat chunk the delta and finish reason of `text`; False when it has nothing left to send."""
        choice = chunk["choices"][0]
        delta = self.push(text or "")
        if finish_reason is not None:
            held, finish_reason = self.finish(finish_reason)
            if "content" in held:
                delta["content"] = delta.get("content", "") + held["content"]
        choice["delta"], choice["finish_reason"] = delta, finish_reason
        return bool(delta) or finish_reason is not None or choice.get("logprobs") is not None

    def shape_body(self, body: dict[str, Any], text: str) -> None:
        rewrite_body(body, text, self._new_id)
