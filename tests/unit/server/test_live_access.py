"""Who reads the live view: each API key its own requests, a reader without a key the keyless ones, the admin
token every tenant's; a wrong token is refused with an OpenAI error, and the token is printed once, never logged."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog
import yaml
from aiohttp.test_utils import TestServer

from proxy.config.load import ConfigError, parse_config
from proxy.server import live
from proxy.server.live import EVENTS_PATH, PAGE_PATH
from proxy.server.runtime import CONFIG
from tests.unit.server.live_app import ANSWER, QUESTION, ask, proxy, read_event

REPO = Path(__file__).resolve().parents[3]
TOKEN_HEADER = "X-Speculoos-Live-Token"  # the admin token's header (a page passes its URL's #token=)
TOKEN = "admin-token-for-the-tests-0123456789"
SENDERS = {"alice": "sk-alice", "bob": "sk-bob", "nobody": None}  # who sends a request, with which key
KEYS = {**SENDERS, "carol": "sk-carol"}  # carol sends nothing but her own last request
SENTINEL = "the reader's own last request"


def reader_headers(reader: str) -> dict[str, str]:
    """How `reader` opens the stream: the admin token, its API key, or nothing."""
    if reader == "admin":
        return {TOKEN_HEADER: TOKEN}
    key = KEYS[reader]
    return {} if key is None else {"Authorization": f"Bearer {key}"}


async def shown_while_served(server: TestServer, reader: str) -> str:
    """Everything a page open as `reader` is sent while each sender asks its question, then a new page's snapshot."""
    headers, own_key = reader_headers(reader), KEYS.get(reader)
    url = server.make_url(EVENTS_PATH)
    async with aiohttp.ClientSession() as session:
        async with session.get(url, headers=headers) as page:
            assert page.status == 200
            shown: list[dict[str, Any]] = [await read_event(page)]
            for sender, key in SENDERS.items():
                await ask(session, server, QUESTION + sender, key)
            await ask(session, server, SENTINEL, own_key)  # events come in order: this one ends what is shown
            sentinel = None
            while not shown or shown[-1].get("type") != "end" or shown[-1]["id"] != sentinel:
                shown.append(await read_event(page))
                if shown[-1]["type"] == "begin" and shown[-1]["request"]["prompt"] == SENTINEL:
                    sentinel = shown[-1]["request"]["id"]
        async with session.get(url, headers=headers) as page:
            shown.append(await read_event(page))
    return json.dumps(shown)


@pytest.mark.parametrize(("reader", "sees"), [
    ("bob", {"bob"}),
    ("alice", {"alice"}),
    ("nobody", {"nobody"}),  # no key: the keyless requests only
    ("carol", set()),  # a key that sent nothing else
    ("admin", {"alice", "bob", "nobody"}),  # the admin token: every tenant
])
async def test_a_reader_sees_only_its_own_keys_requests(tmp_path: Path, reader: str, sees: set[str]) -> None:
    async for server in proxy(tmp_path, enabled=True, token=TOKEN if reader == "admin" else None):
        shown = await shown_while_served(server, reader)
    for sender in SENDERS:
        assert (QUESTION + sender in shown, ANSWER + sender in shown) == (sender in sees,) * 2, (sender, shown)
    assert SENTINEL in shown
    assert "sk-" not in shown and TOKEN not in shown  # neither keys nor the token


def generated_token(server: TestServer) -> str:
    return server.app[live.LIVE_TOKEN]


@pytest.mark.parametrize("wrong", [
    lambda token: "not-the-token",
    lambda token: "",
    lambda token: token[:-1],
    lambda token: token + "x",
    lambda token: token.swapcase(),
    lambda token: "é" + token,  # not ASCII: still an answer, not a crash
], ids=["other", "empty", "shorter", "longer", "case", "non-ascii"])
async def test_a_wrong_token_gets_403_with_an_openai_error(tmp_path: Path, wrong: Any) -> None:
    async for server in proxy(tmp_path, enabled=True):
        given = wrong(generated_token(server))
        async with aiohttp.ClientSession() as session, \
                session.get(server.make_url(EVENTS_PATH), headers={TOKEN_HEADER: given}) as response:
            status, body = response.status, await response.json()
    assert status == 403
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "permission_error" and "token" in body["error"]["message"]


async def test_the_configured_token_replaces_the_generated_one(tmp_path: Path) -> None:
    async for server in proxy(tmp_path, enabled=True, token=TOKEN):
        assert generated_token(server) == TOKEN
        async with aiohttp.ClientSession() as session, \
                session.get(server.make_url(EVENTS_PATH), headers={TOKEN_HEADER: TOKEN + "x"}) as response:
            assert response.status == 403
    assert TOKEN not in repr(server.app[CONFIG])  # the config keeps it as a secret


@pytest.mark.parametrize("configured", [False, True])
async def test_the_token_is_printed_once_at_start_up_and_never_logged(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, configured: bool) -> None:
    caplog.set_level(logging.DEBUG)
    with structlog.testing.capture_logs() as logged:
        async for server in proxy(tmp_path, enabled=True, token=TOKEN if configured else None):
            token = generated_token(server)
            async with aiohttp.ClientSession() as session:
                for given in (token, token + "x", "x" + token):
                    async with session.get(server.make_url(EVENTS_PATH), headers={TOKEN_HEADER: given}) as page:
                        if page.status == 200:
                            await read_event(page)
                await ask(session, server, "hi", token)  # a client that sends it as its API key
    out, err = capsys.readouterr()
    if configured:
        assert token not in out  # its owner has it already
    else:
        assert re.fullmatch(r"[A-Za-z0-9_-]{43,}", token)  # secrets.token_urlsafe(32)
        assert out.count(token) == 1 and f"{PAGE_PATH}#token={token}" in out
    assert PAGE_PATH in out
    assert token not in err and token not in caplog.text and token not in repr(logged)


@pytest.mark.parametrize(("token", "message"), [
    ("too-short", "at least 16 characters"),
    ("sixteen chars with spaces", "visible ASCII"),
    ("ünïcödé-ünïcödé-ünïcödé", "visible ASCII"),
    (12345678901234567890, "visible ASCII"),
])
def test_a_weak_live_token_is_a_config_error_that_does_not_echo_it(token: Any, message: str) -> None:
    config = {"server": {"live": True, "live_token": token}, "routes": [{"name": "r", "upstream": {"url": "http://u"}}]}
    with pytest.raises(ConfigError, match=message) as error:
        parse_config(config)
    assert str(token) not in str(error.value)


def test_the_shipped_routes_leave_the_live_page_off() -> None:
    shipped = yaml.safe_load((REPO / "routes.yaml").read_text(encoding="utf-8"))
    assert shipped["server"].get("live", False) is False
