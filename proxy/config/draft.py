"""The draft section: what proposes tokens (a GGUF model, prompt or suffix lookup, or both) and how it runs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from proxy.config.section import MAX_K, Section


class DraftConfig(Section):
    """The local GGUF draft model; `model` is a registry name or a .gguf path."""

    # model: the GGUF drafts; ngram: prompt lookup only (the GGUF serves as the tokenizer);
    # suffix: suffix lookup over the request and the route's recent outputs (no model runs);
    # hybrid: suffix lookup when its path is worth verifying, the model otherwise.
    kind: Literal["model", "ngram", "suffix", "hybrid"] = "model"
    model: str = Field(min_length=1)
    ngram_min: int = Field(default=1, ge=1, le=16)  # shortest context tail matched by prompt lookup
    ngram_max: int = Field(default=3, ge=1, le=16)  # longest
    k_max: int = Field(default=MAX_K, ge=1, le=MAX_K)  # longest suffix-lookup draft in one round
    min_token_prob: float = Field(default=0.1, gt=0, le=1)  # a lookup path stops below this estimated probability
    match_factor: float = Field(default=1.0, gt=0)  # a lookup path is at most this × its match length
    candidates: int = Field(default=1, ge=1, le=8)  # lookup paths verified per round (branches of the best)
    # Suffix lookup also searches recent outputs: "key" those of requests with the same API key (a digest of
    # the client's Authorization; requests without one share a scope), "route" every request's on the route,
    # "none" (or false) none. true means "key": one client's outputs never draft for another unless asked.
    share_history: Literal["key", "route", "none"] = "key"
    history_tokens: int = Field(default=65536, ge=0)  # the history's bound (least recently used dropped)
    threads: int | None = Field(default=None, ge=1)  # None: every core
    # Whether the draft runs on the cores of its target (auto: the upstream's host is this machine); then
    # the two take turns on them, each computing with its threads while the other waits.
    shares_cores: Literal["auto", True, False] = "auto"
    ctx: int = Field(default=4096, ge=128)
    gpu_layers: int = Field(default=0, ge=-1)  # -1 offloads every layer
    batch: int = Field(default=512, ge=1)
    parallel: int = Field(default=4, ge=1, le=64)  # requests that draft at once, each in its own sequence

    @field_validator("share_history", mode="before")
    @classmethod
    def _history_scope(cls, value: Any) -> Any:
        """The booleans of earlier configs: true is the per-key scope, false none."""
        if isinstance(value, bool):
            return "key" if value else "none"
        return value

    @field_validator("shares_cores", mode="before")
    @classmethod
    def _auto_or_boolean(cls, value: Any) -> Any:
        """One message for every wrong value (the literal's own would name only `auto`)."""
        if not (value == "auto" or isinstance(value, bool)):
            raise ValueError(f"must be auto, true or false (got {value!r})")
        return value

    @field_validator("ngram_max")
    @classmethod
    def _ngram_range(cls, ngram_max: int, info: ValidationInfo) -> int:
        """The longest n-gram cannot be shorter than the shortest."""
        ngram_min = info.data.get("ngram_min", 1)
        if ngram_max < ngram_min:
            raise ValueError(f"must be >= ngram_min ({ngram_min})")
        return ngram_max

    @property
    def path(self) -> Path | None:
        """The .gguf file to load, or None when `model` is a registry name."""
        return Path(self.model) if _looks_like_path(self.model) else None

    @field_validator("model")
    @classmethod
    def _existing_file_if_path(cls, model: str, info: ValidationInfo) -> str:
        """A path must name an existing file; it is made absolute against the config's folder."""
        if not _looks_like_path(model):
            return model
        base_dir = (info.context or {}).get("base_dir") or Path.cwd()
        path = Path(base_dir, os.path.expanduser(model)).absolute()
        try:
            found = path.is_file()
        except (OSError, ValueError):  # a name too long for the OS, or with a NUL byte
            found = False
        if not found:
            raise ValueError(f"file not found: {path}")
        return str(path)


def _looks_like_path(model: str) -> bool:
    """Registry names are bare words; anything with a slash or a .gguf suffix is a file."""
    return "/" in model or model.endswith(".gguf")
