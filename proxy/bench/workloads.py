"""Benchmark workloads: JSON files shipped in `proxy/workloads/`, validated once when loaded.

A workload file is `{"name", "description", "prompts": [entry, ...]}`; each entry is
    {"kind": "chat", "messages": [{"role", "content"}, ...] | "text": str, "temperature", "max_tokens"}
    {"kind": "completion", "text": str, "temperature", "max_tokens"}
A chat entry given as `text` is one user message. Either kind may add `"prediction": str`, the output
expected (Predicted Outputs: sent as `prediction` of type content). Unknown keys are errors.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

CHAT = "chat"
COMPLETION = "completion"
MIN_PROMPTS = 10  # a workload with fewer says little about a distribution of requests
ENTRY_KEYS = {"kind", "text", "messages", "temperature", "max_tokens", "prediction"}
ROLES = {"system", "user", "assistant"}
MAX_TEMPERATURE = 2.0


class WorkloadError(ValueError):
    """A workload file is missing or malformed; the message names the file and the entry."""


@dataclass(frozen=True)
class Prompt:
    """One request of a workload."""

    kind: str  # CHAT or COMPLETION
    text: str | None  # completion prompt
    messages: tuple[dict[str, str], ...] | None  # chat messages
    temperature: float
    max_tokens: int
    prediction: str | None = None  # the output expected, sent as a Predicted Outputs `prediction`

    @property
    def greedy(self) -> bool:
        """Temperature 0: the proxy's output must equal the target's own."""
        return self.temperature == 0.0

    @property
    def path(self) -> str:
        """The OpenAI endpoint this prompt goes to."""
        return "/v1/chat/completions" if self.kind == CHAT else "/v1/completions"

    def body(self, model: str, max_tokens: int | None = None) -> dict[str, Any]:
        """A streamed OpenAI request body, usage included."""
        body: dict[str, Any] = {"model": model, "temperature": self.temperature,
                                "max_tokens": max_tokens or self.max_tokens, "stream": True,
                                "stream_options": {"include_usage": True}}
        if self.kind == CHAT:
            body["messages"] = [dict(m) for m in self.messages or ()]
        else:
            body["prompt"] = self.text
        if self.prediction is not None:
            body["prediction"] = {"type": "content", "content": self.prediction}
        return body


@dataclass(frozen=True)
class Workload:
    """A named list of prompts."""

    name: str
    description: str
    prompts: tuple[Prompt, ...]


def _entry(raw: Any, where: str) -> Prompt:
    if not isinstance(raw, dict):
        raise WorkloadError(f"{where}: must be an object")
    if unknown := set(raw) - ENTRY_KEYS:
        raise WorkloadError(f"{where}: unknown keys {sorted(unknown)}")
    kind = raw.get("kind")
    if kind not in (CHAT, COMPLETION):
        raise WorkloadError(f"{where}: kind must be 'chat' or 'completion', not {kind!r}")
    temperature = raw.get("temperature")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or not 0.0 <= temperature <= MAX_TEMPERATURE:
        raise WorkloadError(f"{where}: temperature must be a number in 0..{MAX_TEMPERATURE}")
    max_tokens = raw.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise WorkloadError(f"{where}: max_tokens must be a positive integer")
    text, messages = raw.get("text"), raw.get("messages")
    if (text is None) == (messages is None):
        raise WorkloadError(f"{where}: give exactly one of 'text' and 'messages'")
    if text is not None and (not isinstance(text, str) or not text.strip()):
        raise WorkloadError(f"{where}: text must be a non-empty string")
    if messages is not None:
        if kind != CHAT:
            raise WorkloadError(f"{where}: only chat entries have messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and set(m) == {"role", "content"} and m["role"] in ROLES
                and isinstance(m["content"], str) and m["content"].strip() for m in messages):
            raise WorkloadError(f"{where}: messages must be a non-empty list of {{role, content}} "
                                f"with role in {sorted(ROLES)} and non-empty content")
    prediction = raw.get("prediction")
    if prediction is not None and (not isinstance(prediction, str) or not prediction.strip()):
        raise WorkloadError(f"{where}: prediction must be a non-empty string")
    if kind == CHAT and text is not None:
        messages, text = [{"role": "user", "content": text}], None
    return Prompt(kind, text, tuple(messages) if messages else None, float(temperature), max_tokens, prediction)


def parse_workload(raw: Any, source: str) -> Workload:
    """Validate one workload document."""
    if not isinstance(raw, dict) or set(raw) != {"name", "description", "prompts"}:
        raise WorkloadError(f"{source}: must be an object with exactly name, description and prompts")
    name, prompts = raw["name"], raw["prompts"]
    if not isinstance(name, str) or not name or not isinstance(raw["description"], str):
        raise WorkloadError(f"{source}: name and description must be strings")
    if not isinstance(prompts, list) or len(prompts) < MIN_PROMPTS:
        raise WorkloadError(f"{source}: needs at least {MIN_PROMPTS} prompts")
    entries = tuple(_entry(p, f"{source}: prompts[{i}]") for i, p in enumerate(prompts))
    return Workload(name, raw["description"], entries)


def builtin_names() -> list[str]:
    """The workloads shipped with the package, by file name."""
    folder = resources.files("proxy") / "workloads"
    return sorted(p.name[:-len(".json")] for p in folder.iterdir() if p.name.endswith(".json"))


def load(name_or_path: str) -> Workload:
    """A shipped workload by name, or a workload file by path."""
    if name_or_path.endswith(".json"):
        path = Path(name_or_path)
        source, text = str(path), path.read_text() if path.is_file() else None
    else:
        resource = resources.files("proxy") / "workloads" / f"{name_or_path}.json"
        source, text = f"workload {name_or_path}", resource.read_text() if resource.is_file() else None
    if text is None:
        raise WorkloadError(f"{source}: not found (shipped workloads: {', '.join(builtin_names())})")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{source}: not valid JSON: {exc}") from exc
    workload = parse_workload(raw, source)
    if not name_or_path.endswith(".json") and workload.name != name_or_path:
        raise WorkloadError(f"{source}: its name is {workload.name!r}")
    return workload
