"""Greedy output through the proxy equals the target's own output, token for token.

Real models, the real verifier as the target, the real openai SDK as the client. Each prompt is
run through the proxy and straight to the verifier's own OpenAI endpoint. A divergence passes
only if it is a near-tie of the target within the measured batch-vs-sequential discrepancy
(see tests/e2e/greedy.py); the test prints how many prompts diverged and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from proxy.decode.loop import START_CHUNK
from tests import support as http
from tests.e2e import greedy
from tests.e2e.servers import SMOL, Process, start_proxy, write_routes

# Exactness is tested on speculative rounds: the controller must not route these requests around them.
FORCE = {"X-Speculoos": "on"}

CHAT, COMPLETION = "chat", "completion"


@dataclass(frozen=True)
class Case:
    """One prompt and how it is sent."""

    name: str
    kind: str
    text: str
    stream: bool
    stop: tuple[str, ...] = ()


CASES = [
    Case("code-fibonacci", CHAT, "Write a Python function that returns the n-th Fibonacci number.", True),
    Case("code-bash", CHAT, "Write a bash one-liner that counts the lines of all .py files.", False),
    Case("prose-sky", CHAT, "Explain in two sentences why the sky is blue.", True),
    Case("utf8-french-japanese", CHAT, "Translate 'Good morning, my dear friend' into French and Japanese.", False),
    Case("utf8-emoji", CHAT, "Reply with three emoji that describe summer, then the word 'done'.", True),
    Case("utf8-chinese", CHAT, "用一句话介绍 Python 编程语言。", False),
    Case("stop-string", CHAT, "List the numbers from one to twenty in digits, separated by commas.", True, (", 7",)),
    Case("json", CHAT, "Give a JSON object with keys name and age for a fictional person.", False),
    Case("completion-code", COMPLETION, "def is_palindrome(s: str) -> bool:\n", True),
    Case("completion-prose", COMPLETION, "The three primary colours are", False),
    Case("completion-stop", COMPLETION, "# A list of fruits\nfruits = [\"apple\", \"banana\",", True, ("]",)),
    Case("sql", CHAT, "Write a SQL query that selects the ten most recent orders.", True),
]


def run(client: openai.OpenAI, case: Case, max_tokens: int) -> tuple[str, str | None, int]:
    """Text, finish reason and completion tokens of one greedy request."""
    common = {"model": "test", "max_tokens": max_tokens, "temperature": 0, "stop": list(case.stop) or None}
    if case.kind == CHAT:
        messages = [{"role": "user", "content": case.text}]
        if case.stream:
            chunks = list(client.chat.completions.create(messages=messages, stream=True,
                                                         stream_options={"include_usage": True}, **common))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
            assert len(finish) == 1, "exactly one chunk carries finish_reason"
            return text, finish[0], chunks[-1].usage.completion_tokens
        reply = client.chat.completions.create(messages=messages, **common)
        return reply.choices[0].message.content, reply.choices[0].finish_reason, reply.usage.completion_tokens
    if case.stream:
        chunks = list(client.completions.create(prompt=case.text, stream=True,
                                                stream_options={"include_usage": True}, **common))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert len(finish) == 1, "exactly one chunk carries finish_reason"
        return text, finish[0], chunks[-1].usage.completion_tokens
    reply = client.completions.create(prompt=case.text, **common)
    return reply.choices[0].text, reply.choices[0].finish_reason, reply.usage.completion_tokens


def prompt_ids(verifier: Process, case: Case) -> list[int]:
    """The ids the target sees for this case."""
    if case.kind == CHAT:
        return greedy.tokenize(verifier.url, {"messages": [{"role": "user", "content": case.text}]})
    return greedy.tokenize(verifier.url, {"prompt": case.text})


def check_identity(proxy: Process, verifier: Process, max_tokens: int, tolerance: float,
                   headers: dict[str, str] = FORCE) -> list[str]:
    """Run every case both ways; fail on any divergence that is not a near-tie. Returns the report lines."""
    through_proxy = openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0,
                                  default_headers=headers)
    direct = openai.OpenAI(base_url=verifier.url + "/v1", api_key="unused", max_retries=0)
    report, failures = [], []
    for case in CASES:
        expected = run(direct, case, max_tokens)
        actual = run(through_proxy, case, max_tokens)
        if actual == expected:
            report.append(f"{case.name}: identical ({expected[2]} tokens, {expected[1]})")
            continue
        if expected[0] == actual[0]:
            failures.append(f"{case.name}: same text but finish/usage differ: {expected[1:]} vs {actual[1:]}")
            continue
        where = greedy.find_divergence(verifier.url, prompt_ids(verifier, case), expected[0], actual[0])
        line = (f"{case.name}: diverged at token {where.token_index}, target top-2 margin {where.margin:.4f}"
                f"{', flips in a verification-shaped batch' if where.flips else ''}")
        report.append(line)
        if not where.is_near_tie(tolerance):
            failures.append(f"{line} > tolerance {tolerance:.4f}\n  expected {expected[0]!r}\n  actual   {actual[0]!r}")
    print(f"near-tie tolerance (twice the measured batch-vs-sequential logit-gap change): {tolerance:.4f}")
    print("\n".join(report))
    assert not failures, "\n".join(failures)
    return report


CALIBRATION_TEXT = "\n".join(case.text for case in CASES)  # the tolerance is measured on the cases' own text


@pytest.fixture(scope="module")
def smol_tolerance(smol_verifier: Process) -> float:
    """SmolLM2's near-tie tolerance from its measured batch-vs-sequential discrepancy."""
    return greedy.near_tie_tolerance(smol_verifier.url,
                                     greedy.tokenize(smol_verifier.url, {"prompt": CALIBRATION_TEXT}))


