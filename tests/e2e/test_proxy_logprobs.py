"""Requests that ask for log-probs speculate and carry the target's own, as plain decoding on the target gives them.

Real models: the session's `smol_proxy` (SmolLM2 drafting for itself in front of the real verifier).
The verifier's OpenAI endpoints answer no log-probs, so the references are direct calls to it: the
target decoding the prompt plainly through /generate (one token per forward pass, as a server
decodes), and the same tokens scored in one batch. llama.cpp's quantized kernels change with the
batch shape: on SmolLM2 (q4_1) the two references differ by up to about 0.4 nat, and the proxy's
log-probs (from rounds, which evaluate a batch, and plain chunks, which evaluate one token at a
time) each agree with one of them to a few 1e-2 nat (rounds of other batch sizes). TOLERANCE, 5e-2
nat around either, keeps a log-prob read at the wrong position or of a tempered distribution (off by
tenths of a nat or whole nats) out. Top tokens are compared in order except within a near tie the
batch shape may swap, and the answers only up to the first near tie of the greedy path itself.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from tests import support as http
from tests.e2e.greedy import detokenize, tokenize
from tests.e2e.proxy_harness import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    MODE_HEADER,
    PASS,
    SPECULATE,
    assert_served,
    log_events,
)
from tests.e2e.servers import Process

TOLERANCE = 5e-2  # nats, around either reference: above the noise between batches of different sizes
MIN_COMPARED = 4  # tokens before the first near tie: these prompts have none that early
ASK = [{"role": "user", "content": "List the numbers from one to twelve in digits, separated by commas."}]
GREEDY_CHAT = {"model": "test", "temperature": 0, "max_tokens": 24, "messages": ASK}
PROMPT = "fruits = [\"apple\", \"banana\","
GREEDY_COMPLETION = {"model": "test", "temperature": 0, "max_tokens": 16, "prompt": PROMPT}


def plain_decoding(verifier: Process, prompt_ids: list[int], max_new: int, top_n: int) -> list[dict[str, Any]]:
    """The target's own greedy tokens from the prompt, each with its log-prob and top-n as plain decoding and as one
    batch compute them: {id, logprob: (plain, batch), top: [(id, plain, batch)]}; top ids as plain decoding ranks."""
    reply = http.post_json(verifier.url + "/generate", {
        "input_ids": prompt_ids, "sampling_params": {"max_new_tokens": max_new, "temperature": 0},
        "return_logprob": True, "top_logprobs_num": top_n})
    assert reply.status == 200, reply.body
    meta = reply.json()["meta_info"]
    tokens = [token for _, token, _ in meta["output_token_logprobs"]]
    batch = http.post_json(verifier.url + "/generate", {
        "input_ids": prompt_ids + tokens, "sampling_params": {"max_new_tokens": 0, "temperature": 0},
        "return_logprob": True, "logprob_start_len": len(prompt_ids) - 1, "top_logprobs_num": 50}).json()["meta_info"]
    rows = [{t: lp for lp, t, _ in top} for top in batch["input_top_logprobs"][1:]]
    return [{"id": token, "logprob": (logprob, row.get(token, -math.inf)),
             "top": [(t, lp, row.get(t, -math.inf)) for lp, t, _ in top]}
            for (logprob, token, _), top, row in zip(meta["output_token_logprobs"], meta["output_top_logprobs"], rows,
                                                     strict=True)]


def near(value: float, references: tuple[float, ...]) -> bool:
    """Within the tolerance of one of the references."""
    return any(abs(value - reference) <= TOLERANCE for reference in references)


def assert_top_matches(got: list[tuple[str, float]], want: list[tuple[str, float, float]]) -> None:
    """The top n (want: the reference's n + 1) with log-probs near the references; tokens in the same order except
    within a near tie (the references' noise apart)."""
    assert len(got) == len(want) - 1
    noise = max(abs(plain - batch) for _, plain, batch in want) + TOLERANCE
    assert all(near(lp, (plain, batch)) for (_, lp), (_, plain, batch) in zip(got, want, strict=False)) or \
        sorted(lp for _, lp in got) != [lp for _, lp in got], (got, want)
    for index, ((token, _), (expected, plain, _)) in enumerate(zip(got, want, strict=False)):
        tied = any(abs(plain - other) <= 2 * noise for j, (_, other, _) in enumerate(want) if j != index)
        assert tied or token == expected, (index, got, want)


def chat_entries(smol_proxy: Process, body: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """A speculative chat answer's text and log-prob entries, streamed or whole."""
    reply = http.post_json(smol_proxy.url + CHAT_PATH, body, headers=SPECULATE, timeout=120)
    assert_served(reply, "speculative")
    if not body.get("stream"):
        choice = reply.json()["choices"][0]
        return choice["message"]["content"], choice["logprobs"]["content"]
    choices = [event["choices"][0] for event in http.sse_events(reply.body) if event != "[DONE]" and event["choices"]]
    text = "".join(choice["delta"].get("content") or "" for choice in choices)
    return text, [entry for choice in choices if choice["logprobs"] for entry in choice["logprobs"]["content"]]


def compared(tokens: list[str], reference: list[dict[str, Any]], verifier: Process) -> int:
    """How many tokens to compare: those before the first near tie of the reference's top two, where the answer may
    take another token (of the same text, or of another text, which it may then only do there)."""
    for index, (token, want) in enumerate(zip(tokens, reference, strict=False)):
        (_, *first), (_, *second) = want["top"][:2]
        noise = abs(first[0] - first[1]) + abs(second[0] - second[1])  # how far the references move the margin
        if min(first) - max(second) <= noise + 2 * TOLERANCE:
            return index
        assert token == detokenize(verifier.url, [want["id"]]), (index, token, want)
    assert len(tokens) == len(reference)
    return len(tokens)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_greedy_chat_carries_the_targets_own_log_probs(smol_proxy: Process, smol_verifier: Process,
                                                       stream: bool) -> None:
    body = {**GREEDY_CHAT, "logprobs": True, "top_logprobs": 3, "stream": stream}
    text, entries = chat_entries(smol_proxy, body)
    assert "".join(entry["token"] for entry in entries) == text  # no stop string: every token's text is out
    passed = http.post_json(smol_proxy.url + CHAT_PATH, GREEDY_CHAT, headers=PASS, timeout=120)
    assert_served(passed, "passthrough")
    reference = plain_decoding(smol_verifier, tokenize(smol_verifier.url, {"messages": ASK}), 24, 3 + 1)
    same = compared([entry["token"] for entry in entries], reference, smol_verifier)
    assert same >= MIN_COMPARED
    if same == len(entries):
        assert text == passed.json()["choices"][0]["message"]["content"]
        assert len(entries) == passed.json()["usage"]["completion_tokens"]
    for entry, want in zip(entries[:same], reference, strict=False):
        assert near(entry["logprob"], want["logprob"]), (entry, want)
        assert_top_matches([(top["token"], top["logprob"]) for top in entry["top_logprobs"]],
                           [(detokenize(smol_verifier.url, [t]), plain, batch) for t, plain, batch in want["top"]])


def test_a_completion_carries_the_legacy_log_probs(smol_proxy: Process, smol_verifier: Process) -> None:
    reply = http.post_json(smol_proxy.url + COMPLETIONS_PATH, {**GREEDY_COMPLETION, "logprobs": 2},
                           headers=SPECULATE, timeout=120)
    assert_served(reply, "speculative")
    choice = reply.json()["choices"][0]
    logprobs = choice["logprobs"]
    assert "".join(logprobs["tokens"]) == choice["text"] and len(logprobs["tokens"]) == 16
    assert logprobs["text_offset"] == [sum(len(text) for text in logprobs["tokens"][:index]) for index in range(16)]
    reference = plain_decoding(smol_verifier, tokenize(smol_verifier.url, {"prompt": PROMPT}), 16, 2 + 1)
    same = compared(logprobs["tokens"], reference, smol_verifier)
    assert same >= MIN_COMPARED
    for logprob, want in zip(logprobs["token_logprobs"][:same], reference, strict=False):
        assert near(logprob, want["logprob"]), (logprob, want)
    for top, want, text in zip(logprobs["top_logprobs"][:same], reference, logprobs["tokens"], strict=False):
        expected = {detokenize(smol_verifier.url, [t]): (plain, batch) for t, plain, batch in want["top"][:2]}
        expected.setdefault(text, want["logprob"])  # the sampled token is always there
        noise = max(abs(plain - batch) for _, plain, batch in want["top"]) + TOLERANCE
        near_tie = any(abs(a[1] - b[1]) <= 2 * noise for a, b in zip(want["top"], want["top"][1:]))
        assert top.keys() == expected.keys() or near_tie, (top, expected)
        assert near_tie or all(near(top[key], expected[key]) for key in top), (top, expected)


@pytest.mark.parametrize(("path", "fields"), [
    (COMPLETIONS_PATH, {**GREEDY_COMPLETION, "logprobs": 21}),  # more than the route's top_logprobs (20)
    (CHAT_PATH, {**GREEDY_CHAT, "logprobs": True, "temperature": 0.7}),  # our verifier draws from the whole vocabulary
], ids=["top-n beyond the route's", "a sampled token beyond the top-N"])
def test_log_probs_the_rounds_cannot_give_pass_through_with_the_reason(smol_proxy: Process, path: str,
                                                                       fields: dict[str, Any]) -> None:
    def says_why(event: dict[str, Any]) -> bool:
        return event.get("event") == "request" and "log-probs beyond the route's top-N" in event.get("reason", "")

    before = len(log_events(smol_proxy, says_why))
    reply = http.post_json(smol_proxy.url + path, fields, headers=SPECULATE, timeout=120)
    assert reply.headers[MODE_HEADER] == "passthrough"  # the verifier itself refuses log-probs: a 400 of its own
    assert len(log_events(smol_proxy, says_why, at_least=before + 1)) == before + 1
