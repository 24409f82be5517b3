"""The hostile side of the soak: what a reviewer tried against the proxy and the verifier, one request at a time.

Each action sends one attack and says whether the answer was a failure of the proxy's own: a 5xx other than a
503 with Retry-After (the proxy's load shedding), a refusal that did not come, or another tenant's text seen.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

import aiohttp
from yarl import URL

LIVE_READ_S = 2.0  # how long a foreign reader watches the live feed
SLOW_READ_S = 5.0  # how long a slow client leaves a stream unread
JSON = {"Content-Type": "application/json"}
# Built once: the attack is what the proxy does with them, not what building them costs this client.
JUNK = b'{"model": "m", "junk": [' + b",".join([b"[]"] * 2_700_000) + b"]}"  # 8 MiB: some 170 MB once parsed
JUNK_WITHIN = b'{"model": "m", "junk": [' + b",".join([b"[]"] * 440_000) + b"]}"  # as much as one body may parse
DEEP = b"[" * 100_000 + b"]" * 100_000
HUGE_NUMBER = b'{"model": "m", "prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}"


@dataclass
class Attack:
    """Where one attack goes and what it must not get."""

    proxy: str
    verifier: str
    prompts: Sequence[str]  # the normal clients' prompts: no foreign reader may see them
    rng: random.Random

    async def run(self, session: aiohttp.ClientSession) -> tuple[str, str | None]:
        """One attack drawn from the list: (its name, a problem or None)."""
        name, action = self.rng.choice(ACTIONS)
        return name, await action(self, session)


def _judge(status: int, headers: Mapping[str, str], refused: bool) -> str | None:
    """A problem in an answer: a 5xx of the proxy's own, or a refusal that did not come."""
    if status >= 500 and not (status == 503 and "Retry-After" in headers):
        return f"answered {status}"
    if refused and status < 400:
        return f"not refused ({status})"
    return None


async def _send(session: aiohttp.ClientSession, method: str, url: str | URL, *, refused: bool,
                **kwargs: object) -> str | None:
    async with session.request(method, url, **kwargs) as reply:  # type: ignore[arg-type]
        await reply.read()
        return _judge(reply.status, reply.headers, refused)


def _chat(content: str, **extra: object) -> dict:
    # One token: what these requests test is how their headers and fields are handled, and a longer answer would
    # only add the same decoding load as one more normal client.
    return {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 1, **extra}


async def live_reader(a: Attack, session: aiohttp.ClientSession) -> str | None:
    """Another tenant's key on the live feed: it must see none of the other clients' prompts."""
    seen = b""
    async with session.get(a.proxy + "/speculoos/live/events", headers={"Authorization": "Bearer sk-stranger"}) as r:
        if r.status != 200:
            return _judge(r.status, r.headers, refused=False)
        try:
            async with asyncio.timeout(LIVE_READ_S):
                async for chunk in r.content.iter_any():
                    seen += chunk
        except TimeoutError:
            pass
    leaked = [p for p in a.prompts if p[:30].encode() in seen or json.dumps(p[:30])[1:-1].encode() in seen]
    return f"saw another tenant's prompt {leaked[0][:30]!r}" if leaked else None


async def state_path(a: Attack, session: aiohttp.ClientSession) -> str | None:
    """Paths that change a server's state, which no page or client may reach through the proxy."""
    method, path = a.rng.choice([("GET", "/flush_cache"), ("POST", "/sleep"), ("GET", "/start_profile"),
                                  ("POST", "/v1/load_lora_adapter"), ("POST", "/generate"),
                                  ("POST", "/reset_prefix_cache")])
    return await _send(session, method, a.proxy + path, refused=True, json={})


async def dot_segments(a: Attack, session: aiohttp.ClientSession) -> str | None:
    path = a.rng.choice(["/v1/../../model_info", "/v1/%2e%2e/%2e%2e/generate", "/speculoos/live/x/../../v1/models"])
    return await _send(session, "GET", URL(a.proxy + path, encoded=True), refused=True)


