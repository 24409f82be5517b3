"""Tests for proxy.config.load: a routes.yaml document -> Config, and errors that name the route and the key."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.config.load import ConfigError, parse_config
from proxy.config.schema import (
    Config,
    DraftConfig,
    FallbackConfig,
    MatchConfig,
    Route,
    SpeculationConfig,
    TimeoutsConfig,
    UpstreamConfig,
)

SECRET = "sk-test-5ecret-value"
UNSET = "SPECULOOS_TEST_SURELY_UNSET"


def parse(text: str, environ: dict[str, str] | None = None, **kwargs: Any) -> Config:
    """parse_config on a YAML string, as if it came from routes.yaml."""
    return parse_config(yaml.safe_load(text), source="routes.yaml", environ=environ or {}, **kwargs)


def error_of(text: str, environ: dict[str, str] | None = None) -> str:
    """The ConfigError message for a YAML string that must not validate."""
    with pytest.raises(ConfigError) as caught:
        parse(text, environ)
    return str(caught.value)


# --- bad input -> one clear message ----------------------------------------------------------

Q = "route 'qwen' (routes[0])"


def qwen(fields: str = "", upstream: str = "url: 'http://h'", top: str = "") -> str:
    """A one-route document: route 'qwen' plus `fields`, its upstream, and top-level `top`."""
    extra = f", {fields}" if fields else ""
    return f"routes: [{{name: qwen, upstream: {{{upstream}}}{extra}}}]\n{top}"


BAD = [
    # unknown keys
    (qwen(top="bogus: 1"), "routes.yaml: bogus: unknown key (allowed: server, routes)"),
    (qwen(top="server: {hots: x}"), "routes.yaml: server.hots: unknown key (did you mean 'host'?)"),
    (qwen("speculate: {k: 2}"), f"{Q}: speculate: unknown key (did you mean 'speculation'?)"),
    (qwen(upstream="url: 'http://h', protocl: vllm"), f"{Q}: upstream.protocl: unknown key (did you mean 'protocol'?)"),
    (
        qwen("draft: {model: m, zz: 1}"),
        f"{Q}: draft.zz: unknown key (allowed: kind, model, ngram_min, ngram_max, k_max, min_token_prob, match_factor, "
        "candidates, share_history, history_tokens, threads, shares_cores, ctx, gpu_layers, batch, "
        "parallel)",
    ),
    (qwen("draft: {model: m, kind: lookup}"), f"{Q}: draft.kind: must be one of model, ngram, suffix, hybrid"),
    (qwen("draft: {model: m, ngram_min: 4, ngram_max: 2}"), f"{Q}: draft.ngram_max: must be >= ngram_min (4)"),
    # wrong types
    (qwen("speculation: {k: four}"), f"{Q}: speculation.k: must be a valid integer (got 'four')"),
    (qwen("speculation: {k: 2.5}"), f"{Q}: speculation.k: must be a valid integer (got 2.5)"),
    (qwen("speculation: {enabled: maybe}"), f"{Q}: speculation.enabled: must be a valid boolean (got 'maybe')"),
    (qwen("timeouts: {idle: soon}"), f"{Q}: timeouts.idle: must be a valid number (got 'soon')"),
    (qwen("match: [qwen]"), f"{Q}: match: must be a mapping (got a list)"),
    (qwen(upstream="url: 8001"), f"{Q}: upstream.url: must be a valid string (got 8001)"),
    ("routes: [{name: qwen, upstream: 'http://h'}]", f"{Q}: upstream: must be a mapping (got 'http://h')"),
    ("routes: [{name: [q], upstream: {url: 'http://h'}}]", "route 'route-0' (routes[0]): name: must be a valid string"),
    ("routes: [42]", "route 'route-0' (routes[0]): must be a mapping (got 42)"),
    ("routes: {name: qwen}", "routes.yaml: routes: must be a list (got a mapping)"),
    # out of range
    (qwen(top="server: {port: 70000}"), "routes.yaml: server.port: must be less than or equal to 65535 (got 70000)"),
    (qwen(top="server: {max_body_bytes: 0}"), "routes.yaml: server.max_body_bytes: must be greater than 0 (got 0)"),
    (qwen("speculation: {k: 0}"), f"{Q}: speculation.k: must be greater than or equal to 1 (got 0)"),
    (qwen("speculation: {k: 33}"), f"{Q}: speculation.k: must be less than or equal to 32 (got 33)"),
    (qwen("speculation: {top_logprobs: 101}"), f"{Q}: speculation.top_logprobs: must be less than or equal to 100"),
    (qwen("draft: {model: m, ctx: 64}"), f"{Q}: draft.ctx: must be greater than or equal to 128 (got 64)"),
    (qwen("draft: {model: m, threads: 0}"), f"{Q}: draft.threads: must be greater than or equal to 1 (got 0)"),
    (qwen("draft: {model: m, gpu_layers: -2}"), f"{Q}: draft.gpu_layers: must be greater than or equal to -1"),
    (qwen("draft: {model: ''}"), f"{Q}: draft.model: must not be empty"),
    (
        qwen("fallback: {min_acceptance: 1.5}"),
        f"{Q}: fallback.min_acceptance: must be less than or equal to 1 (got 1.5)",
    ),
    (qwen("fallback: {ewma_weight: 0}"), f"{Q}: fallback.ewma_weight: must be greater than 0 (got 0)"),
    (qwen("fallback: {ewma_weight: .nan}"), f"{Q}: fallback.ewma_weight: must be a finite number"),
    (qwen("timeouts: {connect: 0}"), f"{Q}: timeouts.connect: must be greater than 0 (got 0)"),
    (qwen("timeouts: {idle: -1}"), f"{Q}: timeouts.idle: must be greater than 0 (got -1)"),
    (qwen("timeouts: {first_byte: .inf}"), f"{Q}: timeouts.first_byte: must be a finite number"),
    # upstream
    (
        qwen(upstream="url: 'http://h', protocol: sglan"),
        f"{Q}: upstream.protocol: must be one of sglang, vllm, openai (got 'sglan')",
    ),
    (qwen(upstream="url: '127.0.0.1:8001'"), f"{Q}: upstream.url: must start with http:// or https://"),
    (qwen(upstream="url: 'ftp://h'"), f"{Q}: upstream.url: must start with http:// or https:// (got 'ftp://h')"),
    (qwen(upstream="url: 'http://'"), f"{Q}: upstream.url: must name a host"),
    (qwen(upstream="url: 'http://:80/v1'"), f"{Q}: upstream.url: must name a host"),
    (qwen(upstream="url: 'http://h/v1?x=1'"), f"{Q}: upstream.url: must not have a query or fragment"),
    (qwen(upstream="url: 'http://h:99999'"), f"{Q}: upstream.url: not a valid URL"),
    (qwen(upstream="protocol: vllm"), f"{Q}: upstream.url: required"),
    (qwen(upstream="url: 'http://h/team-a/../admin'"), f"{Q}: upstream.url: must not have '.' or '..' path segments"),
    (qwen(upstream="url: 'http://h/team-a/%2e%2e'"), f"{Q}: upstream.url: must not have '.' or '..' path segments"),
    # passthrough
    (qwen("passthrough: {path: ['/x']}"), f"{Q}: passthrough.path: unknown key (did you mean 'paths'?)"),
    (qwen("passthrough: {paths: [metrics]}"), f"{Q}: passthrough.paths: must be absolute paths without query or"),
    (qwen("passthrough: {paths: ['/a/../b']}"), f"{Q}: passthrough.paths: must be absolute paths without query or"),
    (qwen("passthrough: {paths: ['/a?b=1']}"), f"{Q}: passthrough.paths: must be absolute paths without query or"),
    (qwen("passthrough: {paths: ['/speculoos/live']}"), f"{Q}: passthrough.paths: /speculoos/* are the proxy's own"),
    (qwen("passthrough: {paths: '/x'}"), f"{Q}: passthrough.paths: must be a list (got '/x')"),
    ("routes: [{name: qwen}]", f"{Q}: upstream: required"),
    # cross-field rules
    (qwen("speculation: {k: 2}, fallback: {k_min: 3}"), f"{Q}: speculation.k: 2 is below fallback.k_min (3)"),
    (qwen("speculation: {k: 9}"), f"{Q}: speculation.k: 9 is above fallback.k_max (8)"),
    (qwen("fallback: {k_min: 5, k_max: 3}"), f"{Q}: fallback.k_max: must be >= fallback.k_min (5)"),
    (qwen("speculation: {max_tv: 0.1}"), f"{Q}: speculation.max_tv: must be 0 with sampling: exact"),
    (
        qwen("fallback: {assume_costs: {draft_ms: 4, plain_ms: 25}}, speculation: {pipeline: false}"),
        f"{Q}: fallback.assume_costs: verify_ms_flat or verify_ms_per_token must be > 0",
    ),
    (
        qwen("fallback: {assume_costs: {draft_ms: 4, verify_ms_flat: 25, plain_ms: 25}}"),
        f"{Q}: fallback.assume_costs: needs speculation.pipeline: false",
    ),
    (
        qwen("draft: {model: m}", upstream="url: 'http://h', protocol: openai"),
        f"{Q}: draft: openai upstreams cannot verify drafts; remove draft or use sglang/vllm",
    ),
    (qwen("draft: {model: /nonexistent/draft.gguf}"), f"{Q}: draft.model: file not found: /nonexistent/draft.gguf"),
    (qwen("draft: {model: no-such-dir/draft}"), f"{Q}: draft.model: file not found: "),
    (
        "routes: [{name: qwen, upstream: {url: 'http://h'}}, {name: qwen, upstream: {url: 'http://h'}}]",
        "route 'qwen' (routes[1]): name: duplicate route name 'qwen' (also routes[0])",
    ),
    (
        "routes: [{name: route-1, upstream: {url: 'http://h'}}, {upstream: {url: 'http://h'}}]",
        "route 'route-1' (routes[1]): name: duplicate route name 'route-1' (also routes[0])",
    ),
    # the document as a whole
    ("routes: []", "routes.yaml: routes: must not be empty"),
    ("server: {port: 1}", "routes.yaml: routes: required"),
    ("[1, 2]", "routes.yaml: expected a mapping with a 'routes' list (got list)"),
    ("", "routes.yaml: empty configuration"),
    # environment
    (
        qwen(upstream=f"url: 'http://h', api_key: '${{env.{UNSET}}}'"),
        f"{Q}: upstream.api_key: environment variable {UNSET} is not set",
    ),
    (
        qwen(upstream="url: 'http://${env.HOST}:${env.PORT}'"),
        f"{Q}: upstream.url: environment variable PORT is not set",
    ),
    (qwen(upstream="url: 'http://h', model: 'a-${HOME}'"), f"{Q}: upstream.model: unsupported '${{' reference"),
]


@pytest.mark.parametrize(("text", "expected"), BAD)
def test_bad_config_names_route_and_key(text: str, expected: str) -> None:
    message = error_of(text, {"HOST": "h"})
    assert expected in message
    assert message.startswith("routes.yaml: ")
    for pydantic_wording in ("Input should", "errors.pydantic.dev", "validation error", "Value error"):
        assert pydantic_wording not in message


def test_every_problem_is_listed_one_per_line() -> None:
    message = error_of(
        "routes:\n"
        "  - {name: qwen, upstream: {url: 'ftp://h', protocol: sglan}}\n"
        "  - {upstream: {url: 'http://h'}, speculation: {k: 0}}\n"
    )
    assert message.splitlines() == [
        "routes.yaml: route 'qwen' (routes[0]): upstream.url: must start with http:// or https:// (got 'ftp://h')",
        "routes.yaml: route 'qwen' (routes[0]): upstream.protocol: must be one of sglang, vllm, openai (got 'sglan')",
        "routes.yaml: route 'route-1' (routes[1]): speculation.k: must be greater than or equal to 1 (got 0)",
    ]


# --- environment interpolation ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "environ", "value"),
    [
        ("${env.NAME}", {"NAME": "qwen-7b"}, "qwen-7b"),
        ("org/${env.NAME}-${env.SIZE}", {"NAME": "qwen", "SIZE": "7b"}, "org/qwen-7b"),
        ("$${env.NAME}", {}, "${env.NAME}"),  # escaped: kept literally, not looked up
        ("a$${b}c", {}, "a${b}c"),
        ("${env.NAME}", {"NAME": "${env.OTHER}"}, "${env.OTHER}"),  # values are not expanded again
        ("costs $5", {}, "costs $5"),  # a lone $ is not a reference
    ],
)
def test_env_interpolation(written: str, environ: dict[str, str], value: str) -> None:
    config = parse(f"routes: [{{upstream: {{url: 'http://h', model: '{written}'}}}}]", environ)
    assert config.routes[0].upstream.model == value


def test_env_interpolation_happens_before_validation() -> None:
    config = parse("server: {port: '${env.PORT}'}\nroutes: [{upstream: {url: 'http://h'}}]", {"PORT": "9001"})
    assert config.server.port == 9001


def test_env_defaults_to_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECULOOS_TEST_MODEL", "from-env")
    data = yaml.safe_load("routes: [{upstream: {url: 'http://h', model: '${env.SPECULOOS_TEST_MODEL}'}}]")
    assert parse_config(data).routes[0].upstream.model == "from-env"


# --- secrets ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "upstream",
    [
        f"{{url: 'ftp://h', protocol: sglan, api_key: {SECRET}}}",  # other errors next to the key
        "{url: 'http://h', api_key: 123456789}",  # the key itself malformed
        "{url: 'http://h', api_key: [123456789]}",
        f"{{url: 'http://h', apikey: {SECRET}}}",  # the key under a misspelt name
        f"{{url: 'http://me:{SECRET}@h'}}",  # a password in the URL
        f"{{url: 'ftp://me:{SECRET}@h'}}",
    ],
)
def test_api_key_not_in_error_messages(upstream: str) -> None:
    message = error_of(f"routes: [{{name: qwen, upstream: {upstream}}}]")
    assert SECRET not in message and "123456789" not in message
    assert "routes.yaml: route 'qwen' (routes[0]): upstream." in message


@pytest.mark.parametrize(
    "upstream",
    [
        "{url: 'ftp://gw/team/${env.TOKEN}/v1'}",  # the URL's own error echoes the URL
        "{url: 'http://gw/${env.TOKEN}?x=1'}",
        "{url: 'http://gw/${env.TOKEN}/../admin'}",
        "{url: 'http://gw/${env.TOKEN}', protocol: '${env.TOKEN}'}",  # the same value in another key's error
    ],
)
def test_an_interpolated_value_is_shown_as_its_reference_in_errors(upstream: str) -> None:
    message = error_of(f"routes: [{{name: qwen, upstream: {upstream}}}]", {"TOKEN": SECRET})
    assert SECRET not in message
    assert "${env.TOKEN}" in message and "route 'qwen' (routes[0]): upstream." in message


# --- fuzz ------------------------------------------------------------------------------------

SCHEMA_KEYS = sorted(
    {"server", "routes", "host", "port", "max_body_bytes"}
    | set(Route.model_fields)
    | set(MatchConfig.model_fields)
    | set(UpstreamConfig.model_fields)
    | set(DraftConfig.model_fields)
    | set(SpeculationConfig.model_fields)
    | set(TimeoutsConfig.model_fields)
    | set(FallbackConfig.model_fields)
)
INTERESTING_STRINGS = [
    "*",
    "http://h",
    "https://h:1/",
    "ftp://h",
    "http://",
    "sglang",
    "vllm",
    "openai",
    "exact",
    "bounded",
    "${env.SET}",
    "${env.UNSET}",
    "$${",
    "${x}",
    "m.gguf",
    "/no/such.gguf",
    "a\x00/b",
    "x" * 300 + "/y",
]
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(INTERESTING_STRINGS)
)
keys = st.sampled_from(SCHEMA_KEYS) | st.text(max_size=6) | st.integers(-2, 2) | st.none() | st.booleans()
yamlish = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=6),
    max_leaves=30,
)
route_like = st.fixed_dictionaries(
    {
        "upstream": st.fixed_dictionaries(
            {"url": st.sampled_from(["http://h", "https://h/", "nope"])},
            optional={"protocol": yamlish, "api_key": yamlish, "model": yamlish},
        )
    },
    optional={key: yamlish for key in ("name", "match", "draft", "speculation", "timeouts", "fallback")},
)
config_like = st.fixed_dictionaries(
    {"routes": st.lists(route_like | yamlish, max_size=3)}, optional={"server": yamlish}
)


@settings(max_examples=400, deadline=None)
@given(data=yamlish | config_like)
def test_arbitrary_documents_parse_or_raise_config_error(data: Any) -> None:
    try:
        config = parse_config(data, environ={"SET": "value"})
    except ConfigError as exc:
        message = str(exc)
        assert message and "Input should" not in message and "errors.pydantic.dev" not in message
    else:
        assert isinstance(config, Config) and config.routes


def test_the_moving_averages_weight_reads_under_its_former_name_too() -> None:
    for key in ("ewma_weight", "ewma_alpha"):
        assert parse(qwen(f"fallback: {{{key}: 0.25}}")).routes[0].fallback.ewma_weight == 0.25
