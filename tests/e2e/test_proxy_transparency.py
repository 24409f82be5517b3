"""What the proxy passes on, end to end: keys (never logged), headers, model names, info paths (and no other),
/v1/models."""

# The `faults` proxy (conftest.py) has one route per situation, picked by the request's model name: `keyed` and
# `keyed-spec` send a route key upstream, `gemma` drafts with another vocabulary than its SmolLM2 verifier's,
# `public-name` renames the model upstream; most relay through the faulty upstream (`fake`, see
# tests.fakes.faulty_upstream), which records every request it gets. Info paths, and /v1/models through a
# catch-all route, are checked against the session's plain `smol_proxy`.

from __future__ import annotations

import json
from typing import Any

import pytest

from tests import support as http
from tests.e2e.proxy_harness import (
    CHAT_PATH,
    CLIENT_KEY,
    MESSAGES,
    MODE_HEADER,
    PASS,
    ROUTE_KEY,
    SPECULATE,
    assert_openai_error,
    assert_served,
    chat_body,
    log_events,
    sdk,
)
from tests.e2e.servers import Process
from tests.fakes.faulty_upstream import GENERATE_PATH, RETRY_AFTER, UPSTREAM_HEADER, FakeUpstream

# -- secrets ----------------------------------------------------------------------------------------


def logged_so_far(faults: Process) -> str:
    """The proxy's log once every request sent so far has its line: a last request's line, written after its
    answer, is waited for (the requests before it finished first)."""
    before = len(log_events(faults, is_request))
    http.post_json(faults.url + CHAT_PATH, chat_body("smol"), timeout=60)
    log_events(faults, is_request, at_least=before + 1)
    return faults.log()


def is_request(event: dict[str, Any]) -> bool:
    """A generation request's log line."""
    return event.get("event") == "request"


def test_client_key_is_forwarded_but_never_logged(faults: Process, fake: FakeUpstream) -> None:
    auth = {"Authorization": f"Bearer {CLIENT_KEY}", **SPECULATE}
    for model, fields in [("smol", {}), ("smol", {"temperature": 0.7}), ("down", {}), ("notjson", {}),
                          ("keyed", {}), ("keyed-spec", {}), ("gpt-4o", {})]:
        http.post_json(faults.url + CHAT_PATH, chat_body(model, **fields), headers=auth, timeout=60)
    http.post_json(faults.url + CHAT_PATH, chat_body("smol", max_tokens="x"), headers=auth, timeout=60)
    http.request("POST", faults.url + CHAT_PATH, b"{", {**auth, "Content-Type": "application/json"}, timeout=60)
    # The client's key reached the upstream, replacing the route's.
    assert [s.authorization for s in fake.seen("keyed", CHAT_PATH)][-1:] == [[f"Bearer {CLIENT_KEY}"]]
    log = logged_so_far(faults)
    assert "request" in log  # the proxy did log these requests
    assert CLIENT_KEY not in log


def test_route_key_is_sent_but_never_logged(faults: Process, fake: FakeUpstream) -> None:
    count = len(fake.seen("keyed-spec", GENERATE_PATH))
    reply = http.post_json(faults.url + CHAT_PATH, chat_body("keyed"), timeout=60)
    assert_served(reply, "passthrough")
    assert fake.seen("keyed")[-1].authorization == [f"Bearer {ROUTE_KEY}"]
    reply = http.post_json(faults.url + CHAT_PATH, chat_body("keyed-spec"), headers=SPECULATE, timeout=60)
    assert_served(reply, "speculative")
    assert {tuple(s.authorization) for s in fake.seen("keyed-spec", GENERATE_PATH)[count:]} == {
        (f"Bearer {ROUTE_KEY}",)}
    assert_openai_error(http.post_json(faults.url + CHAT_PATH, chat_body("keyed-down"), timeout=30), 502)
    assert ROUTE_KEY not in logged_so_far(faults)
    assert ROUTE_KEY not in reply.body.decode()


@pytest.mark.parametrize("header", ["authorization", "AUTHORIZATION"])
@pytest.mark.parametrize("model", ["keyed", "keyed-spec"], ids=["passthrough", "speculative"])
@pytest.mark.parametrize("proxy_name", ["faults", "pure_python_proxy"], ids=["c-parser", "pure-python-parser"])
def test_client_key_in_any_header_case_replaces_the_route_key_where_the_route_forwards_it(
        request: pytest.FixtureRequest, fake: FakeUpstream, proxy_name: str, header: str, model: str) -> None:
    """HTTP header names are case-insensitive (RFC 9110 §5.1); HTTP/2 and Node clients send them lowercase."""
    proxy: Process = request.getfixturevalue(proxy_name)
    count = len(fake.seen(model))
    headers = {header: f"Bearer {CLIENT_KEY}", **SPECULATE}
    reply = http.post_json(proxy.url + CHAT_PATH, chat_body(model), headers=headers, timeout=60)
    assert reply.status == 200, reply.body[:300]
    upstream_calls = [s for s in fake.seen(model)[count:] if s.path in (CHAT_PATH, "/tokenize", GENERATE_PATH)]
    assert upstream_calls
    for call in upstream_calls:
        assert call.authorization == [f"Bearer {CLIENT_KEY}"], call.path