def test_smollm2_self_draft_matches_the_target(smol_proxy: Process, smol_verifier: Process,
                                               smol_tolerance: float) -> None:
    report = check_identity(smol_proxy, smol_verifier, max_tokens=32, tolerance=smol_tolerance)
    assert sum("identical" in line for line in report) >= len(CASES) // 2  # near-ties are rare, not the rule


@pytest.mark.slow
def test_qwen_pair_matches_the_target(qwen_proxy: Process, qwen_verifier: Process) -> None:
    tolerance = greedy.near_tie_tolerance(qwen_verifier.url, greedy.tokenize(qwen_verifier.url,
                                                                             {"prompt": CALIBRATION_TEXT}))
    report = check_identity(qwen_proxy, qwen_verifier, max_tokens=48, tolerance=tolerance)
    assert sum("identical" in line for line in report) >= len(CASES) // 2


def test_auto_mode_reads_along_with_the_target_and_matches_it(smol_verifier: Process, log_dir: Path,
                                                            smol_tolerance: float) -> None:
    """A fresh route in auto mode: the target decodes plainly while the draft reads the prompt, then the draft reads
    what the target wrote and the controller decides; the text stays the target's."""
    # Uncalibrated: timed at start-up, SmolLM2 drafting for itself costs what the target does, and the route would
    # rightly never draft; this test follows what a route that must learn its costs does.
    routes = write_routes(log_dir / "smol-auto.yaml", smol_verifier.url, SMOL,
                          extra="    fallback: {calibrate: false}\n")
    proxy = start_proxy(routes, log_dir)
    try:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)
        raw = client.completions.with_raw_response.create(
            model="test", prompt="def fibonacci(n):\n", max_tokens=48, temperature=0)
        assert raw.headers["x-speculoos-mode"] == "speculative"  # a fresh route speculates to measure
        extension = raw.parse().model_extra["speculoos"]
        assert extension["plain_tokens"] >= START_CHUNK  # the target's first tokens, while the draft read the prompt
        assert extension["draft_read"]["tokens"] >= START_CHUNK  # ... which the draft then read
        assert 0 <= extension["draft_read"]["agreed"] <= extension["draft_read"]["tokens"]
        check_identity(proxy, smol_verifier, max_tokens=32, tolerance=smol_tolerance, headers={})
    finally:
        proxy.stop()


