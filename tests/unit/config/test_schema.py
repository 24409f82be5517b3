"""Tests for proxy.config.schema: the frozen sections, their defaults, routing and secrets."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from proxy.config.schema import (
    Config,
    DraftConfig,
    FallbackConfig,
    MatchConfig,
    Route,
    ServerConfig,
    SpeculationConfig,
    TimeoutsConfig,
    UpstreamConfig,
)
from tests.unit.config.test_load import SECRET, parse

# --- a valid file round-trips ---------------------------------------------------------------

FULL_YAML = """
server: {host: 0.0.0.0, port: 9000, max_body_bytes: 1024}
routes:
  - name: qwen
    match: {model: "qwen2.5-coder-*", path: "/v1/*"}
    upstream:
      url: https://gpu.example:8001/
      protocol: vllm
      api_key: ${env.UPSTREAM_KEY}
      model: Qwen/Qwen2.5-Coder-7B
    draft: {model: qwen2.5-coder-0.5b, threads: 2, ctx: 2048, gpu_layers: -1, batch: 64}
    speculation: {enabled: false, k: 6, sampling: bounded, max_tv: 0.05, top_logprobs: 5}
    timeouts: {connect: 1.5, first_byte: 30, idle: 10}
    fallback:
      min_acceptance: 0.5
      k_min: 2
      k_max: 12
      hysteresis: 0.1
      probe_every_requests: 5
      probe_every_seconds: 30
      ewma_weight: 1
  - upstream: {url: "http://127.0.0.1:8002", protocol: openai}
"""


def test_full_config_round_trips_to_objects() -> None:
    expected = Config(
        server=ServerConfig(host="0.0.0.0", port=9000, max_body_bytes=1024),
        routes=(
            Route(
                name="qwen",
                match=MatchConfig(model="qwen2.5-coder-*", path="/v1/*"),
                upstream=UpstreamConfig(
                    url="https://gpu.example:8001",
                    protocol="vllm",
                    api_key=SecretStr(SECRET),
                    model="Qwen/Qwen2.5-Coder-7B",
                ),
                draft=DraftConfig(model="qwen2.5-coder-0.5b", threads=2, ctx=2048, gpu_layers=-1, batch=64),
                speculation=SpeculationConfig(enabled=False, k=6, sampling="bounded", max_tv=0.05, top_logprobs=5),
                timeouts=TimeoutsConfig(connect=1.5, first_byte=30, idle=10),
                fallback=FallbackConfig(
                    min_acceptance=0.5,
                    k_min=2,
                    k_max=12,
                    hysteresis=0.1,
                    probe_every_requests=5,
                    probe_every_seconds=30,
                    ewma_weight=1,
                ),
            ),
            Route(name="route-1", upstream=UpstreamConfig(url="http://127.0.0.1:8002", protocol="openai")),
        ),
    )
    config = parse(FULL_YAML, {"UPSTREAM_KEY": SECRET})
    assert config == expected
    assert config.routes[0].upstream.api_key_value() == SECRET
    assert config.routes[1].upstream.api_key_value() is None


def test_defaults_fill_in() -> None:
    config = parse("routes: [{upstream: {url: 'http://h'}}]")
    route = config.routes[0]
    assert config.server == ServerConfig(host="127.0.0.1", port=8080, max_body_bytes=8 * 1024 * 1024)
    assert route.name == "route-0"
    assert route.match == MatchConfig(model="*", path=None)
    assert route.upstream == UpstreamConfig(url="http://h", protocol="sglang", api_key=None, model=None)
    assert route.draft is None
    assert route.speculation == SpeculationConfig(enabled=True, k=4, sampling="exact", max_tv=0.0, top_logprobs=20)
    assert route.timeouts == TimeoutsConfig(connect=5, first_byte=120, idle=60)
    assert route.fallback == FallbackConfig(
        min_acceptance=0.3,
        k_min=1,
        k_max=8,
        hysteresis=0.05,
        probe_every_requests=20,
        probe_every_seconds=300,
        ewma_weight=0.1,
    )
    assert parse("routes: [{upstream: {url: 'http://h'}, draft: {model: m}}]").routes[0].draft == DraftConfig(
        model="m", threads=None, ctx=4096, gpu_layers=0, batch=512
    )


def test_config_is_frozen() -> None:
    route = parse("routes: [{upstream: {url: 'http://h'}}]").routes[0]
    with pytest.raises(ValidationError):
        route.name = "other"


@pytest.mark.parametrize(
    ("url", "stored"),
    [
        ("http://h", "http://h"),
        ("http://h:8001/", "http://h:8001"),
        ("https://h/prefix/v1//", "https://h/prefix/v1"),
        ("http://[::1]:8001", "http://[::1]:8001"),
    ],
)
def test_upstream_url_is_normalised(url: str, stored: str) -> None:
    assert parse(f"routes: [{{upstream: {{url: '{url}'}}}}]").routes[0].upstream.url == stored


# --- routing ---------------------------------------------------------------------------------

ROUTING_YAML = """
routes:
  - {name: exact, match: {model: qwen}, upstream: {url: 'http://a'}}
  - {name: shadowed, match: {model: "qw*"}, upstream: {url: 'http://b'}}
  - {name: llama-chat, match: {model: "llama-*", path: "/v1/chat/*"}, upstream: {url: 'http://c'}}
  - {name: llama-any, match: {model: "llama-?"}, upstream: {url: 'http://d'}}
  - {name: catch-all, upstream: {url: 'http://e'}}
