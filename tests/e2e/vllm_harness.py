"""A real vLLM serving SmolLM2-135M, from the outside: stopping it, and its own greedy answers to compare ours with."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from proxy.models import fetch as models
from tests import support as http
from tests.e2e.servers import APART, REPO, Process, free_port, start_proxy

MODEL = "smollm2-135m"  # the name scripts/start_vllm.sh serves it under
SETUP_AND_START_TIMEOUT_S = 1800  # first run: install (about 3 min), convert (30 s), start (about 40 s)
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


@contextmanager
def served_vllm(log_dir: Path, model: str = MODEL, *arguments: str, folder: Path | None = None) -> Iterator[str]:
    """The URL of a vLLM that scripts/start_vllm.sh sets up and starts serving `model` (with `arguments`; from
    `folder` instead of the converted one when given), stopped on leaving."""
    port = free_port()
    started = time.monotonic()
    pid_file = log_dir / f"vllm-{port}.pid"
    env = {**os.environ, "SPECULOOS_VLLM_LOG_DIR": str(log_dir), "SPECULOOS_VLLM_MODEL": model}
    if folder is not None:
        env["SPECULOOS_VLLM_MODEL_DIR"] = str(folder)
    try:
        result = subprocess.run([str(REPO / "scripts" / "start_vllm.sh"), str(port), *arguments], cwd=REPO,
                                capture_output=True, text=True, timeout=SETUP_AND_START_TIMEOUT_S, env=env)
        assert result.returncode == 0, f"scripts/start_vllm.sh failed:\n{result.stderr[-5000:]}"
        print(f"vLLM ({model}) set up and started in {time.monotonic() - started:.0f} s")
        yield result.stdout.strip().splitlines()[-1]
    finally:
        if pid_file.exists():
            stop_group(pid_file)


def changed_model_folder(folder: Path, changes: dict[str, dict[str, Any]]) -> Path:
    """SmolLM2's folder as scripts/setup_vllm.sh converts it, with keys of its JSON files changed (`changes`, by
    file name): links to every other file."""
    converted = subprocess.run([str(REPO / "scripts" / "setup_vllm.sh")], cwd=REPO, capture_output=True, text=True,
                               check=True, env={**os.environ, "SPECULOOS_VLLM_MODEL": MODEL})
    source = Path(converted.stdout.strip().splitlines()[-1])
    folder.mkdir(exist_ok=True)
    for path in source.iterdir():
        if path.name not in changes and not (folder / path.name).exists():
            (folder / path.name).symlink_to(path)
    for name, keys in changes.items():
        (folder / name).write_text(json.dumps({**json.loads((source / name).read_text()), **keys}, indent=2))
    return folder


def start_vllm_proxy(vllm_url: str, draft: str, log_dir: Path, name: str) -> Process:
    """The proxy with one route, `name`, whose upstream is the vLLM; `draft`'s GGUF drafts, on one thread of its own."""
    models.fetch([draft])
    routes = log_dir / f"{name}-routes.yaml"
    routes.write_text(
        "routes:\n"
        f"  - name: {name}\n"
        "    match: {model: \"*\"}\n"
        f"    upstream: {{url: \"{vllm_url}\", protocol: vllm}}\n"
        f"    draft: {{model: {draft}, threads: 1, ctx: 4096, {APART}}}\n"
        "    speculation: {k: 4}\n"
    )
    return start_proxy(routes, log_dir)


def greedy(url: str, prompt: list[int], max_tokens: int, top_n: int = TOP_N,
           model: str = MODEL) -> tuple[list[int], list[dict[int, float]]]:
    """vLLM's own greedy tokens and, per step, its top logprobs by id."""
    reply = http.post_json(url + "/v1/completions", {
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
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


def divergence_margin(url: str, prompt_ids: list[int], expected: list[int], actual_text: str,
                      model: str = MODEL) -> tuple[int, float]:
    """The first of vLLM's tokens the proxy's text lacks, and vLLM's top-two margin there."""
    index = 0
    while index < len(expected):
        text = http.post_json(url + "/detokenize", {"model": model, "tokens": expected[: index + 1]}).json()["prompt"]
        if not actual_text.startswith(text):
            break
        index += 1
    _, tops = greedy(url, prompt_ids + expected[:index], 1, top_n=2, model=model)
    first, second = sorted(tops[0].values(), reverse=True)[:2]
    return index, first - second


def chat_logprobs(url: str, messages: list[dict], *, stream: bool,
                  headers: dict[str, str] | None = None) -> tuple[str, list[dict]]:
    """A greedy chat answer's mode and its log-prob entries (top 3 each), streamed or whole."""
    body = {"model": MODEL, "messages": messages, "max_tokens": 16, "temperature": 0, "logprobs": True,
            "top_logprobs": 3, "stream": stream}
    reply = http.post_json(url + "/v1/chat/completions", body, headers=headers, timeout=300)
    assert reply.status == 200, reply.body
    mode = reply.headers.get("x-speculoos-mode", "")  # the reply names headers in lower case
    if not stream:
        return mode, reply.json()["choices"][0]["logprobs"]["content"]
    choices = [event["choices"][0] for event in http.sse_events(reply.body) if event != "[DONE]" and event["choices"]]
    return mode, [entry for choice in choices if choice.get("logprobs") for entry in choice["logprobs"]["content"]]