@pytest.mark.parametrize("header", ["Authorization", "api-key", "x-api-key"])
@pytest.mark.parametrize("model", ["route-key", "route-key-spec"], ids=["passthrough", "speculative"])
def test_a_clients_placeholder_key_never_replaces_the_routes(faults: Process, fake: FakeUpstream, header: str,
                                                             model: str) -> None:
    """Clients that must send some key send "sk-dummy" or "EMPTY": the route's own key goes upstream instead."""
    mode = "keyed-spec" if model.endswith("spec") else "keyed"
    count = len(fake.seen(mode))
    value = "Bearer sk-dummy" if header == "Authorization" else "EMPTY"
    reply = http.post_json(faults.url + CHAT_PATH, chat_body(model), headers={header: value, **SPECULATE}, timeout=60)
    assert_served(reply, "speculative" if model.endswith("spec") else "passthrough")
    calls = [s for s in fake.seen(mode)[count:] if s.path in (CHAT_PATH, "/tokenize", GENERATE_PATH)]
    assert calls and all(call.authorization == [f"Bearer {ROUTE_KEY}"] for call in calls), calls


# -- tokenizer mismatch -----------------------------------------------------------------------------


def test_tokenizer_mismatch_passes_through_with_the_verifiers_own_output(faults: Process,
                                                                          faults_verifier: Process) -> None:
    body = {"model": "gemma", "messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 12,
            "temperature": 0}
    direct = http.post_json(faults_verifier.url + CHAT_PATH, body, timeout=120)
    assert direct.status == 200
    for _ in range(2):
        reply = http.post_json(faults.url + CHAT_PATH, body, timeout=120)
        assert_served(reply, "passthrough")
        assert reply.json()["choices"] == direct.json()["choices"]
        assert reply.json()["usage"] == direct.json()["usage"]
    requests = log_events(faults, lambda e: e.get("route") == "gemma" and e.get("event") == "request", at_least=2)
    warnings = log_events(faults, lambda e: e.get("route") == "gemma" and e.get("level") == "warning")
    assert len(warnings) == 1, warnings  # said once, at start-up, not per request
    assert warnings[0].get("compatible") is False and "vocabulary" in warnings[0]["reason"]
    assert len(requests) >= 2
    assert all(e["mode"] == "passthrough" and e["reason"].startswith("tokenizer mismatch") for e in requests)


# -- model renaming ---------------------------------------------------------------------------------


@pytest.mark.parametrize("why, fields, headers", [
    ("client opted out", {}, PASS),
    ("parameters only the upstream can honour", {"presence_penalty": 0.5}, SPECULATE),
    ("prompt + max_tokens exceed the draft's context", {"max_tokens": 5000}, SPECULATE),
], ids=lambda v: v if isinstance(v, str) else "")
def test_every_passthrough_renames_the_model(faults: Process, fake: FakeUpstream, why: str, fields: dict,
                                             headers: dict) -> None:
    """A route with `upstream.model` sends that name upstream whatever made the request pass through."""
    count = len(fake.seen("bigctx", CHAT_PATH))
    reply = http.post_json(faults.url + CHAT_PATH, chat_body("public-name", **fields), headers=headers, timeout=60)
    assert_served(reply, "passthrough")
    forwarded = fake.seen("bigctx", CHAT_PATH)[count:]
    assert len(forwarded) == 1
    assert forwarded[0].body["model"] == "internal-name"


# -- passthrough transparency -----------------------------------------------------------------------


def test_upstream_error_status_passes_through(faults: Process) -> None:
    reply = http.post_json(faults.url + CHAT_PATH, chat_body("ratelimit"), timeout=30)
    error = assert_openai_error(reply, 429, error_type="rate_limit_error", message="slow down")
    assert error["code"] == 429
    assert reply.headers["retry-after"] == RETRY_AFTER
    assert reply.headers[MODE_HEADER] == "passthrough"


