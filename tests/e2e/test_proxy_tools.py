"""Chat requests with tools speculate, and answer the tool calls the target itself answers.

The Qwen pair behind the real verifier: Qwen2.5-Coder's template renders tools and asks for Hermes
`<tool_call>` blocks. Each case is sent through the proxy speculatively (`X-Speculoos: on`) and passed
through to the verifier's own chat endpoint (`X-Speculoos: off`), streamed and not, with the openai SDK
and with LangChain; the content, the calls' names and arguments and the finish reason must agree. (These Q4
Coder models write their calls as JSON in code blocks, not in tags: reading calls is tested in
tests/unit/wire/test_tools.py.)
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.e2e.proxy_harness import log_events
from tests.e2e.servers import Process
from tests.e2e.tool_calls import CASES, MAX_TOKENS, OFF, ON, TOOLS, answer


@pytest.fixture(scope="module")
def clients(qwen_proxy: Process) -> dict[str, openai.OpenAI]:
    """The openai SDK through the proxy, speculating and passing through."""
    return {name: openai.OpenAI(base_url=qwen_proxy.url + "/v1", api_key="unused", max_retries=0,
                                default_headers=headers) for name, headers in (("on", ON), ("off", OFF))}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_requests_with_tools_speculate_and_answer_as_the_target(clients: dict[str, openai.OpenAI], case: str) -> None:
    expected = answer(clients["off"], CASES[case], stream=False)
    assert expected[3] == "passthrough"
    for stream in (False, True):
        actual = answer(clients["on"], CASES[case], stream=stream)
        assert actual[3] == "speculative", "tools speculate"
        assert actual[:3] == expected[:3], f"stream={stream}"
    print(f"{case}: {expected[:3]}")


@pytest.mark.slow
def test_tool_choice_none_speculates_and_answers_content(clients: dict[str, openai.OpenAI]) -> None:
    messages = CASES["one call"]
    expected = answer(clients["off"], messages, stream=False, tool_choice="none")
    actual = answer(clients["on"], messages, stream=True, tool_choice="none")
    assert actual[3] == "speculative" and actual[:3] == expected[:3] and not actual[1]


def test_a_forced_tool_choice_passes_through(clients: dict[str, openai.OpenAI]) -> None:
    """Only the upstream can force a call: the request goes to it, and our verifier refuses it with its reason."""
    with pytest.raises(openai.BadRequestError, match="tool_choice") as refused:
        clients["on"].chat.completions.create(model="test", messages=CASES["one call"], tools=TOOLS,
                                              tool_choice="required", max_tokens=8)
    assert refused.value.response.headers["x-speculoos-mode"] == "passthrough"


def test_a_template_without_tool_calls_passes_through(smol_proxy: Process) -> None:
    """SmolLM2's template renders no tools: the proxy cannot read calls from its answer and passes it through."""
    client = openai.OpenAI(base_url=smol_proxy.url + "/v1", api_key="unused", max_retries=0, default_headers=ON)
    raw = client.chat.completions.with_raw_response.create(model="test", messages=CASES["one call"], tools=TOOLS,
                                                           max_tokens=8, temperature=0)
    assert raw.headers["x-speculoos-mode"] == "passthrough"
    # The request's log line follows its response: wait for it.
    assert log_events(smol_proxy, lambda event: "without a <tool_call> format" in str(event.get("reason")), 1)


@pytest.mark.slow
def test_langchain_bind_tools(qwen_proxy: Process) -> None:
    """LangChain's ChatOpenAI with bound tools reads the same answer, whole and streamed, as from the target."""
    from langchain_openai import ChatOpenAI

    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return "sunny"

    modes: list[str] = []

    def model(headers: dict[str, str]) -> Any:
        client = httpx.Client(event_hooks={"response": [lambda r: modes.append(r.headers["x-speculoos-mode"])]})
        return ChatOpenAI(base_url=qwen_proxy.url + "/v1", api_key="unused", model="test", temperature=0,
                          max_tokens=MAX_TOKENS, max_retries=0, default_headers=headers,
                          http_client=client).bind_tools([get_weather])

    question = "What is the weather in Paris right now?"
    expected = model(OFF).invoke(question)
    whole = model(ON).invoke(question)
    chunks = list(model(ON).stream(question))
    streamed = chunks[0]
    for chunk in chunks[1:]:
        streamed += chunk
    calls = [(c["name"], c["args"]) for c in expected.tool_calls]
    assert [(c["name"], c["args"]) for c in whole.tool_calls] == calls
    assert [(c["name"], c["args"]) for c in streamed.tool_calls] == calls
    assert whole.content == streamed.content == expected.content
    assert whole.response_metadata["finish_reason"] == expected.response_metadata["finish_reason"]
    assert modes == ["passthrough", "speculative", "speculative"]
