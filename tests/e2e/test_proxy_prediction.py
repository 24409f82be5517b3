"""Predicted Outputs and requests without max_tokens, end to end: the real verifier, SmolLM2, the openai SDK.

- The greedy output is the target's own whether the prediction is right, half right or wrong, and the usage's
  prediction counts are the prediction rounds' figures, whatever the controller decides on this machine's costs.
- Where rounds pay at the route's stated costs (`fallback.assume_costs`, the same on every machine), a right
  prediction drafts most of the answer; where verifying a token costs more than decoding it, none.
- A coding client's request (a long system prompt, no max_tokens) speculates.
- A generation that outgrows the draft model's context goes on (plainly, or by lookups) and stays the target's.
A divergence passes only as a near-tie of the target (tests/e2e/greedy.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from tests.e2e import greedy
from tests.e2e.proxy_harness import route
from tests.e2e.servers import SMOL, Process, start_proxy

FORCE = {"X-Speculoos": "on"}
CODE = "".join(f"def area_{i}(width, height):\n    return width * height * {i}\n\n" for i in range(4))
EDIT = [{"role": "user", "content": f"Repeat this code exactly, then stop:\n```python\n{CODE}```"}]
SYSTEM_RULES = [  # a coding assistant's system prompt, as editors send it
    "Always answer with complete, runnable code.", "Keep every line of the file that the change does not touch.",
    "Use the language's standard library before third-party packages.", "Never invent APIs that do not exist.",
    "Explain a change in one short sentence before the code.", "Prefer small functions with descriptive names.",
    "Write type hints for every public function.", "Keep the existing indentation and quoting style.",
]
LONG_SYSTEM = "You are an expert software engineer working in the user's repository.\n" + "\n".join(
    f"Rule {n}: {SYSTEM_RULES[n % len(SYSTEM_RULES)]} (section {n // len(SYSTEM_RULES) + 1})" for n in range(90))


def client(proxy: Process, headers: dict[str, str] | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0, default_headers=headers)


def assert_targets_text(verifier: Process, messages: list[dict], expected: str, actual: str) -> None:
    """The proxy's text is the target's own, or first differs at a near-tie of the target."""
    if actual == expected:
        return
    ids = greedy.tokenize(verifier.url, {"messages": messages})
    where = greedy.find_divergence(verifier.url, ids, expected, actual)
    tolerance = greedy.near_tie_tolerance(verifier.url, ids[-64:])
    assert where.is_near_tie(tolerance), (where, tolerance)


@pytest.fixture(scope="module")
def direct_edit(smol_verifier: Process) -> str:
    """The target's own greedy answer to the editing request."""
    reply = client(smol_verifier).chat.completions.create(model="test", messages=EDIT, max_tokens=96, temperature=0)
    return reply.choices[0].message.content