async def foreign_host(a: Attack, session: aiohttp.ClientSession) -> str | None:
    """DNS rebinding: a page on evil.example whose name now points at this machine."""
    return await _send(session, "GET", a.proxy + "/v1/models", refused=True, headers={"Host": "evil.example"})


async def cross_site(a: Attack, session: aiohttp.ClientSession) -> str | None:
    return await _send(session, "POST", a.proxy + "/v1/chat/completions", refused=True, json=_chat("hi"),
                       headers={"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"})


async def verifier_batch(a: Attack, session: aiohttp.ClientSession) -> str | None:
    """One /generate batch that would hold every verifier sequence for minutes."""
    body = {"input_ids": [[1] * 100] * 5000, "sampling_params": {"max_new_tokens": 1}}
    return await _send(session, "POST", a.verifier + "/generate", refused=True, json=body)


async def verifier_plain_text(a: Attack, session: aiohttp.ClientSession) -> str | None:
    """A page's `no-cors` post: JSON sent as text/plain."""
    body = json.dumps({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1}})
    return await _send(session, "POST", a.verifier + "/generate", refused=True, data=body,
                       headers={"Content-Type": "text/plain"})


async def junk_json(a: Attack, session: aiohttp.ClientSession) -> str | None:
    """Empty lists: 8 MiB of them, or as many as server.max_body_parsed_bytes lets one body parse."""
    return await _send(session, "POST", a.proxy + "/v1/chat/completions", refused=True,
                       data=a.rng.choice([JUNK, JUNK_WITHIN]), headers=JSON)


async def deep_or_huge(a: Attack, session: aiohttp.ClientSession) -> str | None:
    body = a.rng.choice([DEEP, HUGE_NUMBER,
                          json.dumps(_chat("hi", prediction={"type": "content", "content": "\ud800"})).encode()])
    return await _send(session, "POST", a.proxy + "/v1/completions", refused=True, data=body, headers=JSON)


async def placeholder_key(a: Attack, session: aiohttp.ClientSession) -> str | None:
    """A client's dummy key under each header name: served with the route's key, as its own tenant."""
    header = a.rng.choice(["Authorization", "api-key", "x-api-key"])
    value = "Bearer sk-dummy" if header == "Authorization" else "EMPTY"
    return await _send(session, "POST", a.proxy + "/v1/chat/completions", refused=False,
                       json=_chat(a.rng.choice(a.prompts)), headers={header: value})


async def slow_reader(a: Attack, session: aiohttp.ClientSession) -> str | None:
    """A stream left unread for seconds, passed through and speculated."""
    headers = {"X-Speculoos": a.rng.choice(["off", "auto"])}
    async with session.post(a.proxy + "/v1/chat/completions", json=_chat(a.prompts[0], stream=True, max_tokens=16),
                            headers=headers) as reply:
        await reply.content.readline()
        await asyncio.sleep(SLOW_READ_S)
        await reply.read()
        return _judge(reply.status, reply.headers, refused=False)


async def passed_for_the_server(a: Attack, session: aiohttp.ClientSession) -> str | None:
    """Fields the proxy leaves to the server when it passes a request through."""
    body = _chat("hi", n=0, temperature=2.5, stop=["a", "b", "c", "d", "e"])
    return await _send(session, "POST", a.proxy + "/v1/chat/completions", refused=False, json=body,
                       headers={"X-Speculoos": "off"})


async def gzip_body(a: Attack, session: aiohttp.ClientSession) -> str | None:
    body = gzip.compress(json.dumps(_chat("hi")).encode())
    return await _send(session, "POST", a.proxy + "/v1/chat/completions", refused=False, data=body,
                       headers={**JSON, "Content-Encoding": "gzip", "Connection": "close, x-secret",
                                "x-secret": "1"})


ACTIONS: list[tuple[str, Callable[[Attack, aiohttp.ClientSession], Awaitable[str | None]]]] = [
    (action.__name__, action) for action in (live_reader, state_path, dot_segments, foreign_host, cross_site,
                                             verifier_batch, verifier_plain_text, junk_json, deep_or_huge,
                                             placeholder_key, slow_reader, passed_for_the_server, gzip_body)
]
