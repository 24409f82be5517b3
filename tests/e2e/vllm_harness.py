"""A real vLLM serving SmolLM2-135M, from the outside: stopping it, and its own greedy answers to compare ours with."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests import support as http

MODEL = "smollm2-135m"  # the name scripts/start_vllm.sh serves it under
STOP_TIMEOUT_S = 30.0
LOGPROB_TOLERANCE = 1e-3  # batched prompt scoring vs one-token decoding, float32: about 5e-5 measured
TOP_N = 5


def stop_group(pid_file: Path) -> None:
    """Terminate the server's process group (the script made it one), then kill what is left."""
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + STOP_TIMEOUT_S
    try:
        os.killpg(pid, signal.SIGTERM)
        while time.monotonic() < deadline:
            os.killpg(pid, 0)
            time.sleep(0.5)
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def greedy(url: str, prompt: list[int], max_tokens: int,
           top_n: int = TOP_N) -> tuple[list[int], list[dict[int, float]]]:
    """vLLM's own greedy tokens and, per step, its top logprobs by id."""
    reply = http.post_json(url + "/v1/completions", {
        "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
        "logprobs": top_n, "return_token_ids": True, "return_tokens_as_token_ids": True})
    assert reply.status == 200, reply.body
    choice = reply.json()["choices"][0]
    tops = [{int(key.removeprefix("token_id:")): value for key, value in step.items()}
            for step in choice["logprobs"]["top_logprobs"]]
    return choice["token_ids"], tops


def assert_same_position(scored: Any, generated: int, generated_top: dict[int, float]) -> None:
    """Our parse of one position agrees with what vLLM's generation saw there.

    vLLM scores a prompt in one batched pass and generates one token at a time: logprobs agree within
    LOGPROB_TOLERANCE, and an argmax may differ only where the top two are that close.
    """
    top = dict(zip(scored.top_ids.tolist(), scored.top_logprobs.tolist(), strict=True))
    if scored.argmax != generated:
        margin = abs(top[scored.argmax] - generated_top[generated])
        assert margin < LOGPROB_TOLERANCE, f"argmax {scored.argmax} vs generated {generated}, margin {margin}"
    assert len(top) == TOP_N
    best_generated = sorted(generated_top.values(), reverse=True)[:TOP_N]
    assert sorted(top.values(), reverse=True) == pytest.approx(best_generated, abs=LOGPROB_TOLERANCE)
    for token, logprob in top.items():
        if token in generated_top:
            assert logprob == pytest.approx(generated_top[token], abs=LOGPROB_TOLERANCE)


def divergence_margin(url: str, prompt_ids: list[int], expected: list[int], actual_text: str) -> tuple[int, float]:
    """The first of vLLM's tokens the proxy's text lacks, and vLLM's top-two margin there."""
    index = 0
    while index < len(expected):
        text = http.post_json(url + "/detokenize", {"model": MODEL, "tokens": expected[: index + 1]}).json()["prompt"]
        if not actual_text.startswith(text):
            break
        index += 1
    _, tops = greedy(url, prompt_ids + expected[:index], 1, top_n=2)
    first, second = sorted(tops[0].values(), reverse=True)[:2]
    return index, first - second
