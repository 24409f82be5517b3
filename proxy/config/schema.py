"""routes.yaml -> frozen, validated Config; every error names the file, the route and the key.

Glossary:
  source   the file name (or "<config>") that starts every error line.
  loc      where a value sits in the document, e.g. ("routes", 0, "upstream", "url").
  problem  one (loc, message) pair; a ConfigError lists one problem per line, e.g.
           routes.yaml: route 'qwen' (routes[0]): upstream.protocol: must be one of ...

Order of work: read YAML -> replace ${env.NAME} -> validate with pydantic -> reformat errors.
"""

from __future__ import annotations

import difflib
import fnmatch
import os
import re
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

Loc = tuple[Any, ...]  # mapping keys (usually str) and list indices (int)
Problem = tuple[Loc, str]

MIB = 1024 * 1024
MAX_K = 32
DEFAULT_HOST = "127.0.0.1"  # loopback only: the proxy carries API keys, exposing it must be a choice
MAX_SHOWN_INPUT = 60  # longer offending values are cut in error messages
SECRET_KEYS = ("api_key",)  # values under these keys are never echoed, even when malformed

_PLAIN_KEY = re.compile(r"[\w-]+")  # shown bare in dotted keys; anything else is quoted
# $${ -> literal ${ ; ${env.NAME} -> environment; any other ${ is a mistake worth reporting.
_REFERENCE = re.compile(r"\$\$\{|\$\{(?:env\.([A-Za-z_][A-Za-z0-9_]*)\})?")


class ConfigError(ValueError):
    """A configuration that cannot be used; the message lists one problem per line."""

    @property
    def problems(self) -> list[str]:
        """The message split into its problems."""
        return str(self).splitlines()


class _Section(BaseModel):
    """Base of every config section: immutable, unknown keys rejected, no NaN or infinity."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class ServerConfig(_Section):
    """Where the proxy listens and how much it accepts."""

    host: str = Field(default=DEFAULT_HOST, min_length=1)
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(default=8 * MIB, gt=0)


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
    # hybrid: prompt lookup when the context has a match, the model otherwise.
    kind: Literal["model", "ngram", "hybrid"] = "model"
    model: str = Field(min_length=1)
    ngram_min: int = Field(default=1, ge=1, le=16)  # shortest context tail matched by prompt lookup
    ngram_max: int = Field(default=3, ge=1, le=16)  # longest
    threads: int | None = Field(default=None, ge=1)
    ctx: int = Field(default=4096, ge=128)
    gpu_layers: int = Field(default=0, ge=-1)  # -1 offloads every layer
    batch: int = Field(default=512, ge=1)

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


class FallbackConfig(_Section):
    """When to stop speculating, when to probe again, and the range K may move in."""

    min_acceptance: float = Field(default=0.3, ge=0, le=1)
    k_min: int = Field(default=1, ge=1)
    k_max: int = Field(default=8, ge=1, le=MAX_K)
    hysteresis: float = Field(default=0.05, ge=0, le=1)
    probe_every_requests: int = Field(default=20, ge=1)
    probe_every_seconds: float = Field(default=300.0, gt=0)
    ewma_alpha: float = Field(default=0.1, gt=0, le=1)

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
            {"name": _default_name(index), **route} if isinstance(route, dict) and "name" not in route else route
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


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read, interpolate and validate a routes.yaml file."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: cannot read: {exc}") from None
    try:
        # A SafeLoader subclass: as safe as yaml.safe_load, but duplicate keys are errors.
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(f"{source}: {where}invalid YAML: {exc.problem or exc.context}") from None
    except (yaml.YAMLError, ValueError, RecursionError) as exc:  # e.g. a date like 2024-13-01
        raise ConfigError(f"{source}: invalid YAML: {exc}") from None
    return parse_config(data, source=source, base_dir=Path(path).parent)


def parse_config(
    data: Any,
    *,
    source: str = "<config>",
    environ: Mapping[str, str] | None = None,
    base_dir: str | os.PathLike[str] | None = None,
) -> Config:
    """Validate an already-parsed document; relative draft paths resolve against base_dir (default: cwd)."""
    if data is None:
        raise ConfigError(f"{source}: empty configuration; expected a mapping with a 'routes' list")
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping with a 'routes' list (got {type(data).__name__})")
    problems: list[Problem] = []
    try:
        data = _interpolate(data, os.environ if environ is None else environ, (), problems)
    except RecursionError:  # a YAML alias that contains itself
        raise ConfigError(f"{source}: configuration nests too deeply (a recursive YAML alias?)") from None
    if not problems:
        try:
            return Config.model_validate(data, context={"base_dir": base_dir})
        except ValidationError as exc:
            problems = [_describe(error) for error in exc.errors()]
    raise ConfigError("\n".join(_format(source, data, loc, message) for loc, message in problems)) from None


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice in one mapping instead of keeping the last."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """Check the mapping's own keys (merged `<<` keys may be overridden), then build it."""
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # unhashable: the base class reports it with the line
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _interpolate(value: Any, environ: Mapping[str, str], loc: Loc, problems: list[Problem]) -> Any:
    """A copy of `value` with ${env.NAME} replaced in every string; failures go to `problems`."""
    if isinstance(value, str):
        return _expand(value, environ, loc, problems)
    if isinstance(value, Mapping):
        return {key: _interpolate(item, environ, (*loc, key), problems) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_interpolate(item, environ, (*loc, index), problems) for index, item in enumerate(value)]
    return value


