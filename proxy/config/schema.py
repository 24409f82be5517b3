"""The routes.yaml schema: frozen sections, unknown keys rejected, cross-field rules checked.

Reading the file, ${env.NAME} and the wording of errors live in proxy/config/load.py.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

Loc = tuple[Any, ...]  # mapping keys (usually str) and list indices (int)

MIB = 1024 * 1024
MAX_K = 32
DEFAULT_HOST = "127.0.0.1"  # loopback only: the proxy carries API keys, exposing it must be a choice
CROSS_FIELD_ERROR = "config"  # the pydantic error type of _problem; load.py unpacks its "at" and "message"


class _Section(BaseModel):
    """Base of every config section: immutable, unknown keys rejected, no NaN or infinity."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class ServerConfig(_Section):
    """Where the proxy listens and how much it accepts."""

    host: str = Field(default=DEFAULT_HOST, min_length=1)
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(default=8 * MIB, gt=0)
    live: bool = False  # GET /speculoos/live: shows prompts and outputs, so off unless asked for


class MatchConfig(_Section):
    """Which requests a route takes: globs on the model name and the request path."""

    model: str = Field(default="*", min_length=1)
    path: str | None = Field(default=None, min_length=1)

    def matches(self, model: str | None, path: str) -> bool:
        """True when this route takes a request for `model` on `path`."""
        # A request without a model name cannot be told apart, so only a catch-all takes it.
        model_ok = self.model == "*" if model is None else fnmatch.fnmatchcase(model, self.model)
        return model_ok and (self.path is None or fnmatch.fnmatchcase(path, self.path))


class UpstreamConfig(_Section):
    """The LLM server requests are forwarded to and drafts are verified by."""

    url: str
    protocol: Literal["sglang", "vllm", "openai"] = "sglang"
    api_key: SecretStr | None = Field(default=None, min_length=1)
    model: str | None = Field(default=None, min_length=1)

    def api_key_value(self) -> str | None:
        """The key to send as `Authorization: Bearer` when the client sends none."""
        return None if self.api_key is None else self.api_key.get_secret_value()

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        """An http(s) URL with a host and nothing after the path; trailing slashes dropped."""
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 -- raises ValueError for a port that is not a number in range
        except ValueError as exc:
            raise ValueError(f"not a valid URL ({exc})") from None
        if parts.username is not None or parts.password is not None:
            # Checked first: the messages below echo the URL and must not echo a password.
            raise ValueError("must not contain credentials; use upstream.api_key")
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"must start with http:// or https:// (got {url!r})")
        if not parts.hostname:
            raise ValueError(f"must name a host (got {url!r})")
        if "?" in url or "#" in url:
            raise ValueError(f"must not have a query or fragment (got {url!r})")
        return url.rstrip("/")


class DraftConfig(_Section):
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
    share_history: bool = True  # suffix lookup also searches the route's recent outputs
    history_tokens: int = Field(default=65536, ge=0)  # the history's bound (least recently used dropped)
    threads: int | None = Field(default=None, ge=1)
    ctx: int = Field(default=4096, ge=128)
    gpu_layers: int = Field(default=0, ge=-1)  # -1 offloads every layer
    batch: int = Field(default=512, ge=1)
    parallel: int = Field(default=4, ge=1, le=64)  # requests that draft at once, each in its own sequence

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


class SpeculationConfig(_Section):
    """How many tokens to draft per round and how strictly to accept them."""

    enabled: bool = True
    k: int = Field(default=4, ge=1, le=MAX_K)
    sampling: Literal["exact", "bounded"] = "exact"
    max_tv: float = Field(default=0.0, ge=0, le=1)
    top_logprobs: int = Field(default=20, ge=1, le=100)
    # Draft-ahead: while a round is being verified, draft the next one as if every draft is accepted.
    pipeline: bool = True

    @field_validator("max_tv")
    @classmethod
    def _zero_unless_bounded(cls, max_tv: float, info: ValidationInfo) -> float:
        """A total-variation budget contradicts exact sampling."""
        if max_tv > 0 and info.data.get("sampling") == "exact":
            raise ValueError("must be 0 with sampling: exact (use sampling: bounded to allow drift)")
        return max_tv


class TimeoutsConfig(_Section):
    """Upstream timeouts in seconds."""

    connect: float = Field(default=5.0, gt=0)
    first_byte: float = Field(default=120.0, gt=0)
    idle: float = Field(default=60.0, gt=0)  # longest silence inside a streaming body


class AssumedCostsConfig(_Section):
    """Costs in milliseconds that a route decides with instead of measuring them (to record a SIMULATION's trace)."""

    draft_ms: float = Field(ge=0)  # per drafted token
    verify_ms_flat: float = Field(default=0.0, ge=0)  # per verification, whatever its K
    verify_ms_per_token: float = Field(default=0.0, ge=0)  # per token a verification evaluates (K + 1)
    rtt_ms: float = Field(default=0.0, ge=0)  # per round trip to the target
    plain_ms: float = Field(gt=0)  # per token of plain decoding

    @model_validator(mode="after")
    def _verification_costs_time(self) -> AssumedCostsConfig:
        """A verification that costs nothing would make every K look free."""
        if self.verify_ms_flat + self.verify_ms_per_token <= 0:
            raise ValueError("verify_ms_flat or verify_ms_per_token must be > 0")
        return self


