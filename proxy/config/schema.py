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
    """Where the proxy listens, how much it accepts, and which browser pages may call it.

    Any page open in a browser on this machine can send requests to a loopback port, spending the
    routes' keys (CSRF) or, by rebinding its own name to our address, reading the answers. So every
    path but the live page (which has a stricter rule of its own) answers only when:
    - the Host header names a loopback address (localhost, 127.0.0.1, [::1]; any port), the address
      `host` names, or one of `allowed_hosts`. Bound to 0.0.0.0 or :: the proxy serves a network on
      purpose, under names it cannot know: any Host is accepted there until `allowed_hosts` lists the
      names its clients use (IP addresses are then accepted too: a rebinding page always uses a name);
    - the Origin header is absent (not a browser), the proxy's own origin, or one of
      `allowed_origins` (`scheme://host[:port]`; "null" for sandboxed pages and files; "*" for any).
      A listed origin also gets CORS answers, preflights included.
    Anything else is a 403 with an OpenAI error body.
    """

    host: str = Field(default=DEFAULT_HOST, min_length=1)
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(default=8 * MIB, gt=0)
    live: bool = False  # GET /speculoos/live: shows prompts and outputs, so off unless asked for
    allowed_hosts: tuple[str, ...] = ()  # Host names (no port) accepted besides loopback and `host`; "*": any
    allowed_origins: tuple[str, ...] = ()  # browser origins that may call the API

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        """Bare names or addresses, compared case-insensitively."""
        for name in names:
            if not name or any(c in name for c in "/@ \t") or (":" in name and not name.startswith("[")):
                raise ValueError(f"must be host names without scheme or port, like proxy.lan or [::1] (got {name!r})")
        return tuple(name.lower().strip("[]") for name in names)

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, origins: tuple[str, ...]) -> tuple[str, ...]:
        """Origins as browsers send them: scheme, host and port only."""
        normal = []
        for origin in origins:
            key = origin if origin in ("*", "null") else normal_origin(origin)
            if key is None:
                raise ValueError(f"must be scheme://host[:port], null or * (got {origin!r})")
            normal.append(key)
        return tuple(normal)


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
    # Connections open to it at once (a stream holds one to its end); requests beyond wait up to timeouts.pool.
    connections: int = Field(default=100, ge=1)

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
    pool: float = Field(default=30.0, gt=0)  # longest wait for a free connection when upstream.connections are busy


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
    # Time a few plain steps, verifications and draft steps at start-up, so the first request is decided
    # from measured costs instead of paying to learn them.
    calibrate: bool = True
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


def normal_origin(origin: str) -> str | None:
    """An http(s) origin as `scheme://host[:port]`, lower case, the scheme's default port left out; None if not one."""
    try:
        parts = urlsplit(origin.strip().rstrip("/"))
        port = parts.port
    except ValueError:
        return None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname or parts.path or parts.query \
            or parts.fragment or parts.username is not None:
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    default = 80 if parts.scheme.lower() == "http" else 443
    return f"{parts.scheme.lower()}://{host}" + (f":{port}" if port not in (None, default) else "")


def _looks_like_path(model: str) -> bool:
    """Registry names are bare words; anything with a slash or a .gguf suffix is a file."""
    return "/" in model or model.endswith(".gguf")
