"""VLLMTarget in front of a vLLM with its prefix cache on and `--enable-scale-out`: rounds of one token per prefix,
the server's sampling defaults, and what `speculoos check` says; answers captured from a real vLLM (data/)."""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from proxy.config.load import parse_config
from proxy.errors import UpstreamUnavailableError
from proxy.sampling.processors import SamplingParams
from proxy.server.cli import check_report
from proxy.targets.vllm import VLLMTarget
from proxy.targets.vllm_answers import parse_prefix_tokens
from proxy.targets.vllm_probe import (
    PrefixCache,
    VLLMInfo,
    defaults_problem,
    parse_prefix_cache,
    parse_sampling_defaults,
)
from proxy.targets.vllm_sampling import NEUTRAL_PENALTIES
from proxy.wire.request import CHAT, COMPLETION, parse_generation_request
from tests.fakes.drafter import ToyDrafter
from tests.fakes.toy_model import ToyModel
from tests.fakes.vllm import SEEN
from tests.fakes.vllm_scale_out import scale_out_vllm_app
from tests.unit.targets.serving import serving
from tests.unit.targets.test_vllm import shape

CAPTURED = json.loads((Path(__file__).parent / "data" / "vllm_scale_out_smollm2.json").read_text())
PREFIXES = CAPTURED["POST /v1/completions prefixes"]
# Qwen2.5 Instruct's generation_config.json.
QWEN_DEFAULTS = {"repetition_penalty": 1.05, "temperature": 0.7, "top_p": 0.8, "top_k": 20}
TOY_CONTEXT, TOY_DRAFTS = [3, 5, 7, 11, 2], [4, 6, 8]


def test_a_round_over_the_prefix_cache_reads_as_the_prompt_log_probs_round() -> None:
    """The same round, captured both ways from one vLLM: same rows, same bonus; a draft outside the top-N has no
    log-prob here."""
    prefixes = parse_prefix_tokens(PREFIXES["body"], CAPTURED["draft_tokens"], CAPTURED["top_n"])
    assert [p.top_ids.tolist() for p in prefixes.positions] == [[7042, 260], [30, 28], [284, 527], [314, 28]]
    assert prefixes.bonus_token == 314
    assert [p.token_id for p in prefixes.positions] == [7042, 28, 4528, None]
    assert prefixes.positions[2].token_logprob is None  # " London", rank 47
    assert prefixes.positions[1].token_logprob == pytest.approx(-1.658496379852295)
    for row in (0, 1, 3):
        assert prefixes.positions[row].top_logprobs.tolist() == pytest.approx(
            [float(v) for v in PREFIXES["body"]["choices"][row]["logprobs"]["top_logprobs"][0].values()])


def mangled(change: str) -> dict[str, Any]:
    answer = copy.deepcopy(PREFIXES["body"])
    if change == "a choice missing":
        answer["choices"].pop()
    elif change == "indices repeated":
        answer["choices"][1]["index"] = 0
    elif change == "two tokens":
        answer["choices"][0]["logprobs"]["tokens"] = ["token_id:7042", "token_id:1"]
    elif change == "an id past the vocabulary":
        answer["choices"][3]["logprobs"]["top_logprobs"][0] = {"token_id:314": -0.4, "token_id:99999": -1.0}
    return answer


@pytest.mark.parametrize("change", ["a choice missing", "indices repeated", "two tokens",
                                    "an id past the vocabulary"])
def test_a_malformed_round_is_refused(change: str) -> None:
    with pytest.raises(UpstreamUnavailableError):
        parse_prefix_tokens(mangled(change), CAPTURED["draft_tokens"], CAPTURED["top_n"], vocab_size=49152)


def test_the_captured_metrics_and_render() -> None:
    assert parse_prefix_cache(CAPTURED["GET /metrics cache_config_info"]) == PrefixCache(True, 128)
    assert parse_prefix_cache("vllm:num_requests_running 0.0\n") is None
    defaults = parse_sampling_defaults(CAPTURED["POST /v1/completions/render"]["body"])
    assert defaults_problem(defaults, {}) is None  # SmolLM2's generation_config names no sampling field


