"""SGLangTarget's probe, prompt ids and context length against fake SGLang releases (tests/fakes/sglang.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web

from proxy.errors import UpstreamUnavailableError
from proxy.sampling.processors import SamplerOrder, SamplingParams
from proxy.targets.sglang_probe import ChatPrompts
from proxy.wire.request import CHAT, COMPLETION, parse_generation_request
from tests.fakes.sglang import CONTEXT_SIZE, MIDDLE, OLDEST, ROLE_IDS, SEEN, Release, fake_sglang_app, toy_chat_ids
from tests.fakes.toy_model import ToyModel, ToyVocabulary
from tests.unit.targets.serving import serving, verifier_info_app

TOP_N = 5
PLACEHOLDER = int(1e30)  # HF's model_max_length when a tokenizer names no limit
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}]
CHAT_IDS = toy_chat_ids(MESSAGES, add_generation_prompt=True)
PARIS = ToyVocabulary().tokenize("Paris")
HEADER = (ROLE_IDS["assistant"],)  # the toy template's generation prompt


# What the probe learns from each release.


@pytest.mark.parametrize(("app", "expected"), [
    (lambda: fake_sglang_app(ToyModel()),
     {"server": "sglang 0.5.23", "tokenize_path": "/v1/tokenize", "seeds": False, "context_length": CONTEXT_SIZE,
      "chat": ChatPrompts(None, HEADER, "the chat endpoint's prompt_token_ids agree")}),
    (lambda: fake_sglang_app(ToyModel(), release=Release(deterministic=True)), {"seeds": True}),
    (lambda: fake_sglang_app(ToyModel(), release=MIDDLE),  # add_generation_prompt ignored: the count decides
     {"server": "sglang 0.5.4", "chat": ChatPrompts(None, (), "the chat endpoint's prompt token count agrees")}),
    (lambda: fake_sglang_app(ToyModel(), release=OLDEST),
     {"server": "sglang 0.4.9", "tokenize_path": "/tokenize", "tokenize_problem": None}),
    (lambda: fake_sglang_app(ToyModel(), tokenizer_max_length=PLACEHOLDER),  # 0.5.23 answers it as the context
     {"tokenize_problem": None, "context_length": CONTEXT_SIZE, "context_source": "/v1/models max_model_len"}),
    (lambda: fake_sglang_app(ToyModel(), release=Release(models_card_length=False), launch_context_length=2048),
     {"context_length": 2048, "context_source": "server info context_length"}),
    (lambda: fake_sglang_app(ToyModel(), release=Release(models_card_length=False)), {"context_length": None}),
    (verifier_info_app, {"exact_support": True, "tokenize_path": None, "server": "unknown version"}),
    (web.Application, {"exact_support": False, "model": None, "context_length": None, "seeds": None}),
], ids=["0.5.23", "deterministic", "0.5.4", "0.4.9", "1e30 clamped", "launch context", "no context",
        "verifier model info only", "nothing"])
async def test_probe_finds(app: Callable[[], web.Application], expected: dict[str, Any]) -> None:
    async with serving(app()) as target:
        info = await target.probe()
    assert {key: getattr(info, key) for key in expected} == expected


@pytest.mark.parametrize(("release", "tokenizer_max_length", "problem"), [
    (OLDEST, None, "/tokenize takes no chat messages"),
    (MIDDLE, PLACEHOLDER, "/v1/tokenize fails (upstream returned HTTP 500"),  # before the clamp
])
async def test_probe_says_why_chat_cannot_speculate(release: Release, tokenizer_max_length: int | None,
                                                    problem: str) -> None:
    async with serving(fake_sglang_app(ToyModel(), release=release,
                                       tokenizer_max_length=tokenizer_max_length)) as target:
        info = await target.probe()
    assert info.chat.problem is not None and problem in info.chat.problem


async def test_a_chat_endpoint_that_renders_otherwise_is_caught() -> None:
    app = fake_sglang_app(ToyModel(), release=MIDDLE)

    @web.middleware
    async def other_template(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path != "/v1/chat/completions":
            return await handler(request)
        return web.json_response({"choices": [{"index": 0, "message": {"content": "x"}}],
                                  "usage": {"prompt_tokens": 99, "completion_tokens": 1, "total_tokens": 100}})

    app.middlewares.append(other_template)
    async with serving(app) as target:
        info = await target.probe()
    assert "into 4 tokens, the chat endpoint into 99" in info.chat.problem  # role, "H", "i", header


async def test_probe_lines_name_every_finding() -> None:
    async with serving(fake_sglang_app(ToyModel())) as target:
        lines = dict((await target.probe()).lines())
    assert lines["server"] == "sglang 0.5.23" and lines["context length"].startswith(f"{CONTEXT_SIZE} tokens")
    assert "--enable-deterministic-inference" in lines["seeds"]
    assert lines["chat prompts"] == (
        "verified: the chat endpoint's prompt_token_ids agree; a generation prompt of 1 tokens")
    assert "current SGLang" in lines["log-prob alignment"]


# Prompt ids and context length.


@pytest.mark.parametrize("release", [Release(), MIDDLE], ids=["0.5.23", "0.5.4"])
@pytest.mark.parametrize(("kind", "body", "ids", "sent"), [
    (COMPLETION, {"prompt": "Paris"}, PARIS, ("POST /v1/tokenize", {"prompt": "Paris"})),
    (COMPLETION, {"prompt": [5, 6, 7]}, [5, 6, 7], None),  # ids verbatim
    (CHAT, {"messages": MESSAGES}, CHAT_IDS, ("POST /v1/tokenize", {"messages": MESSAGES})),
    (CHAT, {"messages": [*MESSAGES, {"role": "assistant", "content": "Par"}], "continue_final_message": True,
            "add_generation_prompt": False},  # what the chat endpoint reads, and not what it ignores
     CHAT_IDS + ToyVocabulary().tokenize("Par"),
     ("POST /v1/tokenize", {"messages": [*MESSAGES, {"role": "assistant", "content": "Par"}],
                            "continue_final_message": True})),
])
async def test_prompt_ids(release: Release, kind: str, body: dict[str, Any], ids: list[int],
                          sent: tuple[str, dict] | None) -> None:
    app = fake_sglang_app(ToyModel(), release=release)
    async with serving(app) as target:
        await target.probe()
        count = len(app[SEEN])
        assert await target.prompt_ids(body, kind) == (ids, CONTEXT_SIZE)
    assert app[SEEN][count:] == ([sent] if sent else [])


async def test_the_context_size_is_the_servers_even_when_the_tokenizer_says_otherwise() -> None:
    app = fake_sglang_app(ToyModel(), context_size=CONTEXT_SIZE, tokenizer_max_length=int(1e30))
    async with serving(app) as target:
        assert await target.prompt_ids({"prompt": "Paris"}, COMPLETION) == (PARIS, CONTEXT_SIZE)


async def test_the_tokenizers_own_length_is_never_the_context() -> None:
    app = fake_sglang_app(ToyModel(), context_size=CONTEXT_SIZE, tokenizer_max_length=512)
    async with serving(app) as target:
        assert await target.prompt_ids({"messages": MESSAGES}, CHAT) == (CHAT_IDS, CONTEXT_SIZE)


async def test_an_unknown_context_is_an_upstream_error_not_a_guess() -> None:
    async with serving(fake_sglang_app(ToyModel(), release=Release(models_card_length=False))) as target:
        with pytest.raises(UpstreamUnavailableError, match="context length is unknown"):
            await target.prompt_ids({"prompt": [1, 2]}, COMPLETION)


def request(kind: str, **fields: Any) -> Any:
    body = {"model": "m", **({"messages": MESSAGES} if kind == CHAT else {"prompt": "Paris"}), **fields}
    return parse_generation_request(body, kind)


@pytest.mark.parametrize(("app", "parsed", "problem"), [
    (lambda: fake_sglang_app(ToyModel()), request(CHAT), None),
    (lambda: fake_sglang_app(ToyModel(), release=OLDEST), request(CHAT), "takes no chat messages"),
    (lambda: fake_sglang_app(ToyModel(), release=OLDEST), request(COMPLETION), None),
    (lambda: fake_sglang_app(ToyModel(), release=MIDDLE, tokenizer_max_length=PLACEHOLDER), request(COMPLETION),
     "fails"),
    (lambda: fake_sglang_app(ToyModel(), release=MIDDLE, tokenizer_max_length=PLACEHOLDER),
     request(COMPLETION, prompt=[1, 2]), None),  # token ids need no tokenizer
    (lambda: fake_sglang_app(ToyModel(), release=Release(models_card_length=False)), request(COMPLETION),
     "context length is unknown"),
])
async def test_prompt_problem(app: Callable[[], web.Application], parsed: Any, problem: str | None) -> None:
    async with serving(app()) as target:
        assert target.prompt_problem(parsed) is None  # not probed yet: prompt_ids will probe
        await target.probe()
        found = target.prompt_problem(parsed)
    assert found is None if problem is None else problem in found


# Exactness and the sampler order.


@pytest.mark.parametrize(("app", "exact", "order"), [
    (lambda: fake_sglang_app(ToyModel()), False, SamplerOrder.TEMPERATURE_THEN_JOINT_TRUNCATE),
    (verifier_info_app, True, SamplerOrder.TRUNCATE_THEN_TEMPERATURE),
    (web.Application, False, SamplerOrder.TEMPERATURE_THEN_JOINT_TRUNCATE),  # no model info at all
], ids=["stock sglang", "our verifier", "no model info"])
async def test_probe_learns_the_extension_and_the_sampler_order(app: Callable[[], web.Application], exact: bool,
                                                                order: SamplerOrder) -> None:
    async with serving(app()) as target:
        await target.probe()
    assert (target.exact_support, target.order) == (exact, order)


@pytest.mark.parametrize(("app", "params", "problem"), [
    (fake_sglang_app, SamplingParams(temperature=0.0), None),
    (fake_sglang_app, SamplingParams(temperature=5e-7), None),  # greedy for SGLang and for us
    (fake_sglang_app, SamplingParams(temperature=5e-6), "from 1e-06"),  # SGLang samples, we would not
    (fake_sglang_app, SamplingParams(temperature=1.0), "top_k in 1..5"),
    (fake_sglang_app, SamplingParams(temperature=0.7, top_k=5), None),
    (fake_sglang_app, SamplingParams(temperature=0.7, top_k=6), "top_k in 1..5"),
    (fake_sglang_app, SamplingParams(temperature=0.7, top_k=5, top_p=0.9), "joint top_p"),
    (fake_sglang_app, SamplingParams(temperature=1.0, top_k=5, top_p=0.9), "joint top_p"),  # at T = 1 too
    (fake_sglang_app, SamplingParams(temperature=0.0, top_p=0.0), "top_p in (0, 1]"),  # SGLang refuses it
    (lambda model: verifier_info_app(), SamplingParams(temperature=1.0), None),  # exact residual draws
    (lambda model: verifier_info_app(), SamplingParams(temperature=0.7, top_p=0.9, min_p=0.1), None),
    (lambda model: verifier_info_app(), SamplingParams(temperature=0.7, top_p=0.0), "top_p in (0, 1]"),
])
async def test_exactness_problem(app: Callable[[ToyModel], web.Application], params: SamplingParams,
                                 problem: str | None) -> None:
    async with serving(app(ToyModel())) as target:
        await target.probe()
        found = target.exactness_problem(params, TOP_N)
    assert found is None if problem is None else problem in found
