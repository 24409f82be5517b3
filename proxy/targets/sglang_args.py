"""What SGLang's resolved server arguments (its /server_info) say about its answers, and which requests rounds over
/generate cannot reproduce because of them.

Read from SGLang's sources (python/sglang/srt/: server_args.py, configs/model_config.py, entrypoints/openai/):
- `sampling_defaults` "model" (the server's default): a chat or completion request's omitted `repetition_penalty`,
  `temperature`, `top_k`, `top_p` and `min_p` come from the model's generation_config
  (ModelConfig.get_default_sampling_params), which the server does not publish; "openai" keeps the protocol's.
  /generate never applies them, so rounds sample as the request names;
- `preferred_sampling_params`: a JSON object of defaults under every request's own fields, /generate's included;
- `reasoning_parser`: a chat answer's reasoning goes to `reasoning_content`, apart from `content`;
- `tool_call_parser`: a chat answer's tool calls are parsed into `tool_calls`; without one they stay text;
- a `model` of the form `base:adapter` selects a LoRA adapter (serving_base.py splits it at the first colon), which
  /generate rounds do not name.
Our verifier's server info has none of these (nor have older SGLang releases'): its answers are the requests' own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from proxy.wire.request import CHAT, GenerationRequest
from proxy.wire.tools import parses_tool_calls

MODEL_DEFAULTED = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p")
TRUNCATIONS = frozenset({"top_k", "top_p", "min_p"})  # off at temperature 0
ADAPTER_SEPARATOR = ":"


@dataclass(frozen=True)
class ServerArgs:
    """The server arguments that shape SGLang's answers."""

    sampling_defaults: str | None = None  # None: a server that does not say (ours, older SGLang)
    preferred: frozenset[str] = frozenset()  # fields preferred_sampling_params sets
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    published: bool = False  # whether the server info holds these arguments at all

    @classmethod
    def read(cls, server_info: dict[str, Any]) -> ServerArgs:
        """The arguments from /server_info (absent or malformed ones as unset)."""
        preferred = server_info.get("preferred_sampling_params")
        if isinstance(preferred, str):
            try:
                preferred = json.loads(preferred)
            except ValueError:
                preferred = None
        return cls(_text(server_info.get("sampling_defaults")),
                   frozenset(preferred) if isinstance(preferred, dict) else frozenset(),
                   _text(server_info.get("reasoning_parser")), _text(server_info.get("tool_call_parser")),
                   "tool_call_parser" in server_info)

    def problem(self, request: GenerationRequest) -> str | None:
        """Why the server would answer this request otherwise than rounds over /generate (None: it would not)."""
        if ADAPTER_SEPARATOR in request.model:
            return f"model {request.model!r} names a LoRA adapter (base:adapter), which rounds over /generate omit"
        if request.kind == CHAT and self.reasoning_parser:
            return f"the server parts reasoning from the answer (--reasoning-parser {self.reasoning_parser})"
        if request.kind == CHAT and parses_tool_calls(request.body) and self.published and not self.tool_call_parser:
            return "the server parses no tool calls (no --tool-call-parser): they stay in its text"
        omitted = [name for name in MODEL_DEFAULTED
                   if request.body.get(name) is None and not (request.greedy and name in TRUNCATIONS)]
        if self.sampling_defaults == "model" and omitted:
            return (f"the server fills {', '.join(omitted)} from the model's generation_config, which it does not "
                    "publish (--sampling-defaults model): name them, or start SGLang with --sampling-defaults openai")
        if self.preferred:
            return (f"the server's --preferred-sampling-params ({', '.join(sorted(self.preferred))}) apply under "
                    "every request's fields, rounds' included")
        return None

    def lines(self) -> list[tuple[str, str]]:
        """`speculoos check`'s rows for what the arguments mean (none where the server does not publish them)."""
        if not self.published:
            return []
        defaults = {None: "not published: requests are sampled as they name",
                    "openai": "the protocol's (--sampling-defaults openai)",
                    "model": "the model's generation_config (--sampling-defaults model): requests that omit "
                             f"{', '.join(MODEL_DEFAULTED)} pass through"}.get(self.sampling_defaults,
                                                                            str(self.sampling_defaults))
        if self.preferred:
            defaults += f"; --preferred-sampling-params set {', '.join(sorted(self.preferred))}: requests pass through"
        chat = [f"--reasoning-parser {self.reasoning_parser}: chat requests pass through"
                if self.reasoning_parser else "", f"--tool-call-parser {self.tool_call_parser}"
                if self.tool_call_parser else "no --tool-call-parser: chat requests with tools pass through"]
        return [("sampling defaults", defaults), ("chat answers", "; ".join(line for line in chat if line))]


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