"""


@pytest.mark.parametrize(
    ("model", "path", "route_name"),
    [
        ("qwen", "/v1/chat/completions", "exact"),  # first match wins over the later glob
        ("qwen2", "/v1/completions", "shadowed"),
        ("QWEN", "/v1/completions", "catch-all"),  # globs are case-sensitive
        ("llama-3", "/v1/chat/completions", "llama-chat"),
        ("llama-3", "/v1/completions", "llama-any"),
        ("llama-33", "/v1/completions", "catch-all"),  # ? is exactly one character
        ("mistral", "/v1/completions", "catch-all"),
        (None, "/v1/models", "catch-all"),  # no model: only a "*" route takes it
    ],
)
def test_match_first_route_wins(model: str | None, path: str, route_name: str) -> None:
    route = parse(ROUTING_YAML).match(model, path)
    assert route is not None and route.name == route_name


@pytest.mark.parametrize(
    ("model", "path"),
    [("mistral", "/v1/chat/completions"), (None, "/v1/chat/completions"), ("llama-3", "/health")],
)
def test_match_none_without_catch_all(model: str | None, path: str) -> None:
    config = parse("routes: [{match: {model: 'llama-*', path: '/v1/*'}, upstream: {url: 'http://h'}}]")
    assert config.match(model, path) is None


# --- secrets ---------------------------------------------------------------------------------


def test_api_key_never_shown() -> None:
    config = parse(FULL_YAML, {"UPSTREAM_KEY": SECRET})
    route = config.routes[0]
    for text in (repr(route), str(route), repr(config), str(config), repr(route.upstream), str(route.upstream)):
        assert SECRET not in text
    assert route.upstream.api_key_value() == SECRET


# --- draft model: registry name or file -------------------------------------------------------


@pytest.mark.parametrize(("model", "is_path"), [("qwen2.5-coder-0.5b", False), ("org/name", True), ("x.gguf", True)])
def test_draft_model_registry_name_or_path(tmp_path: Path, model: str, is_path: bool) -> None:
    if is_path:
        (tmp_path / model).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / model).write_bytes(b"GGUF")
    text = f"routes: [{{upstream: {{url: 'http://h'}}, draft: {{model: '{model}'}}}}]"
    draft = parse(text, base_dir=tmp_path).routes[0].draft
    assert draft is not None
    assert (draft.path is not None) == is_path
    assert draft.model == (str(tmp_path / model) if is_path else model)


# --- browsers, history scope, the upstream pool ------------------------------------------------


@pytest.mark.parametrize(("value", "stored"), [
    (None, "key"),  # the default: one history per API key
    (True, "key"),  # earlier configs' true
    (False, "none"),
    ("route", "route"),
    ("none", "none"),
])
def test_share_history_scopes(value: bool | str | None, stored: str) -> None:
    draft = {"model": "m"} if value is None else {"model": "m", "share_history": value}
    assert DraftConfig(**draft).share_history == stored


@pytest.mark.parametrize(("server", "stored"), [
    ({"allowed_origins": ["https://App.example:443/", "http://localhost:3000", "null", "*"]},
     ("https://app.example", "http://localhost:3000", "null", "*")),
    ({"allowed_hosts": ["Proxy.LAN", "[::1]", "*"]}, ("proxy.lan", "::1", "*")),
])
def test_browser_allowlists_are_normalised(server: dict, stored: tuple[str, ...]) -> None:
    config = ServerConfig(**server)
    assert (config.allowed_origins or config.allowed_hosts) == stored


@pytest.mark.parametrize("server", [
    {"allowed_origins": ["app.example"]},  # no scheme
    {"allowed_origins": ["ftp://app.example"]},
    {"allowed_origins": ["https://app.example/path"]},
    {"allowed_hosts": ["proxy.lan:8080"]},  # a port
    {"allowed_hosts": ["http://proxy.lan"]},
])
def test_bad_browser_allowlists_are_refused(server: dict) -> None:
    with pytest.raises(ValidationError):
        ServerConfig(**server)


def test_the_upstream_pool_and_its_wait_are_configured_per_route() -> None:
    assert (UpstreamConfig(url="http://h").connections, TimeoutsConfig().pool) == (100, 30.0)
    with pytest.raises(ValidationError):
        UpstreamConfig(url="http://h", connections=0)