def test_headers_pass_through_both_ways_except_hop_by_hop(faults: Process, fake: FakeUpstream) -> None:
    sent = {"X-Request-Id": "req-42", "OpenAI-Organization": "org-7", "User-Agent": "speculoos-test/1",
            "Proxy-Authorization": "Basic cHJveHk6cHc=", "TE": "trailers"}
    reply = http.post_json(faults.url + CHAT_PATH, chat_body("keyed", temperature=0.7), headers=sent, timeout=60)
    assert_served(reply, "passthrough")
    assert reply.headers[UPSTREAM_HEADER.lower()] == "keyed"  # the upstream's own header came back
    seen = fake.seen("keyed", CHAT_PATH)[-1].headers
    for name in ("X-Request-Id", "OpenAI-Organization", "User-Agent"):
        assert seen.get(name.lower()) == [sent[name]], name
    assert "proxy-authorization" not in seen and "te" not in seen


TRANSPARENT = [
    # (id, method, path, JSON body or None)
    ("health", "GET", "/health", None),
    ("health with a query", "GET", "/health?verbose=1", None),
    ("tokenize a prompt", "POST", "/tokenize", {"prompt": "Hello, world! 🙂"}),
    ("tokenize messages", "POST", "/tokenize", {"messages": MESSAGES}),
    ("tokenize a bad body", "POST", "/tokenize", {"prompt": 5}),
    ("detokenize", "POST", "/detokenize", {"tokens": [1, 2, 3]}),
    ("model info", "GET", "/get_model_info", None),
    ("server info", "GET", "/server_info", None),
    ("wrong method", "DELETE", "/health", None),
    ("head", "HEAD", "/health", None),
]


@pytest.mark.parametrize("method, path, body", [pytest.param(*case[1:], id=case[0]) for case in TRANSPARENT])
def test_info_paths_pass_through_untouched(smol_proxy: Process, smol_verifier: Process, method: str, path: str,
                                            body: Any) -> None:
    raw = None if body is None else json.dumps(body).encode()
    headers = {} if body is None else {"Content-Type": "application/json"}
    direct = http.request(method, smol_verifier.url + path, raw, headers, timeout=60)
    proxied = http.request(method, smol_proxy.url + path, raw, headers, timeout=60)
    assert proxied.status == direct.status
    assert proxied.body == direct.body
    assert proxied.headers["content-type"] == direct.headers["content-type"]
    assert proxied.headers.get("content-length") == direct.headers.get("content-length")
    assert proxied.headers[MODE_HEADER] == "passthrough"
    assert "transfer-encoding" not in proxied.headers or "content-length" not in proxied.headers


NOT_FORWARDED = [
    # (id, method, path): neither the OpenAI API nor SGLang's read-only info paths
    ("unknown path", "GET", "/no/such/path"),
    ("unknown path, POST", "POST", "/v2/whatever"),
    ("a native generation", "POST", "/generate"),
    ("a state change", "POST", "/flush_cache"),
]


@pytest.mark.parametrize("method, path", [pytest.param(*case[1:], id=case[0]) for case in NOT_FORWARDED])
def test_other_paths_get_the_proxys_404(smol_proxy: Process, method: str, path: str) -> None:
    reply = http.request(method, smol_proxy.url + path, b"{}", {"Content-Type": "application/json"}, timeout=60)
    assert_openai_error(reply, 404, error_type="invalid_request_error", message=f"Invalid URL ({method} {path})")
    assert MODE_HEADER not in reply.headers


# -- /v1/models -------------------------------------------------------------------------------------


def test_models_lists_every_route(faults: Process) -> None:
    reply = http.get(faults.url + "/v1/models")
    assert reply.status == 200
    body = reply.json()
    assert body["object"] == "list"
    assert {m["id"] for m in body["data"]} >= {"smol", "gemma", "down", "stall", "public-name"}
    for model in body["data"]:
        assert model["object"] == "model"
        assert isinstance(model["created"], int) and isinstance(model["owned_by"], str)
    assert [m.id for m in sdk(faults).models.list()] == [m["id"] for m in body["data"]]


def test_models_through_a_catch_all_route_lists_the_upstreams_models(smol_proxy: Process,
                                                                     smol_verifier: Process) -> None:
    direct = http.get(smol_verifier.url + "/v1/models").json()
    proxied = http.get(smol_proxy.url + "/v1/models")
    assert proxied.status == 200
    body = proxied.json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == [m["id"] for m in direct["data"]]
    for model in body["data"]:
        assert {"id", "object", "created", "owned_by"} <= set(model) and model["object"] == "model"
    assert [m.id for m in sdk(smol_proxy).models.list()] == [m["id"] for m in body["data"]]
