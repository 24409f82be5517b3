"""Greedy identity with honest accounting of llama.cpp's batch-shape near-ties.

llama.cpp's logits depend on batch shape: a verification pass can
break a near-tie of the target's top two logits differently from plain one-token decoding. A
divergence is accepted only where the target's top-two margin is within the measured
batch-vs-sequential discrepancy; every other divergence fails.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests import support as http


def generate(url: str, ids: list[int], start: int, *, top_n: int = 20, max_new: int = 1) -> dict:
    """A greedy /generate call with logprobs from `start` on."""
    reply = http.post_json(url + "/generate", {
        "input_ids": ids, "sampling_params": {"max_new_tokens": max_new, "temperature": 0},
        "return_logprob": True, "logprob_start_len": start, "top_logprobs_num": top_n})
    assert reply.status == 200, reply.body
    return reply.json()


def flush(url: str, first_token: int) -> None:
    """Leave every sequence of the verifier's cache holding tokens that share no prefix with ones starting at
    first_token (requests sharing nothing take the least recently used sequence, so one each visits all)."""
    sequences = http.get(url + "/health").json()["sequences"]["total"]
    for offset in range(1, sequences + 1):
        generate(url, [first_token + offset, 11, 12], 0, top_n=0, max_new=0)


def near_tie_tolerance(url: str, ids: list[int]) -> float:
    """The largest top-two margin that batch-shape numerics can flip, measured on `ids`.

    The measured change of each top-20 token's gap to the top token, c, bounds the change of the
    gap between any two tokens a and b by c_a + c_b: the tolerance is twice the largest c.
    """
    return 2.0 * batch_vs_sequential_gap(url, ids)


def batch_vs_sequential_gap(url: str, ids: list[int]) -> float:
    """Largest change of any logit gap (a top-20 token vs the top token) between batch and one-by-one evaluation."""
    flush(url, ids[0])
    batched = generate(url, ids, 0)["meta_info"]["input_top_logprobs"][1:]  # [j] predicts ids[j + 1]
    flush(url, ids[0])
    generate(url, ids[:1], 0, top_n=0, max_new=0)
    worst = 0.0
    for m in range(2, len(ids)):
        # The cache holds ids[:m - 1]: this call evaluates token m - 1 alone, as plain decoding does.
        single = generate(url, ids[:m], m - 1)["meta_info"]["output_top_logprobs"][0]
        batch_row = {e[1]: e[0] for e in batched[m - 1]}
        best = single[0][1]
        for logprob, token, _ in single:
            if token in batch_row and best in batch_row:
                moved = (logprob - single[0][0]) - (batch_row[token] - batch_row[best])
                worst = max(worst, abs(moved))
    return worst


MAX_ROUND_BATCH = 9  # a round evaluates the last context token plus up to k_max = 8 drafts


@dataclass(frozen=True)
class Divergence:
    """Where proxy and target first differ, how close the target's top two were, and whether batching flips them."""

    token_index: int
    margin: float  # the target's top-two logprob gap there, as plain decoding computes it
    flips: bool  # a verification-shaped batch (prefix cached, then k + 1 rows) prefers another token
    expected_text: str
    actual_text: str

    def is_near_tie(self, tolerance: float) -> bool:
        """Explained by llama.cpp's batch-shape numerics: within the measured tolerance, or a reproduced flip."""
        return self.margin <= tolerance or self.flips


def tokenize(url: str, body: dict) -> list[int]:
    """Ids from the verifier's /tokenize."""
    return http.post_json(url + "/tokenize", body).json()["tokens"]


def detokenize(url: str, ids: list[int]) -> str:
    """Text from the verifier's /detokenize."""
    return http.post_json(url + "/detokenize", {"tokens": ids}).json()["text"]


def find_divergence(url: str, prompt_ids: list[int], expected: str, actual: str) -> Divergence:
    """Locate the first target token whose text the proxy did not produce, and the target's margin there."""
    reference = tokenize(url, {"prompt": expected, "add_special_tokens": False})
    index = 0
    while index < len(reference) and actual.startswith(detokenize(url, reference[: index + 1])):
        index += 1
    context = prompt_ids + reference[:index]
    plain = generate(url, context, len(context) - 1, top_n=2)["meta_info"]["output_top_logprobs"][0]
    flips = False
    for batch in range(2, MAX_ROUND_BATCH + 1):  # the row as a round of batch - 1 drafts computes it
        padded = context + [context[-1]] * (batch - 1)  # other tokens' values do not change this row
        row = generate(url, padded, len(context) - 1, top_n=2, max_new=0)["meta_info"]["input_top_logprobs"][1]
        flips = flips or row[0][1] != plain[0][1]
    return Divergence(index, plain[0][0] - plain[1][0], flips, expected, actual)