@pytest.mark.parametrize(("server", "body", "named"), [
    (QWEN_DEFAULTS, {}, []),  # temperature, truncation and the repetition penalty are followed (the request's own)
    ({"presence_penalty": 0.5, "frequency_penalty": 0.2}, {}, ["presence_penalty 0.5", "frequency_penalty 0.2"]),
    ({"presence_penalty": 0.5}, {"presence_penalty": 0}, []),  # named: the request's own value
    ({"frequency_penalty": 0.2}, {"presence_penalty": 0}, ["frequency_penalty 0.2"]),
])
def test_only_defaults_on_generated_ids_cannot_be_followed(server: dict[str, float], body: dict[str, Any],
                                                           named: list[str]) -> None:
    defaults = tuple({**dict(parse_sampling_defaults([{"sampling_params": {}}])), **server}.items())
    problem = defaults_problem(defaults, body)
    assert (problem is None) == (not named)
    assert all(field in (problem or "") for field in named), problem
    assert defaults_problem(None, {}) is None  # unknown defaults: the request is followed as it is


@asynccontextmanager
async def scale_out_vllm(**options: Any) -> AsyncIterator[tuple[VLLMTarget, list]]:
    app = scale_out_vllm_app(ToyModel(), **options)
    async with serving(app, VLLMTarget) as target:
        await target.probe()
        app[SEEN].clear()
        yield target, app[SEEN]


async def test_probe_finds_the_prefix_cache_and_the_servers_defaults() -> None:
    async with scale_out_vllm(sampling_defaults=QWEN_DEFAULTS, block_size=32) as (target, _):
        info = target.info
    assert isinstance(info, VLLMInfo) and info.rounds_read_cache and info.prefix_cache == PrefixCache(True, 32)
    assert dict(info.sampling_defaults or ())["repetition_penalty"] == 1.05
    assert target.round_cost() is None
    rows = dict(info.lines())
    assert "O(K)" in rows["rounds"] and "blocks of 32" in rows["rounds"]
    assert "repetition_penalty 1.05" in rows["sampling defaults"]


@pytest.mark.parametrize("parser", [True, False])
async def test_probe_finds_whether_chat_answers_have_their_reasoning_split_off(parser: bool) -> None:
    async with scale_out_vllm(reasoning_parser=parser) as (target, _):
        assert target.info is not None and target.info.reasoning is parser
        chat = parse_generation_request({"model": "toy", "messages": [{"role": "user", "content": "hi"}]}, CHAT)
        completion = parse_generation_request({"model": "toy", "prompt": [5, 6]}, COMPLETION)
        assert (target.answer_problem(chat) is not None) is parser
        assert target.answer_problem(completion) is None  # completions are never parsed for reasoning
        assert dict(target.info.lines())["chat answers"].startswith("a reasoning parser" if parser else "no ")


async def test_without_the_prefix_cache_rounds_re_prefill_and_check_names_the_flags() -> None:
    async with scale_out_vllm(prefix_caching=False) as (target, seen):
        verification = await target.verify(TOY_CONTEXT, TOY_DRAFTS, 2)
    assert target.round_cost() is not None
    assert [(path, "prompt_logprobs" in body) for path, body in seen] == [("POST /v1/completions", True)]
    assert len(verification.positions) == 4
    info = VLLMInfo("0.20.0", "m", 4096, 20, None, None, "this vLLM has no /v1/completions/render")
    rows = dict(info.lines())
    assert "O(context)" in rows["rounds"] and "--enable-scale-out" in rows["sampling defaults"]
    info = VLLMInfo("0.32.0", "m", 4096, 20, PrefixCache(False, 128))
    assert "--no-enable-prefix-caching" in info.rounds_line()


