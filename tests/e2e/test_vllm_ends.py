"""What a real vLLM decides about its own answers (`pytest -m vllm`): where they end, and whether chat answers have
their reasoning split off; the proxy's answers follow, speculated or passed through.

The model folder is SmolLM2-135M's with the ends of a base model: the tokenizer's EOS and the generation
config's `eos_token_id` are `<|endoftext|>`, so vLLM goes on past `<|im_end|>`, where the draft's GGUF stops.
A ChatML-shaped completion prompt makes the model write `<|im_end|>` and go on. The server is started with a
reasoning parser (Granite's, the one that needs no special tokens), which never touches completions; chat requests
pass through, since a parser may move any part of an answer to `reasoning`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import support as http
from tests.e2e.proxy_harness import log_events
from tests.e2e.servers import SMOL, Process
from tests.e2e.vllm_harness import MODEL, changed_model_folder, served_vllm, start_vllm_proxy

pytestmark = pytest.mark.vllm

END_OF_TEXT, IM_END = 0, 2  # SmolLM2's ids
PROMPT = "<|im_start|>user\nWhat is 2+2? Answer with a number.<|im_end|>\n<|im_start|>assistant\n"
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def base_vllm(log_dir: Path) -> Iterator[str]:
    folder = changed_model_folder(log_dir / "smollm2-base-ends", {
        "config.json": {"eos_token_id": END_OF_TEXT}, "generation_config.json": {"eos_token_id": END_OF_TEXT},
        "tokenizer_config.json": {"eos_token": "<|endoftext|>"}})
    with served_vllm(log_dir, MODEL, "--reasoning-parser", "granite", folder=folder) as url:
        yield url


@pytest.fixture(scope="module")
def base_proxy(base_vllm: str, log_dir: Path) -> Iterator[Process]:
    process = start_vllm_proxy(base_vllm, SMOL, log_dir, "base")
    yield process
    process.stop()


def complete(url: str, headers: dict[str, str] | None = None, **extra: object) -> tuple[dict, str | None]:
    reply = http.post_json(url + "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": MAX_TOKENS,
                                                     "temperature": 0, **extra}, headers or {})
    assert reply.status == 200, reply.body[:500]
    return reply.json(), reply.headers.get("x-speculoos-mode")


def test_vllm_goes_on_past_im_end_here(base_vllm: str) -> None:
    """The premise: vLLM's own answer holds <|im_end|> and goes on (the draft's GGUF would stop there)."""
    direct, _ = complete(base_vllm, return_token_ids=True)
    ids = direct["choices"][0]["token_ids"]
    assert IM_END in ids and ids.index(IM_END) < len(ids) - 1, ids


@pytest.mark.parametrize(("control", "mode"), [("k=4", "speculative"), ("off", "passthrough")])
def test_the_answer_ends_where_vllm_ends_it(base_vllm: str, base_proxy: Process, control: str, mode: str) -> None:
    direct, _ = complete(base_vllm)
    through, served_as = complete(base_proxy.url, {"X-Speculoos": control})
    assert served_as == mode, base_proxy.log()[-3000:]
    expected, actual = direct["choices"][0], through["choices"][0]
    assert (actual["text"], actual["finish_reason"]) == (expected["text"], expected["finish_reason"])
    assert through["usage"]["completion_tokens"] == direct["usage"]["completion_tokens"]


def test_chat_answers_pass_through_where_vllm_parses_their_reasoning(base_vllm: str, base_proxy: Process) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "What is 2+2?"}], "max_tokens": 8,
            "temperature": 0}
    direct = http.post_json(base_vllm + "/v1/chat/completions", body)
    assert direct.json()["usage"]["completion_tokens_details"] is not None  # the premise: it counts reasoning
    through = http.post_json(base_proxy.url + "/v1/chat/completions", body, {"X-Speculoos": "on"})
    assert through.headers.get("x-speculoos-mode") == "passthrough", base_proxy.log()[-3000:]
    reasons = [event["reason"] for event in log_events(base_proxy, lambda event: event.get("kind") == "chat",
                                                        at_least=1)]  # the request's line follows its answer
    assert any("the server parts reasoning from chat answers" in reason for reason in reasons), reasons
    assert through.json()["choices"][0]["message"] == direct.json()["choices"][0]["message"]
