"""OpenAI response shapes: chunks, usage and whole bodies, and SSE framing."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from proxy.wire.request import CHAT

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def usage(prompt_tokens: int, completion_tokens: int, details: dict[str, int] | None = None) -> dict[str, Any]:
    """OpenAI usage object, with `completion_tokens_details` when given."""
    counts: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if details is not None:
        counts["completion_tokens_details"] = details
    return counts


def prediction_details(drafted: int, accepted: int) -> dict[str, int]:
    """Predicted Outputs' counts: prediction tokens drafted and accepted (they appear in the output as predicted),
    and drafted and rejected. Prediction tokens never drafted (past a change the output never came back from,
    or judged not worth verifying) count as neither."""
    return {"accepted_prediction_tokens": accepted, "rejected_prediction_tokens": drafted - accepted}


class ResponseShape:
    """Builds the chunks and the final body for one response."""

    def __init__(self, kind: str, model: str, *, include_usage: bool = False) -> None:
        self.kind = kind
        self.model = model
        self.include_usage = include_usage
        prefix = "chatcmpl" if kind == CHAT else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _envelope(self, obj: str, choices: list[dict]) -> dict[str, Any]:
        body = {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}
        if self.include_usage:
            body["usage"] = None  # every chunk but the last carries usage: null (OpenAI)
        return body

    def chunk(self, text: str | None, finish_reason: str | None, *, role: bool = False,
              logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        """One streaming chunk (`logprobs`: its tokens', when the client asked)."""
        if self.kind == CHAT:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {"content": text}
            choice = {"index": 0, "delta": delta if text is not None or role else {}, "logprobs": logprobs,
                      "finish_reason": finish_reason}
            return self._envelope("chat.completion.chunk", [choice])
        choice = {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
        return self._envelope("text_completion", [choice])

    def usage_chunk(self, usage_obj: dict[str, Any]) -> dict[str, Any]:
        """The final stream_options.include_usage chunk: no choices."""
        body = self._envelope("chat.completion.chunk" if self.kind == CHAT else "text_completion", [])
        body["usage"] = usage_obj
        return body

    def full(self, text: str, finish_reason: str | None, usage_obj: dict[str, Any], *,
             logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        """The non-streaming response body (`logprobs`: the completion's, when the client asked)."""
        if self.kind == CHAT:
            message = {"role": "assistant", "content": text}
            choice = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}
            body = self._envelope("chat.completion", [choice])
        else:
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
            body = self._envelope("text_completion", [choice])
        body["usage"] = usage_obj
        return body


def sse_event(obj: Any) -> bytes:
    """One server-sent event."""
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