async def test_a_round_asks_one_token_after_each_prefix_and_scores_what_the_model_says() -> None:
    model = ToyModel()
    async with scale_out_vllm() as (target, seen):
        cold = await target.verify(TOY_CONTEXT, TOY_DRAFTS, 2)
        sent_cold = [body["prompt"] for _, body in seen]
        seen.clear()
        warm = await target.verify(TOY_CONTEXT + [9], TOY_DRAFTS, 2)
        sent_warm = [body["prompt"] for _, body in seen]
    # A context vLLM has not computed is computed once, alone; then the K prefixes. One call once it is cached.
    assert sent_cold == [[TOY_CONTEXT], [TOY_CONTEXT + TOY_DRAFTS[:n] for n in (1, 2, 3)]]
    assert sent_warm == [[TOY_CONTEXT + [9] + TOY_DRAFTS[:n] for n in range(4)]]
    assert all(body["temperature"] == 0 and body["repetition_penalty"] == 1 and "prompt_logprobs" not in body
               and "return_token_ids" not in body for _, body in seen)  # no echo of the prompts' ids
    for position, scored in enumerate(cold.positions):
        logprobs = model.log_softmax(TOY_CONTEXT + TOY_DRAFTS[:position])
        assert scored.top_ids.tolist() == np.argsort(-logprobs, kind="stable")[:2].tolist()
        assert scored.top_logprobs == pytest.approx(np.sort(logprobs)[::-1][:2])
    assert cold.bonus_token == model.greedy(TOY_CONTEXT + TOY_DRAFTS, 1)[0]
    assert len(warm.positions) == 4


async def test_plain_chunks_name_the_neutral_penalties_and_warm_the_cache() -> None:
    async with scale_out_vllm(sampling_defaults=QWEN_DEFAULTS) as (target, seen):
        tokens = await target.generate(TOY_CONTEXT, 3, SamplingParams(0.7, top_k=20, top_p=0.8), seed=1)
        await target.verify(TOY_CONTEXT + tokens, TOY_DRAFTS, 2)
    plain, round_ = seen
    assert {name: plain[1][name] for name in NEUTRAL_PENALTIES} == NEUTRAL_PENALTIES
    assert len(round_[1]["prompt"]) == len(TOY_DRAFTS) + 1  # the plain chunk's context is cached: one call


async def test_the_fake_answers_a_round_in_the_captured_shape() -> None:
    async with TestClient(TestServer(scale_out_vllm_app(ToyModel()))) as client:
        body = {**PREFIXES["request"], "model": "toy", "prompt": [TOY_CONTEXT + TOY_DRAFTS[:n] for n in range(4)]}
        response = await client.post("/v1/completions", json=body)
        assert response.status == 200
        assert shape(await response.json()) == shape(PREFIXES["body"])


@pytest.mark.parametrize(("prefix_caching", "rounds"), [(True, "O(K) tokens"), (False, "O(context) tokens")])
async def test_check_says_which_path_a_route_takes_and_its_cost(tmp_path: Path, prefix_caching: bool,
                                                               rounds: str) -> None:
    server = TestServer(scale_out_vllm_app(ToyModel(), sampling_defaults=QWEN_DEFAULTS,
                                           prefix_caching=prefix_caching))
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    (tmp_path / "toy.gguf").write_bytes(b"")
    routes = parse_config({"routes": [{"name": "toy", "upstream": {"url": url, "protocol": "vllm"},
                                       "draft": {"model": str(tmp_path / "toy.gguf")}}]})
    try:
        lines, failures = await check_report(routes, lambda options: ToyDrafter(ToyModel(seed=11)))
    finally:
        await server.close()
    found = dict(line.split("\t")[1:] for line in lines)
    assert failures == 0, lines
    assert found["rounds"].endswith(rounds) or rounds in found["rounds"], found["rounds"]
    assert found["sampling defaults"].startswith("temperature 0.7, top_p 0.8, top_k 20, repetition_penalty 1.05")
    assert found["log-probs"].startswith("raw: a repetition penalty is followed at temperature 0 only")
    assert found["chat answers"] == "no reasoning parser"
