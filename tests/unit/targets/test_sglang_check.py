"""Against the fake SGLang: the tokenizer check, `speculoos check`'s report, and greedy output through the proxy."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.config.load import parse_config
from proxy.server.app import create_app
from proxy.server.cli import check_report
from proxy.targets.tokenizer_check import check_tokenizer
from proxy.targets.upstream import Timeouts, Upstream
from tests.fakes.drafter import ScriptedDrafter, ToyDrafter
from tests.fakes.sglang import CONTEXT_SIZE, MIDDLE, OLDEST, Release, fake_sglang_app
from tests.fakes.toy_model import END, VOCAB, ToyModel, ToyVocabulary

ENDS_AFTER = 40  # the toy target ends any generation once the context holds this many tokens


class OtherEnd(ToyVocabulary):
    """A draft vocabulary in which the target's end token ends nothing."""

    def is_end_of_generation(self, token: int) -> bool:
        return False


class OtherTokens(ToyVocabulary):
    """A draft vocabulary that splits text otherwise."""

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        return [1 + (ord(c) * 7) % 23 for c in text]


@pytest.fixture
async def fake_url(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A fake SGLang (its release and toy model from the test's parameters) on a loopback port."""
    release, model = getattr(request, "param", (Release(), ToyModel(end_after=ENDS_AFTER)))
    server = TestServer(fake_sglang_app(model, release=release))
    await server.start_server()
    yield str(server.make_url("")).rstrip("/")
    await server.close()


@pytest.mark.parametrize(("fake_url", "draft", "compatible", "reason"), [
    ((Release(), ToyModel(end_after=ENDS_AFTER)), ToyVocabulary(), True, "generations end with id 0"),
    ((Release(), ToyModel(end_after=ENDS_AFTER)), OtherEnd(), False, "ends generations with id 0"),
    ((Release(), ToyModel(end_after=ENDS_AFTER)), OtherTokens(), False, "probe 0 tokenizes differently"),
    ((OLDEST, ToyModel(end_after=ENDS_AFTER)), ToyVocabulary(), True, "EOS unknown"),  # /tokenize, prompts only
    ((MIDDLE, ToyModel(end_after=ENDS_AFTER)), ToyVocabulary(), True, "generations end with id 0"),
], indirect=["fake_url"], ids=["same", "other end", "other tokens", "0.4.9", "0.5.4"])
async def test_the_tokenizer_check_needs_no_vocabulary_fields(fake_url: str, draft: ToyVocabulary, compatible: bool,
                                                              reason: str) -> None:
    upstream = Upstream(fake_url, Timeouts(1.0, 5.0, 5.0))
    try:
        verdict = await check_tokenizer(draft, upstream)
    finally:
        await upstream.close()
    assert verdict.compatible == compatible and reason in verdict.reason


def config(url: str, tmp_path: Path) -> Any:
    """One route to the fake with a toy draft (the loader below ignores the file it names)."""
    (tmp_path / "toy.gguf").write_bytes(b"")
    return parse_config({"routes": [{"name": "toy", "match": {"model": "*"}, "upstream": {"url": url},
                                     "draft": {"model": str(tmp_path / "toy.gguf")}, "speculation": {"k": 4}}]})


def load_toy(options: Any) -> ToyDrafter:
    return ToyDrafter(ToyModel(seed=11))  # another toy model than the target's


def loader(model: ToyModel) -> Any:
    """A draft loader whose drafter proposes the target's greedy continuation, wrong at the third token."""

    def script(context: Sequence[int], k: int) -> list[int]:
        tokens = model.greedy(context, k)
        if len(tokens) > 2:
            tokens[2] = (tokens[2] + 1) % model.vocab or 1  # any other token, never the end token
        return tokens

    return lambda options: ScriptedDrafter(script)


@pytest.mark.parametrize("fake_url", [(Release(deterministic=True), ToyModel(end_after=ENDS_AFTER))],
                         indirect=True)
async def test_check_reports_what_it_found(fake_url: str, tmp_path: Path) -> None:
    lines, failures = await check_report(config(fake_url, tmp_path), load_toy)
    found = dict(line.split("\t")[1:] for line in lines)
    assert failures == 0 and found[fake_url].startswith("speculative: 6 probes tokenize identically")
    assert found["server"] == "sglang 0.5.23"
    assert found["context length"] == f"{CONTEXT_SIZE} tokens (from /v1/models max_model_len)"
    assert found["seeds"].startswith("honoured")
    assert found["exact at greedy"] == found["exact at temperature 0.7, top_k 20"] == "yes"
    assert found["exact at temperature 1.0"].startswith("no: temperature > 0 needs top_k in 1..20")
    assert "joint top_p" in found["exact at temperature 0.7, top_k 20, top_p 0.9"]
    assert "top_p in (0, 1]" in found["exact at top_p 0"]


async def post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[dict, dict]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body, headers=headers) as reply:
        assert reply.status == 200, await reply.text()
        return dict(reply.headers), await reply.json()


RELEASES = {"0.5.23": Release(), "0.5.4": MIDDLE, "0.4.9": OLDEST}


@pytest.mark.parametrize("end_after", [ENDS_AFTER, None])
@pytest.mark.parametrize("release", RELEASES.values(), ids=RELEASES.keys())
async def test_greedy_output_through_the_proxy_is_the_servers_own(release: Release, end_after: int | None,
                                                                  tmp_path: Path) -> None:
    model = ToyModel(end_after=end_after)
    fake = TestServer(fake_sglang_app(model, release=release))
    await fake.start_server()
    fake_url = str(fake.make_url("")).rstrip("/")
    proxy = TestServer(create_app(config(fake_url, tmp_path), load_drafter=loader(model)))
    await proxy.start_server()
    base = str(proxy.make_url("")).rstrip("/")
    try:
        completion = {"model": "toy", "prompt": "Paris is", "max_tokens": 40, "temperature": 0}
        headers, through = await post(base + "/v1/completions", completion, {"X-Speculoos": "k=4"})
        _, plain = await post(fake_url + "/generate", {"input_ids": ToyVocabulary().tokenize("Paris is"),
                                                       "sampling_params": {"max_new_tokens": 40, "temperature": 0}})
        chat = {"model": "toy", "messages": [{"role": "user", "content": "Capital of France?"}], "max_tokens": 24,
                "temperature": 0}
        chat_headers, chat_through = await post(base + "/v1/chat/completions", chat, {"X-Speculoos": "k=4"})
        _, own = await post(fake_url + "/v1/chat/completions", chat)
    finally:
        await proxy.close()
        await fake.close()
    assert headers["X-Speculoos-Mode"] == "speculative"
    assert through["choices"][0]["text"] == plain["text"]
    assert through["usage"]["completion_tokens"] == len(plain["output_ids"])
    assert through["speculoos"]["drafted"] > through["speculoos"]["accepted"] > 0
    # Chat speculates where the server tokenizes conversations, and passes through where it cannot.
    assert chat_headers["X-Speculoos-Mode"] == ("passthrough" if release is OLDEST else "speculative")
    assert chat_through["choices"][0]["message"]["content"] == own["choices"][0]["message"]["content"]
    assert chat_through["usage"]["completion_tokens"] == own["usage"]["completion_tokens"]


class LlamaLookups(ToyVocabulary):
    """A draft vocabulary that, as llama.cpp's, cannot look up an id past its end (llama.cpp aborts the process)."""

    def is_end_of_generation(self, token: int) -> bool:
        assert 0 <= token < self.n_vocab, f"id {token} looked up past the vocabulary"
        return super().is_end_of_generation(token)


def ending_with(matched: Any) -> web.Application:
    """An SGLang-like server that tokenizes as the toy vocabulary and ends every generation at `matched`."""

    async def model_info(request: web.Request) -> web.Response:
        return web.json_response({"model_path": "toy"})

    async def tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"tokens": ToyVocabulary().tokenize(body.get("prompt", "Hi"), add_special=False)})

    async def generate(request: web.Request) -> web.Response:
        return web.json_response({"output_ids": [1], "meta_info": {"finish_reason": {"type": "stop",
                                                                                     "matched": matched}}})

    app = web.Application()
    app.router.add_get("/model_info", model_info)
    app.router.add_post("/v1/tokenize", tokenize)
    app.router.add_post("/generate", generate)
    return app


@pytest.mark.parametrize(("matched", "compatible", "reason"), [
    (END, True, "generations end with id 0"),
    (VOCAB + 5, False, f"the target ends generations with id {VOCAB + 5}, which does not end the draft's"),
    (10**400, True, "EOS unknown"),  # no id at all: as if the generation had not ended
    (True, True, "EOS unknown"),
])
async def test_an_ending_token_is_looked_up_only_inside_the_vocabulary(matched: Any, compatible: bool,
                                                                      reason: str) -> None:
    server = TestServer(ending_with(matched))
    await server.start_server()
    upstream = Upstream(str(server.make_url("")), Timeouts(1.0, 5.0, 5.0))
    try:
        verdict = await check_tokenizer(LlamaLookups(), upstream)
    finally:
        await upstream.close()
        await server.close()
    assert verdict.compatible == compatible and reason in verdict.reason