PREDICTIONS = {  # how much of the target's answer the prediction gets right
    "right": lambda answer: answer,
    "half right": lambda answer: answer[: len(answer) // 2] + "    return None\n" * 6,
    "wrong": lambda answer: "SELECT name FROM users WHERE id = 1;\n" * 8,
}


def predicted(proxy: Process, model: str, prediction: str, *, stream: bool) -> tuple[str, Any, dict[str, Any]]:
    """The editing request with a prediction through the proxy: (text, usage, the `speculoos` figures)."""
    common: dict[str, Any] = {"model": model, "messages": EDIT, "max_tokens": 96, "temperature": 0,
                              "prediction": {"type": "content", "content": prediction}}
    if stream:
        chunks = list(client(proxy).chat.completions.create(**common, stream=True,
                                                            stream_options={"include_usage": True}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return text, chunks[-1].usage, chunks[-1].model_extra["speculoos"]
    raw = client(proxy).chat.completions.with_raw_response.create(**common)
    assert raw.headers["x-speculoos-mode"] == "speculative"  # a prediction speculates, whatever the controller
    reply = raw.parse()
    return reply.choices[0].message.content, reply.usage, reply.model_extra["speculoos"]


def prediction_counts(usage: Any, extension: dict[str, Any]) -> tuple[int, int]:
    """(accepted, rejected) prediction tokens, checked to be the prediction rounds' own figures."""
    details = usage.completion_tokens_details
    assert details is not None and details.accepted_prediction_tokens is not None
    counts = extension["drafts"].get("prediction", {"drafted": 0, "accepted": 0})
    assert (details.accepted_prediction_tokens, details.rejected_prediction_tokens) == (
        counts["accepted"], counts["drafted"] - counts["accepted"])
    return details.accepted_prediction_tokens, details.rejected_prediction_tokens


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("which", sorted(PREDICTIONS))
def test_greedy_output_is_the_targets_whatever_the_prediction(smol_proxy: Process, smol_verifier: Process,
                                                              direct_edit: str, which: str, stream: bool) -> None:
    """Exactness and accounting: they hold whatever the route's measured costs make the controller decide."""
    text, usage, extension = predicted(smol_proxy, "test", PREDICTIONS[which](direct_edit), stream=stream)
    assert_targets_text(smol_verifier, EDIT, direct_edit, text)
    accepted, _ = prediction_counts(usage, extension)
    if which == "wrong":
        assert accepted <= 2  # a stray token in common at most


# -- decisions, at stated costs -------------------------------------------------------------------

PINNED_COSTS = {  # fallback.assume_costs, in milliseconds: the route decides as on hardware with these costs
    "cheap-rounds": {"draft_ms": 4, "verify_ms_flat": 25, "plain_ms": 25},  # a GPU's: a round costs a plain step
    "dear-rounds": {"draft_ms": 30, "verify_ms_per_token": 50, "plain_ms": 25},  # a token verified: two decoded
}


@pytest.fixture(scope="module")
def pinned_proxy(smol_verifier: Process, log_dir: Path) -> Iterator[Process]:
    """One SmolLM2 route per cost model in PINNED_COSTS, named after it."""
    routes = [route(name, smol_verifier.url, draft=SMOL, fallback={"assume_costs": costs},
                    speculation={"pipeline": False})  # the stated cost model is sequential
              for name, costs in PINNED_COSTS.items()]
    path = log_dir / "pinned-costs.yaml"
    path.write_text(yaml.safe_dump({"routes": routes}, sort_keys=False))
    process = start_proxy(path, log_dir)
    yield process
    process.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_right_prediction_drafts_the_answer_where_rounds_pay(pinned_proxy: Process, smol_verifier: Process,
                                                               direct_edit: str, stream: bool) -> None:
    text, usage, extension = predicted(pinned_proxy, "cheap-rounds", direct_edit, stream=stream)
    assert_targets_text(smol_verifier, EDIT, direct_edit, text)
    accepted, rejected = prediction_counts(usage, extension)
    assert accepted >= usage.completion_tokens // 2 and rejected <= 0.1 * (accepted + rejected)


def test_a_right_prediction_is_not_verified_where_a_verified_token_costs_more_than_a_decoded_one(
        pinned_proxy: Process, smol_verifier: Process, direct_edit: str) -> None:
    """The negative control of the test above: the same request, at costs where no round can pay."""
    text, usage, extension = predicted(pinned_proxy, "dear-rounds", direct_edit, stream=False)
    assert_targets_text(smol_verifier, EDIT, direct_edit, text)
    assert prediction_counts(usage, extension) == (0, 0) and extension["plain_tokens"] == usage.completion_tokens


def test_a_prediction_on_completions_is_honoured_too(pinned_proxy: Process, smol_verifier: Process) -> None:
    prompt = f"# The same code again:\n{CODE}# Again:\n"
    common: dict[str, Any] = {"prompt": prompt, "max_tokens": 48, "temperature": 0}
    expected = client(smol_verifier).completions.create(model="test", **common).choices[0].text
    reply = client(pinned_proxy).completions.create(model="cheap-rounds", **common, extra_body={
        "prediction": {"type": "content", "content": [{"type": "text", "text": CODE}]}})
    assert reply.choices[0].text == expected
    assert reply.usage.completion_tokens_details.accepted_prediction_tokens > 0


# -- requests without max_tokens ------------------------------------------------------------------


@pytest.mark.parametrize(("proxy", "headers"), [
    pytest.param("smol_hybrid_proxy", None, id="hybrid route"),
    pytest.param("smol_proxy", FORCE, id="model route, forced", marks=pytest.mark.slow),  # 30 s of model rounds
])
def test_a_long_prompt_without_max_tokens_speculates(request: pytest.FixtureRequest, smol_verifier: Process,
                                                     proxy: str, headers: dict[str, str] | None) -> None:
    messages = [{"role": "system", "content": LONG_SYSTEM},
                {"role": "user", "content": "Which rule says to keep the indentation? Answer with its number."}]
    assert 1800 <= len(greedy.tokenize(smol_verifier.url, {"messages": messages})) <= 2400
    common: dict[str, Any] = {"model": "test", "messages": messages, "temperature": 0, "stop": ["\n"]}  # no max_tokens
    raw = client(request.getfixturevalue(proxy), headers).chat.completions.with_raw_response.create(**common)
    assert raw.headers["x-speculoos-mode"] == "speculative"
    reply = raw.parse()
    assert reply.model_extra["speculoos"]["mode"] == "speculative"
    expected = client(smol_verifier).chat.completions.create(**common).choices[0].message.content
    assert_targets_text(smol_verifier, messages, expected, reply.choices[0].message.content)


# -- a generation longer than the draft model's context -------------------------------------------

SMALL_CTX = 256  # the draft's context: the prompt and about a hundred tokens of output


@pytest.fixture(scope="module")
def small_draft_proxy(smol_verifier: Process, log_dir: Path) -> Iterator[Process]:
    """One SmolLM2 draft with a small context, drafting alone and behind suffix lookup."""
    routes = [route(f"small-{kind}", smol_verifier.url, draft=SMOL) for kind in ("model", "hybrid")]
    for settings, kind in zip(routes, ("model", "hybrid"), strict=True):
        settings["draft"].update(kind=kind, ctx=SMALL_CTX)
    path = log_dir / "small-draft.yaml"
    path.write_text(yaml.safe_dump({"routes": routes}, sort_keys=False))
    process = start_proxy(path, log_dir)
    yield process
    process.stop()


@pytest.mark.parametrize("kind", ["model", "hybrid"])
def test_an_output_longer_than_the_draft_context_is_the_targets(small_draft_proxy: Process, smol_verifier: Process,
                                                                kind: str) -> None:
    messages = [{"role": "user", "content": "Count from 1 to 200 in digits, separated by commas."}]
    common: dict[str, Any] = {"messages": messages, "max_tokens": 300, "temperature": 0}
    expected = client(smol_verifier).chat.completions.create(model="test", **common)
    reply = client(small_draft_proxy, FORCE).chat.completions.create(model=f"small-{kind}", **common)
    assert expected.usage.prompt_tokens + expected.usage.completion_tokens > SMALL_CTX  # it does outgrow the draft
    assert_targets_text(smol_verifier, messages, expected.choices[0].message.content, reply.choices[0].message.content)
    extension = reply.model_extra["speculoos"]
    assert extension["mode"] == "speculative" and extension["rounds"] >= 1
    if kind == "model":
        assert extension["switched_to_plain"] and extension["plain_tokens"] > 0
