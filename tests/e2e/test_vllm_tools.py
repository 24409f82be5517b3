"""Chat requests with tools through the proxy in front of a real vLLM that parses Hermes tool calls (`pytest -m vllm`).

vLLM serves Qwen2.5-Coder-0.5B-Instruct (float32, from the same GGUF the proxy drafts with) started with
`--enable-auto-tool-choice --tool-call-parser hermes`, the way a Qwen deployment is run. The proxy tokenizes each
request with its tools through vLLM's /tokenize, speculates, and reads calls out of the text itself; the answer
(content, calls' names and arguments, finish reason), streamed and not, must be vLLM's own. This model writes its
calls as JSON without the <tool_call> tags (its greedy answers here never start one: the tag's token is not in
its top 5), so both sides answer content; reading tagged calls is tested against vLLM's documented shapes in
tests/unit/wire/test_tools.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests import support as http
from tests.e2e.servers import DRAFT_QWEN, Process
from tests.e2e.tool_calls import CASES, MAX_TOKENS, ON, TOOLS, answer
from tests.e2e.vllm_harness import LOGPROB_TOLERANCE, divergence_margin, served_vllm, start_vllm_proxy

pytestmark = pytest.mark.vllm

MODEL = DRAFT_QWEN  # the name scripts/start_vllm.sh serves it under


@pytest.fixture(scope="module")
def qwen_vllm(log_dir: Path) -> Iterator[str]:
    """A vLLM serving Qwen2.5-Coder-0.5B with Hermes tool-call parsing."""
    with served_vllm(log_dir, MODEL, "--enable-auto-tool-choice", "--tool-call-parser", "hermes") as url:
        yield url


@pytest.fixture(scope="module")
def tools_proxy(qwen_vllm: str, log_dir: Path) -> Iterator[Process]:
    """The proxy with one vLLM route, the same model's Q4 GGUF as the draft."""
    process = start_vllm_proxy(qwen_vllm, DRAFT_QWEN, log_dir, "vllm-tools")
    yield process
    process.stop()


def assert_same_answer(actual: tuple, expected: tuple, vllm_url: str, messages: list[dict], **extra: object) -> None:
    """The proxy's answer is vLLM's, or differs first where vLLM's own top two tokens are tied within its noise."""
    if actual[:3] == expected[:3]:
        return
    direct = http.post_json(vllm_url + "/v1/chat/completions", {
        "model": MODEL, "messages": messages, "tools": TOOLS, "max_tokens": MAX_TOKENS, "temperature": 0,
        "return_token_ids": True, **extra}).json()
    index, margin = divergence_margin(vllm_url, direct["prompt_token_ids"], direct["choices"][0]["token_ids"],
                                      actual[0], model=MODEL)
    assert margin < LOGPROB_TOLERANCE, f"diverged at token {index} (margin {margin:.4f}):\n{expected}\n{actual}"


@pytest.mark.parametrize("case", list(CASES))
def test_requests_with_tools_speculate_and_answer_as_vllm(tools_proxy: Process, qwen_vllm: str, case: str) -> None:
    vllm = openai.OpenAI(base_url=qwen_vllm + "/v1", api_key="unused", max_retries=0)
    proxy = openai.OpenAI(base_url=tools_proxy.url + "/v1", api_key="unused", max_retries=0, default_headers=ON)
    for stream in (False, True):
        expected = answer(vllm, CASES[case], stream=stream, model=MODEL)
        actual = answer(proxy, CASES[case], stream=stream, model=MODEL)
        assert actual[3] == "speculative", f"not speculating:\n{tools_proxy.log()[-3000:]}"
        assert_same_answer(actual, expected, qwen_vllm, CASES[case])
        print(f"{case}, stream={stream}: {expected[:3]}")


def test_tool_choice_none_speculates_and_answers_as_vllm(tools_proxy: Process, qwen_vllm: str) -> None:
    messages = CASES["one call"]
    vllm = openai.OpenAI(base_url=qwen_vllm + "/v1", api_key="unused", max_retries=0)
    proxy = openai.OpenAI(base_url=tools_proxy.url + "/v1", api_key="unused", max_retries=0, default_headers=ON)
    expected = answer(vllm, messages, stream=True, model=MODEL, tool_choice="none")
    actual = answer(proxy, messages, stream=True, model=MODEL, tool_choice="none")
    assert actual[3] == "speculative" and not actual[1]
    assert_same_answer(actual, expected, qwen_vllm, messages, tool_choice="none")


def test_a_required_tool_call_passes_through_to_vllm(tools_proxy: Process) -> None:
    """Only vLLM can force a call (its guided decoding): the request goes to it, and it answers with a call."""
    proxy = openai.OpenAI(base_url=tools_proxy.url + "/v1", api_key="unused", max_retries=0, default_headers=ON)
    content, calls, finish, mode = answer(proxy, CASES["one call"], stream=False, model=MODEL, tool_choice="required")
    assert mode == "passthrough"
    assert calls and calls[0][0] in {"get_weather", "write_file"}, (content, calls, finish)