def _expand(text: str, environ: Mapping[str, str], loc: Loc, problems: list[Problem]) -> str:
    """One string with its references replaced; values are not scanned again."""

    def replace(found: re.Match[str]) -> str:
        name = found.group(1)
        if found.group(0) == "$${":
            return "${"
        if name is None:
            problems.append((loc, "unsupported '${' reference; write ${env.NAME}, or $${ for a literal '${'"))
        elif name not in environ:
            problems.append((loc, f"environment variable {name} is not set"))
        else:
            return environ[name]
        return found.group(0)

    return _REFERENCE.sub(replace, text)


def _problem(at: Loc, message: str) -> PydanticCustomError:
    """A cross-field error that points below the model raising it (pydantic would point at the model)."""
    return PydanticCustomError("config", "invalid configuration", {"at": at, "message": message})


def _describe(error: ErrorDetails) -> Problem:
    """One pydantic error as (loc, message) in our words, without pydantic's wording or links."""
    kind, loc, ctx = error["type"], tuple(error["loc"]), error.get("ctx", {})
    if kind == "config":
        return (*loc, *ctx["at"]), ctx["message"]
    if kind == "value_error":
        return loc, str(ctx["error"])
    if kind == "missing":
        return loc, "required"
    if kind == "extra_forbidden":
        return loc, _unknown_key(loc)
    if kind == "literal_error":
        message = "must be one of " + ", ".join(re.findall(r"'([^']*)'", ctx["expected"]))
    elif kind in ("model_type", "model_attributes_type", "dict_type"):
        message = "must be a mapping"
    elif kind in ("tuple_type", "list_type"):
        message = "must be a list"
    elif kind == "invalid_key":
        message = "keys must be strings"
    elif kind in ("too_short", "string_too_short") and ctx.get("min_length") == 1:
        message = "must not be empty"
    else:
        # "Input should be a valid integer, unable to parse ..." -> "must be a valid integer"
        message = error["msg"].replace("Input should be", "must be", 1).split(", ")[0]
    return loc, message + _got(loc, error["input"])


def _got(loc: Loc, value: Any) -> str:
    """' (got <value>)' for the message, or '' where the value is secret."""
    if any(key in SECRET_KEYS for key in loc if isinstance(key, str)):
        return ""
    if isinstance(value, Mapping | list | tuple):
        return f" (got a {'mapping' if isinstance(value, Mapping) else 'list'})"
    shown = repr(value)
    return f" (got {shown[: MAX_SHOWN_INPUT - 3] + '...' if len(shown) > MAX_SHOWN_INPUT else shown})"


def _unknown_key(loc: Loc) -> str:
    """'unknown key' plus the nearest allowed key, or the list of allowed keys."""
    allowed = _keys_at(loc[:-1])
    if not allowed:
        return "unknown key"
    near = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
    return f"unknown key (did you mean {near[0]!r}?)" if near else f"unknown key (allowed: {', '.join(allowed)})"


def _keys_at(loc: Loc) -> list[str]:
    """The keys allowed in the section at `loc`, found by walking the models' annotations."""
    model: type[BaseModel] | None = Config
    for part in loc:
        if isinstance(part, int):  # a list index: the items have the list's model
            continue
        field = model.model_fields.get(part) if model is not None else None
        model = _model_in(field.annotation) if field is not None else None
    return list(model.model_fields) if model is not None else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The section model inside an annotation such as `DraftConfig | None` or `tuple[Route, ...]`."""
    if typing.get_origin(annotation) is None and isinstance(annotation, type):
        return annotation if issubclass(annotation, BaseModel) else None
    return next((model for arg in typing.get_args(annotation) if (model := _model_in(arg))), None)


def _format(source: str, data: Any, loc: Loc, message: str) -> str:
    """'source: route 'name' (routes[i]): dotted.key: message' for one problem."""
    parts = [source]
    if len(loc) >= 2 and loc[0] == "routes" and isinstance(loc[1], int):
        parts.append(f"route {_route_name(data, loc[1])!r} (routes[{loc[1]}])")
        loc = loc[2:]
    if loc:
        parts.append(_dotted(loc))
    return ": ".join([*parts, message])


def _route_name(data: Any, index: int) -> str:
    """The name of routes[index] as written in the document, else its default."""
    routes = data.get("routes") if isinstance(data, Mapping) else None
    route = routes[index] if isinstance(routes, list) and 0 <= index < len(routes) else None
    name = route.get("name") if isinstance(route, Mapping) else None
    return name if isinstance(name, str) and name else _default_name(index)


def _dotted(loc: Loc) -> str:
    """('upstream', 'url') -> 'upstream.url'; list indices and odd keys in brackets."""
    text = ""
    for part in loc:
        if isinstance(part, str) and _PLAIN_KEY.fullmatch(part):
            text += f".{part}" if text else part
        else:  # an index, or a key with spaces or newlines that must not break the line
            text += f"[{part!r}]"
    return text


def _default_name(index: int) -> str:
    """The name of a route that has none."""
    return f"route-{index}"


def _looks_like_path(model: str) -> bool:
    """Registry names are bare words; anything with a slash or a .gguf suffix is a file."""
    return "/" in model or model.endswith(".gguf")