def test_speculative_mode_is_used_and_reported(smol_proxy: Process) -> None:
    client = openai.OpenAI(base_url=smol_proxy.url + "/v1", api_key="unused", max_retries=0,
                           default_headers=FORCE)
    raw = client.chat.completions.with_raw_response.create(
        model="test", messages=[{"role": "user", "content": "Count from 1 to 5."}], max_tokens=16, temperature=0)
    assert raw.headers["x-speculoos-mode"] == "speculative"
    body = raw.parse()
    extension = body.model_extra["speculoos"]
    assert extension["mode"] == "speculative"
    assert extension["rounds"] >= 1 and extension["drafted"] >= extension["accepted"] >= 0
    assert body.usage.completion_tokens <= 16
    # SmolLM2 drafting for itself accepts nearly everything: rounds are drafted ahead, and used.
    assert extension["draft_ahead"]["started"] >= extension["draft_ahead"]["hits"] >= 1


def test_prompt_lookup_draft_matches_the_target(smol_ngram_proxy: Process, smol_verifier: Process,
                                                smol_tolerance: float) -> None:
    check_identity(smol_ngram_proxy, smol_verifier, max_tokens=32, tolerance=smol_tolerance)
    client = openai.OpenAI(base_url=smol_ngram_proxy.url + "/v1", api_key="unused", max_retries=0,
                           default_headers=FORCE)
    code = "def area(width, height):\n    return width * height\n"
    raw = client.chat.completions.with_raw_response.create(
        model="test", max_tokens=40, temperature=0,
        messages=[{"role": "user", "content": f"Repeat this code exactly, then stop:\n{code}"}])
    extension = raw.parse().model_extra["speculoos"]
    assert extension["accepted"] > 0  # the answer copies the prompt: lookup drafts get accepted


def test_hybrid_suffix_draft_matches_the_target(smol_hybrid_proxy: Process, smol_verifier: Process,
                                                smol_tolerance: float) -> None:
    check_identity(smol_hybrid_proxy, smol_verifier, max_tokens=32, tolerance=smol_tolerance)


def test_suffix_lookup_drafts_long_copies(smol_suffix_proxy: Process, smol_verifier: Process) -> None:
    code = "".join(f"def area_{i}(width, height):\n    return width * height * {i}\n\n" for i in range(6))
    messages = [{"role": "user", "content": f"Repeat this code exactly, then stop:\n{code}"}]
    client = openai.OpenAI(base_url=smol_suffix_proxy.url + "/v1", api_key="unused", max_retries=0,
                           default_headers=FORCE)
    raw = client.chat.completions.with_raw_response.create(model="test", max_tokens=96, temperature=0,
                                                           messages=messages)
    direct = openai.OpenAI(base_url=smol_verifier.url + "/v1", api_key="unused", max_retries=0)
    expected = direct.chat.completions.create(model="test", max_tokens=96, temperature=0, messages=messages)
    assert raw.parse().choices[0].message.content == expected.choices[0].message.content
    extension = raw.parse().model_extra["speculoos"]
    print(extension)
    # The answer copies the prompt: the first path of a fresh route is verified whole, longer than a model's K.
    assert set(extension["drafts"]) == {"lookup"} and extension["drafts"]["lookup"]["accepted"] > 0
    assert max(r[0] for r in extension["round_trace"]) > 4 and extension["tokens_per_round"] > 2


@pytest.mark.slow
def test_qwen_route_controller_decides_from_its_own_measurements(qwen_proxy: Process) -> None:
    """Never slower: on this CPU the Qwen pair's route must end in passthrough or a K that measurably pays."""
    client = openai.OpenAI(base_url=qwen_proxy.url + "/v1", api_key="unused", max_retries=0)
    for case in CASES[:8]:  # a varied workload, the controller free to choose
        run(client, case, max_tokens=24)
    status = http.get(qwen_proxy.url + "/speculoos/status").json()["routes"][0]
    print({k: status[k] for k in ("mode", "k", "reason", "alpha", "plain_tokens_per_second",
                                  "draft_seconds_per_token", "verify_seconds_by_k")})
    assert status["plain_tokens_per_second"] is not None and status["verify_seconds_by_k"]
    best = max(r for r in status["predicted_tokens_per_second_by_k"].values() if r is not None)
    if status["mode"] == "speculative":
        assert best > status["plain_tokens_per_second"], "speculating although its own measurements say it loses"
    else:
        assert status["k"] == 0 and status["reason"]
