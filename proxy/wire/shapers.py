"""Response shapers: what a generation's answer carries besides its text, each behind one interface.

The emitter builds each chunk, the whole body and the usage object, then hands them to the request's shapers in
order; a shaper changes them in place (log-probs, tool calls, Predicted Outputs' counts, the proxy's own report).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


class ResponseShaper:
    """One feature of an answer; every hook does nothing unless the shaper needs it."""

    def add(self, tokens: Sequence[int]) -> None:
        """Tokens the text stream took, in order."""

    def shape_chunk(self, chunk: dict[str, Any], text: str | None, finish_reason: str | None) -> bool:
        """Shape a streamed chunk of `text`; False when it has nothing left to send (it is held back)."""
        return True

    def shape_body(self, body: dict[str, Any], text: str) -> None:
        """Shape the whole (non-streamed) body of an answer whose text is `text`."""

    def shape_usage(self, usage: dict[str, Any], carrier: dict[str, Any]) -> None:
        """Shape the usage object and what carries it: the whole body, or a stream's usage chunk."""


class PredictionCounts(ResponseShaper):
    """Predicted Outputs' counts in the usage's `completion_tokens_details`."""

    def __init__(self, counts: Callable[[], tuple[int, int]]) -> None:
        self._counts = counts  # -> (prediction tokens drafted, accepted), read once the answer is complete

    def shape_usage(self, usage: dict[str, Any], carrier: dict[str, Any]) -> None:
        drafted, accepted = self._counts()
        # Accepted tokens appear in the output as predicted; prediction tokens never drafted (past a change the
        # output never came back from, or judged not worth verifying) count as neither.
        usage["completion_tokens_details"] = {"accepted_prediction_tokens": accepted,
                                              "rejected_prediction_tokens": drafted - accepted}


class Report(ResponseShaper):
    """The proxy's own report of the generation, as the `speculoos` field beside the usage."""

    def __init__(self, report: Callable[[], dict[str, Any]]) -> None:
        self._report = report

    def shape_usage(self, usage: dict[str, Any], carrier: dict[str, Any]) -> None:
        carrier["speculoos"] = self._report()
