"""Driving a proxy process from the outside: its routes file, requests, and what a good answer looks like."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.client import HTTPConnection, HTTPResponse
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import openai
import pytest
import yaml

from tests import support as http
from tests.e2e.servers import THREADS, Process, start_proxy

CLIENT_KEY = "sk-secret-123"
ROUTE_KEY_ENV = "SPECULOOS_TEST_ROUTE_KEY"
ROUTE_KEY = "sk-route-7f3a9c2e-never-logged"
ROUTE_KEYED = {"upstream": {"api_key": "${env.%s}" % ROUTE_KEY_ENV}}  # route settings: send ROUTE_KEY upstream
FORWARDING = {"upstream": {**ROUTE_KEYED["upstream"], "forward_client_key": True}}  # ... unless the client sends one
MAX_BODY = 1024  # the proxy's server.max_body_bytes
MODE_HEADER = "x-speculoos-mode"
SPECULATE = {"X-Speculoos": "on"}  # speculate whatever the route's controller would decide
PASS = {"X-Speculoos": "off"}
MESSAGES = [{"role": "user", "content": "Say hello."}]
LOG_WAIT_S = 10.0  # how long a test waits for log lines it expects
ERROR_KEYS = {"message", "type", "param", "code"}
CHAT_PATH, COMPLETIONS_PATH = "/v1/chat/completions", "/v1/completions"
FIRST_BYTE_S = 1.0  # the `stall` route's timeouts.first_byte
STALLGEN_FIRST_BYTE_S = 2.0  # the `stallgen` route's (its start-up tokenizer check must fit in it)
IDLE_S = 1.0  # the `stallmid` route's timeouts.idle


# -- the proxy process ------------------------------------------------------------------------------


def route(name: str, url: str, *, draft: str | None = None, **extra: Any) -> dict[str, Any]:
    """A route serving model `name` from the SGLang upstream at `url`; `extra` sections merge into it."""
    settings: dict[str, Any] = {"name": name, "match": {"model": name},
                                "upstream": {"url": url, "protocol": "sglang"}}
    if draft:
        settings["draft"] = {"model": draft, "threads": int(THREADS), "ctx": 4096, "shares_cores": False}  # as APART
    for key, value in extra.items():
        settings[key] = {**settings.get(key, {}), **value}
    return settings


def start_routes_proxy(path: Path, routes: list[dict[str, Any]], **environ: str) -> Process:
    """A proxy serving `routes` (written to `path`), with ROUTE_KEY and `environ` in its environment."""
    path.write_text(yaml.safe_dump({"server": {"max_body_bytes": MAX_BODY}, "routes": routes}, sort_keys=False))
    with pytest.MonkeyPatch.context() as env:
        for name, value in {ROUTE_KEY_ENV: ROUTE_KEY, **environ}.items():
            env.setenv(name, value)
        return start_proxy(path, path.parent)


def log_events(process: Process, wanted: Callable[[dict[str, Any]], bool] = lambda event: True,
               at_least: int = 0) -> list[dict[str, Any]]:
    """The process's JSON log lines that are wanted, once at least `at_least` of them are written (a request's line
    follows its response, so it may not be there yet) or LOG_WAIT_S have passed."""
    deadline = time.monotonic() + LOG_WAIT_S
    while True:
        events = []
        for line in process.log().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and wanted(event):
                events.append(event)
        if len(events) >= at_least or time.monotonic() > deadline:
            return events
        time.sleep(0.05)


# -- requests ---------------------------------------------------------------------------------------


def chat_body(model: str, **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": MESSAGES, "max_tokens": 2, "temperature": 0, **fields}


def sdk(proxy: Process, **options: Any) -> openai.OpenAI:
    """The openai client pointed at the proxy, without retries (a retried 5xx would hide timings)."""
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-test", max_retries=0, timeout=60, **options)


@contextmanager
def streaming(proxy: Process, path: str, body: dict, headers: dict[str, str] | None = None) -> Iterator[HTTPResponse]:
    """POST `body` and hand over the response unread, to read as it arrives; hang up on exit."""
    parts = urlsplit(proxy.url)
    connection = HTTPConnection(parts.hostname, parts.port, timeout=120)
    response = None
    try:
        connection.request("POST", path, body=json.dumps(body),
                           headers={"Content-Type": "application/json", **(headers or {})})
        response = connection.getresponse()
        yield response
    finally:
        if response is not None:
            response.close()
        connection.close()


def read_first_chunk_then_hang_up(proxy: Process, path: str, body: dict, headers: dict[str, str]) -> None:
    with streaming(proxy, path, body, headers) as response:
        assert response.status == 200
        assert response.readline().startswith(b"data: {")


# -- what the answers must be -----------------------------------------------------------------------


def assert_openai_error(reply: http.Reply, status: int, *, error_type: str | None = None,
                        message: str | None = None, param: str | None = None) -> dict[str, Any]:
    """The reply is `status` with an OpenAI error body; returns the error object."""
    assert reply.status == status, reply.body[:500]
    assert reply.headers["content-type"].startswith("application/json")
    body = reply.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == ERROR_KEYS
    assert isinstance(error["message"], str) and error["message"]
    if error_type is not None:
        assert error["type"] == error_type
    if message is not None:
        assert message in error["message"]
    if param is not None:
        assert error["param"] == param
    return error


def assert_ends_in_band(events: list[Any], error_type: str) -> list[Any]:
    """The SSE events end with an OpenAI error event of `error_type`, then [DONE]; returns the chunks before."""
    assert events[-1] == "[DONE]"
    error = events[-2]
    assert set(error) == {"error"} and set(error["error"]) == ERROR_KEYS
    assert error["error"]["type"] == error_type
    return events[:-2]


def assert_served(reply: http.Reply, mode: str) -> None:
    """The reply is a 200, served in `mode` ("speculative" or "passthrough")."""
    assert reply.status == 200, reply.body[:500]
    assert reply.headers[MODE_HEADER] == mode


def assert_still_serving(proxy: Process, *, passthrough: bool = True) -> None:
    """The proxy lists its models and answers a small speculative (and a passthrough) request."""
    models = http.get(proxy.url + "/v1/models", timeout=30)
    assert models.status == 200 and models.json()["object"] == "list"
    tiny = {"model": "smol", "prompt": "Hi", "max_tokens": 2, "temperature": 0}
    reply = http.post_json(proxy.url + COMPLETIONS_PATH, tiny, headers=SPECULATE, timeout=120)
    assert_served(reply, "speculative")
    assert reply.json()["choices"][0]["finish_reason"] in ("stop", "length")
    if passthrough:
        assert_served(http.post_json(proxy.url + COMPLETIONS_PATH, tiny, headers=PASS, timeout=120), "passthrough")
