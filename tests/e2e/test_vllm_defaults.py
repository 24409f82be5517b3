"""The server's sampling defaults behind a real vLLM (`pytest -m vllm`): requests that leave fields out get vLLM's own
output through the proxy, speculated.

The model folder is SmolLM2-135M's with a stock Instruct model's generation_config (repetition_penalty 1.3,
temperature 0.7, top_p 0.8, top_k 20), which vLLM applies to every field a request omits. At temperature 0 the
penalty changes the text of a repetitive answer; rounds follow it through vLLM's own choice after each prefix. At
T > 0 the proxy samples with the server's temperature and truncation, and, the server being started with
`--logprobs-mode processed_logprobs`, under its penalty from the distribution vLLM samples from.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests import chi_square
from tests import support as http
from tests.e2e.servers import SMOL, Process
from tests.e2e.vllm_harness import MODEL, changed_model_folder, served_vllm, start_vllm_proxy

pytestmark = pytest.mark.vllm

DEFAULTS = {"repetition_penalty": 1.3, "temperature": 0.7, "top_p": 0.8, "top_k": 20}
REPETITIVE = [{"role": "user", "content": "Write the word 'apple' twenty times, separated by commas."}]
MAX_TOKENS = 40
FORCED = {"X-Speculoos": "on"}  # rounds from the first token, whatever the controller would decide
FIRST_TOKEN = [{"role": "user", "content": "Write one word that describes the ocean."}]
# Its likeliest first answer token, "The" (0.77 at the defaults), is in the prompt: the penalty moves it out.
PENALISED_FIRST_TOKEN = [{"role": "user", "content": "The ocean: write one word that describes it."}]
FIRST_TOKEN_REQUESTS = 200


@pytest.fixture(scope="module")
def penalised_vllm(log_dir: Path) -> Iterator[str]:
    folder = changed_model_folder(log_dir / "smollm2-stock-defaults", {"generation_config.json": DEFAULTS})
    with served_vllm(log_dir, MODEL, "--logprobs-mode", "processed_logprobs", folder=folder) as url:
        yield url


@pytest.fixture(scope="module")
def penalised_proxy(penalised_vllm: str, log_dir: Path) -> Iterator[Process]:
    process = start_vllm_proxy(penalised_vllm, SMOL, log_dir, "defaults")
    yield process
    process.stop()


def chat(url: str, headers: dict[str, str] | None = None, *, stream: bool = False,
         **fields: object) -> tuple[str, str | None, dict]:
    """A greedy chat answer's text, how the proxy served it, and the last body (streamed: the last event)."""
    body = {"model": MODEL, "messages": REPETITIVE, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": stream,
            **fields}
    reply = http.post_json(url + "/v1/chat/completions", body, headers or {}, timeout=300)
    assert reply.status == 200, reply.body[:500]
    if not stream:
        answer = reply.json()
        return answer["choices"][0]["message"]["content"], reply.headers.get("x-speculoos-mode"), answer
    events = [event for event in http.sse_events(reply.body) if event != "[DONE]"]
    text = "".join(choice["delta"].get("content") or "" for event in events for choice in event["choices"])
    return text, reply.headers.get("x-speculoos-mode"), events[-1]


def test_the_servers_penalty_changes_this_answer(penalised_vllm: str) -> None:
    """The premise: vLLM's greedy answer under its default penalty is not its answer without one."""
    penalised, _, _ = chat(penalised_vllm)
    plain, _, _ = chat(penalised_vllm, repetition_penalty=1.0)
    assert penalised != plain, penalised


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_greedy_under_the_servers_penalty_is_vllms_own_text(penalised_vllm: str, penalised_proxy: Process,
                                                            stream: bool) -> None:
    expected, _, _ = chat(penalised_vllm, stream=stream)
    actual, mode, last = chat(penalised_proxy.url, FORCED, stream=stream)
    assert mode == "speculative", penalised_proxy.log()[-3000:]
    assert actual == expected
    if not stream:
        assert last["speculoos"]["rounds"] >= 1 and last["speculoos"]["drafted"] > 0, last["speculoos"]


