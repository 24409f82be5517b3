"""SGLang's server arguments as its /server_info publishes them: requests the server would answer otherwise than
rounds over /generate (its model's generation_config defaults, a reasoning or tool parser, a LoRA adapter) pass
through, with the reason; a fake SGLang built from its sources (server_args.py, configs/model_config.py,
entrypoints/openai/serving_base.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from proxy.admission import RouteSnapshot, passthrough_reason
from proxy.config.speculation import SpeculationConfig
from proxy.targets.sglang import SGLangTarget
from proxy.targets.sglang_args import ServerArgs
from proxy.wire.control import RequestControl
from proxy.wire.request import CHAT, COMPLETION, parse_generation_request
from tests.fakes.sglang import SERVED_NAME, fake_sglang_app
from tests.fakes.toy_model import ToyModel
from tests.unit.targets.serving import serving

# The arguments of a stock `python -m sglang.launch_server --reasoning-parser deepseek-r1`, as server_info lists them.
STOCK = {"reasoning_parser": "deepseek-r1", "tool_call_parser": None, "sampling_defaults": "model",
         "preferred_sampling_params": None, "enable_lora": None, "lora_paths": None}
MESSAGES = [{"role": "user", "content": "hi"}]
NAMED = {"temperature": 0.7, "top_k": 20, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]


@asynccontextmanager
async def probed(**server_args: Any) -> AsyncIterator[SGLangTarget]:
    async with serving(fake_sglang_app(ToyModel(), **server_args)) as target:
        await target.probe()
        yield target


def reason(target: SGLangTarget, body: dict[str, Any], kind: str = CHAT) -> str | None:
    route = RouteSnapshot(SpeculationConfig(), True, target, vocabulary_size=None)
    fields = {"messages": MESSAGES} if kind == CHAT else {"prompt": [5, 6, 7]}
    request = parse_generation_request({"model": SERVED_NAME, **fields, **body}, kind)  # type: ignore[arg-type]
    return passthrough_reason(route, target.with_defaults(request), RequestControl())


def test_the_arguments_are_read_as_server_info_publishes_them() -> None:
    args = ServerArgs.read({**STOCK, "preferred_sampling_params": '{"temperature": 0.5}', "version": "0.5.23"})
    assert args == ServerArgs("model", frozenset({"temperature"}), "deepseek-r1", None, published=True)
    assert ServerArgs.read({"version": "0.1.0", "context_length": 4096}) == ServerArgs()  # ours: nothing shapes it
    assert ServerArgs.read({**STOCK, "preferred_sampling_params": "{not json"}).preferred == frozenset()


@pytest.mark.parametrize(("body", "passes"), [
    ({}, "server: the server fills repetition_penalty, temperature, top_k, top_p, min_p from the model's "
         "generation_config"),
    ({"temperature": 0}, "server: the server fills repetition_penalty from"),  # truncation is off at temperature 0
    ({"temperature": 0, "repetition_penalty": 1.0}, None),
    (NAMED, None),
])
async def test_model_defaults_the_server_does_not_publish_pass_through(body: dict, passes: str | None) -> None:
    async with probed(sampling_defaults="model") as target:
        why = reason(target, body)
    assert (why is None) == (passes is None) and (why or "").startswith(passes or ""), why


async def test_the_protocols_defaults_are_the_proxys() -> None:
    async with probed(sampling_defaults="openai") as target:
        assert reason(target, {"temperature": 0}) is None


async def test_preferred_sampling_params_reach_every_request() -> None:
    async with probed(preferred_sampling_params='{"repetition_penalty": 1.1}') as target:
        why = reason(target, NAMED)
    assert (why or "").startswith("server: the server's --preferred-sampling-params (repetition_penalty)")


async def test_a_reasoning_parser_sends_chat_requests_through() -> None:
    async with probed(reasoning_parser="deepseek-r1") as target:
        assert (reason(target, NAMED) or "").startswith("server: the server parts reasoning from the answer")
        assert reason(target, NAMED, COMPLETION) is None  # completions are not parsed


@pytest.mark.parametrize(("parser", "passes"), [(None, True), ("qwen25", False)])
async def test_tools_pass_through_where_the_server_parses_no_tool_calls(parser: str | None, passes: bool) -> None:
    async with probed(tool_call_parser=parser) as target:
        why = reason(target, {**NAMED, "tools": TOOLS})
    assert ("parses no tool calls" in (why or "")) == passes, why


async def test_a_model_naming_a_lora_adapter_passes_through() -> None:
    async with probed(enable_lora=True, lora_paths=["sql=/adapters/sql"]) as target:
        assert (reason(target, {**NAMED, "model": f"{SERVED_NAME}:sql"}) or "").startswith(
            f"server: model '{SERVED_NAME}:sql' names a LoRA adapter")
        assert reason(target, NAMED) is None


async def test_check_says_what_the_arguments_mean() -> None:
    async with probed(**STOCK) as target:
        rows = dict(target.info.lines()) if target.info is not None else {}
    assert rows["sampling defaults"].startswith("the model's generation_config (--sampling-defaults model)")
    assert rows["chat answers"] == ("--reasoning-parser deepseek-r1: chat requests pass through; "
                                    "no --tool-call-parser: chat requests with tools pass through")