class FallbackConfig(_Section):
    """When to stop speculating, when to probe again, and the range K may move in."""

    min_acceptance: float = Field(default=0.3, ge=0, le=1)
    k_min: int = Field(default=1, ge=1)
    k_max: int = Field(default=8, ge=1, le=MAX_K)
    hysteresis: float = Field(default=0.05, ge=0, le=1)
    probe_every_requests: int = Field(default=20, ge=1)
    probe_every_seconds: float = Field(default=300.0, gt=0)
    ewma_alpha: float = Field(default=0.1, gt=0, le=1)
    # Decide as if these were the costs (acceptance is still measured): a bench records, on this
    # machine, the rounds a route would make on other hardware, for `speculoos bench --simulate`.
    assume_costs: AssumedCostsConfig | None = None

    @field_validator("k_max")
    @classmethod
    def _not_below_k_min(cls, k_max: int, info: ValidationInfo) -> int:
        """The range must not be empty."""
        k_min = info.data.get("k_min")
        if k_min is not None and k_max < k_min:
            raise ValueError(f"must be >= fallback.k_min ({k_min}) (got {k_max})")
        return k_max


class Route(_Section):
    """One routes.yaml entry: which requests, which upstream, how to speculate."""

    name: str = Field(min_length=1)
    match: MatchConfig = Field(default_factory=MatchConfig)
    upstream: UpstreamConfig
    draft: DraftConfig | None = None  # None: this route never speculates
    speculation: SpeculationConfig = Field(default_factory=SpeculationConfig)
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig)
    fallback: FallbackConfig = Field(default_factory=FallbackConfig)

    @field_validator("draft")
    @classmethod
    def _verifiable_upstream(cls, draft: DraftConfig | None, info: ValidationInfo) -> DraftConfig | None:
        """Drafts need an upstream that can score them."""
        upstream = info.data.get("upstream")
        if draft is not None and upstream is not None and upstream.protocol == "openai":
            raise ValueError("openai upstreams cannot verify drafts; remove draft or use sglang/vllm")
        return draft

    @model_validator(mode="after")
    def _k_within_fallback_range(self) -> Route:
        """The starting K must lie in the range the controller may move it in."""
        k, k_min, k_max = self.speculation.k, self.fallback.k_min, self.fallback.k_max
        if k < k_min:
            raise _problem(("speculation", "k"), f"{k} is below fallback.k_min ({k_min})")
        if k > k_max:
            raise _problem(("speculation", "k"), f"{k} is above fallback.k_max ({k_max})")
        return self

    @model_validator(mode="after")
    def _assumed_costs_are_sequential(self) -> Route:
        """Assumed costs describe sequential rounds, the model `speculoos bench --simulate` replays."""
        if self.fallback.assume_costs is not None and self.speculation.pipeline:
            raise _problem(("fallback", "assume_costs"), "needs speculation.pipeline: false")
        return self


class Config(_Section):
    """The whole file: server settings and the ordered routes."""

    server: ServerConfig = Field(default_factory=ServerConfig)
    routes: tuple[Route, ...]

    def match(self, model: str | None, path: str) -> Route | None:
        """The first route that takes this request, or None."""
        return next((route for route in self.routes if route.match.matches(model, path)), None)

    @model_validator(mode="before")
    @classmethod
    def _name_unnamed_routes(cls, data: Any) -> Any:
        """Give each route without a name its default, `route-<index>`."""
        if not isinstance(data, dict) or not isinstance(data.get("routes"), list):
            return data
        routes = [
            {"name": default_route_name(index), **route} if isinstance(route, dict) and "name" not in route else route
            for index, route in enumerate(data["routes"])
        ]
        return {**data, "routes": routes}

    @field_validator("routes")
    @classmethod
    def _non_empty_unique_names(cls, routes: tuple[Route, ...]) -> tuple[Route, ...]:
        """At least one route; names identify routes in logs and metrics, so they must be unique."""
        # Checked here, not with min_length: pydantic would also report a list whose items all
        # failed as "too short", burying the real errors.
        if not routes:
            raise ValueError("must not be empty")
        first_index: dict[str, int] = {}
        for index, route in enumerate(routes):
            if route.name in first_index:
                message = f"duplicate route name {route.name!r} (also routes[{first_index[route.name]}])"
                raise _problem((index, "name"), message)
            first_index[route.name] = index
        return routes


def _problem(at: Loc, message: str) -> PydanticCustomError:
    """A cross-field error that points below the model raising it (pydantic would point at the model)."""
    return PydanticCustomError(CROSS_FIELD_ERROR, "invalid configuration", {"at": at, "message": message})


def default_route_name(index: int) -> str:
    """The name of a route that has none."""
    return f"route-{index}"


def _looks_like_path(model: str) -> bool:
    """Registry names are bare words; anything with a slash or a .gguf suffix is a file."""
    return "/" in model or model.endswith(".gguf")