def test_the_first_token_follows_the_servers_temperature_and_truncation(penalised_vllm: str,
                                                                        penalised_proxy: Process) -> None:
    """A request that names only the neutral penalty is sampled at the server's temperature 0.7, top_k 20 and
    top_p 0.8 (vLLM's order: temperature, top-k, top-p), computed here from vLLM's raw top-20; the same samples
    are far from the distribution a request naming nothing would have without the server's defaults."""
    raw = first_token_distribution(penalised_vllm, FIRST_TOKEN, **UNPROCESSED)  # processed at T 1, untruncated: raw
    ranked = sorted(raw, key=lambda text: -raw[text])
    logits = np.log(np.array([raw[text] for text in ranked]))
    with_defaults = dict(zip(ranked, vllm_top_p(logits / 0.7, 0.8), strict=True))
    seen = first_tokens(penalised_proxy, FIRST_TOKEN, repetition_penalty=1.0)
    p_with, p_without = fit(seen, with_defaults), fit(seen, raw)
    print(f"first token: chi-square p = {p_with:.4f} with the server's defaults, {p_without:.2e} without; "
          f"{seen.most_common(4)}")
    assert p_with > 1e-3
    assert p_without < 1e-3  # the control: the test tells the two apart


def test_the_first_token_under_all_the_servers_defaults_is_sampled_as_vllm_samples_it(
        penalised_vllm: str, penalised_proxy: Process) -> None:
    """A request that names nothing gets repetition_penalty 1.3 with the rest: vLLM answers the distribution it
    samples from (processed log-probs), and rounds sample from the same one, not from the unpenalised one."""
    wanted = first_token_distribution(penalised_vllm, PENALISED_FIRST_TOKEN)
    unpenalised = first_token_distribution(penalised_vllm, PENALISED_FIRST_TOKEN, repetition_penalty=1.0)
    seen = first_tokens(penalised_proxy, PENALISED_FIRST_TOKEN)
    p_with, p_without = fit(seen, wanted), fit(seen, unpenalised)
    print(f"first token under the penalty: chi-square p = {p_with:.4f} against vLLM's own, {p_without:.2e} without "
          f"the penalty; {seen.most_common(4)}")
    assert p_with > 1e-3
    assert p_without < 1e-3  # the control


UNPROCESSED = {"temperature": 1.0, "top_k": -1, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0}


def first_token_distribution(url: str, messages: list[dict], **fields: object) -> dict[str, float]:
    """The first answer token's distribution by text, from vLLM's own top-20 log-probs for `fields`."""
    reply = http.post_json(url + "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 1,
                                                          "logprobs": True, "top_logprobs": 20, **fields})
    assert reply.status == 200, reply.body[:500]
    distribution: Counter = Counter()
    for entry in reply.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]:
        distribution[entry["token"]] += float(np.exp(entry["logprob"]))
    return dict(distribution)


def first_tokens(proxy: Process, messages: list[dict], **fields: object) -> Counter:
    """The first answer tokens of seeded requests through the proxy, each speculated, by text."""
    seen: Counter = Counter()
    for seed in range(FIRST_TOKEN_REQUESTS):
        text, mode, _ = chat(proxy.url, FORCED, messages=messages, max_tokens=1, temperature=None, seed=seed,
                             **fields)
        assert mode == "speculative", proxy.log()[-2000:]
        seen[text] += 1
    return seen


def vllm_top_p(logits: np.ndarray, top_p: float) -> np.ndarray:
    """Probabilities of the top-20 logits (best first) after vLLM's top-p: a token survives where the mass above
    it is below top_p."""
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    above = np.concatenate([[0.0], np.cumsum(probs)[:-1]])
    kept = np.where(above < top_p, probs, 0.0)
    return kept / kept.sum()


def fit(seen: Counter, by_text: dict[str, float]) -> float:
    """The p-value of the seen first tokens against a distribution by text, bins of at least 5 expected."""
    total = sum(seen.values())
    bins = [text for text, probability in by_text.items() if probability * total >= 5]
    observed = [seen[text] for text in bins] + [total - sum(seen[text] for text in bins)]
    wanted = [by_text[text] * total for text in bins] + [total - sum(by_text[text] * total for text in bins)]
    if wanted[-1] < 1e-9:
        if observed[-1]:
            return 0.0  # a token the distribution gives no mass
        observed, wanted = observed[:-1], wanted[:-1]
    if len(observed) == 1:
        return 1.0  # one bin holds every sample and all the mass
    return chi_square.p_value(observed, wanted)
