"""vLLM's answers to a round, read and checked: prompt log-probs over the whole prompt, or one token per prefix.

Two shapes (vllm/entrypoints/openai/completion/ in vLLM):
- prompt log-probs (`prompt = context + drafts`, `prompt_logprobs: N`): entry 0 is null and entry j predicts token
  j, so entries L..L+K-1 score d_1..d_K; each holds the top-N plus the token standing there (an extra entry when
  it is outside the top-N); the one generated token is the bonus.
- one token per prefix (`prompt = [context, context + d_1, ..., context + d_1..d_K]`, `logprobs: N`): choice i's
  generated token (`logprobs.tokens`, "token_id:<id>" with return_tokens_as_token_ids) and its top-N are the
  position after its prompt, so choices 0..K-1 score d_1..d_K and choice K is the bonus position. A draft token
  outside a position's top-N has no log-prob there. Under a repetition penalty (`chosen_only`) the generated token
  is the server's greedy choice, which the raw top-N need not rank first: it stands alone for its position.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from proxy.errors import UpstreamUnavailableError
from proxy.targets import checks
from proxy.targets.base import PositionLogprobs, Verification

CLAMPED_NEG_INF = -9999.0  # vLLM writes max(logprob, -9999.0): -inf does not survive JSON
TOKEN_ID_PREFIX = "token_id:"  # output logprob keys with return_tokens_as_token_ids


def logprob(value: Any, what: str) -> float:
    """A logprob from the wire, checked, with vLLM's clamp undone."""
    checked = checks.logprob(value, what)
    return -np.inf if checked <= CLAMPED_NEG_INF else checked


def position(entries: list[tuple[int, float]], top_n: int, actual: int, vocab_size: int | None,
             what: str) -> tuple[np.ndarray, np.ndarray]:
    """One position's top-N, checked: the top-N and, when it is outside them, the standing token (`actual`)."""
    known = dict(entries)
    if not top_n <= len(known) <= top_n + 1:
        raise checks.fail(f"{what} has {len(known)} log-probs where the top {top_n} were asked for")
    ids, logprobs = _top(known.items(), top_n, actual)
    scored = (actual, known[actual]) if actual in known else None
    checks.top_position(ids, logprobs, width=top_n, vocab_size=vocab_size, what=what, scored=scored)
    return ids, logprobs


def _top(entries: Iterable[tuple[int, float]], top_n: int, actual: int) -> tuple[np.ndarray, np.ndarray]:
    """Id and logprob arrays best first (ties to the lower id), without `actual` when it is an extra."""
    pairs = dict(entries)
    if len(pairs) > top_n:  # vLLM added the standing token beyond the top-N
        pairs.pop(actual, None)
    if not pairs:
        raise UpstreamUnavailableError("upstream returned no top logprobs")
    ids = np.fromiter(pairs.keys(), dtype=np.int64, count=len(pairs))
    logprobs = np.fromiter(pairs.values(), dtype=np.float64, count=len(pairs))
    order = np.lexsort((ids, -logprobs))
    return ids[order], logprobs[order]


def output_pairs(top: dict[str, Any], vocab_size: int | None, what: str) -> list[tuple[int, float]]:
    """A generated position's `{"token_id:<id>": logprob}` as checked (id, logprob) pairs."""
    return [(checks.token_id(key.removeprefix(TOKEN_ID_PREFIX), vocab_size, what), logprob(value, what))
            for key, value in top.items()]


def ending(choice: Any, token: int) -> tuple[int, bool] | None:
    """(token, whether vLLM ended there) for a choice that generated it last: `finish_reason` "stop" on an id (the
    EOS, `stop_reason` null, or a stop id, `stop_reason` the id), "length" where it would have gone on; None for
    anything else (a stop string, an abort)."""
    reason, stop_reason = choice.get("finish_reason"), choice.get("stop_reason")
    if reason == "length":
        return token, False
    if reason == "stop" and (stop_reason is None or stop_reason == token):
        return token, True
    return None


def _cached_tokens(answer: Any) -> int:
    details = (answer.get("usage") or {}).get("prompt_tokens_details") or {}
    return checks.tokens(details.get("cached_tokens") or 0, "cached_tokens")


def parse_verification(answer: Any, context_len: int, draft_tokens: Sequence[int], top_n: int, *,
                       vocab_size: int | None = None) -> Verification:
    """Turn a prompt log-probs answer into per-position logprobs; raise on anything malformed or out of range
    (ids below `vocab_size` when given)."""
    try:
        choice = answer["choices"][0]
        prompt = choice["prompt_logprobs"]
        if prompt is not None and len(prompt) != context_len + len(draft_tokens):
            raise checks.fail(f"the answer scores {len(prompt)} prompt positions for a prompt of "
                              f"{context_len + len(draft_tokens)}")
        scored = prompt[context_len:]
        positions = []
        for index, (token, entry) in enumerate(zip(draft_tokens, scored, strict=True)):
            if str(token) not in entry:
                raise UpstreamUnavailableError("upstream did not score the draft token")
            what = f"draft position {index + 1}"
            pairs = [(checks.token_id(key, vocab_size, what), logprob(value["logprob"], what))
                     for key, value in entry.items()]
            ids, logprobs = position(pairs, top_n, token, vocab_size, what)
            positions.append(PositionLogprobs(token, dict(pairs)[token], ids, logprobs))
        checks.count(choice["token_ids"], 1, "the answer", "output ids")
        bonus = checks.token_id(choice["token_ids"][0], vocab_size, "the bonus token")
        checks.count(choice["logprobs"]["top_logprobs"], 1, "the bonus position", "rows")
        pairs = output_pairs(choice["logprobs"]["top_logprobs"][0], vocab_size, "the bonus position")
        ids, logprobs = position(pairs, top_n, bonus, vocab_size, "the bonus position")
        positions.append(PositionLogprobs(None, None, ids, logprobs))
        ends = ending(choice, bonus)
        return Verification(tuple(positions), bonus, _cached_tokens(answer), () if ends is None else (ends,))
    except checks.MALFORMED as exc:
        raise UpstreamUnavailableError(f"upstream sent a malformed verification answer ({type(exc).__name__})") from exc


def parse_prefix_tokens(answer: Any, draft_tokens: Sequence[int], top_n: int, *, vocab_size: int | None = None,
                        chosen_only: bool = False) -> Verification:
    """Turn a one-token-per-prefix answer (K + 1 prompts) into per-position logprobs, or with `chosen_only` into
    the generated token at each position with certainty; raise on anything malformed or out of range (ids below
    `vocab_size` when given)."""
    k = len(draft_tokens)
    try:
        choices = sorted(answer["choices"], key=lambda choice: int(choice["index"]))
        if [int(choice["index"]) for choice in choices] != list(range(k + 1)):
            raise checks.fail(f"the answer has choices {[c['index'] for c in choices]} for {k + 1} prompts")
        positions, generated, ends = [], 0, []
        for index, choice in enumerate(choices):
            what = f"draft position {index + 1}" if index < k else "the bonus position"
            checks.count(choice["logprobs"]["tokens"], 1, what, "output tokens")
            generated = checks.token_id(choice["logprobs"]["tokens"][0].removeprefix(TOKEN_ID_PREFIX), vocab_size,
                                        what)
            checks.count(choice["logprobs"]["top_logprobs"], 1, what, "rows")
            pairs = output_pairs(choice["logprobs"]["top_logprobs"][0], vocab_size, what)
            ids, logprobs = position(pairs, top_n, generated, vocab_size, what)
            draft = draft_tokens[index] if index < k else None
            if chosen_only:
                standing = None if draft is None else 0.0 if draft == generated else -np.inf
                positions.append(PositionLogprobs(draft, standing, np.array([generated]), np.zeros(1)))
                continue
            # The draft's own log-prob is known only inside the top-N; outside it the round counts it unknown mass,
            # which greedy and top_k within the top-N never sample.
            positions.append(PositionLogprobs(draft, dict(pairs).get(draft) if draft is not None else None,
                                              ids, logprobs))
            if (end := ending(choice, generated)) is not None:
                ends.append(end)
        return Verification(tuple(positions), generated, _cached_tokens(answer), tuple(ends))
    except checks.MALFORMED as exc:
        raise UpstreamUnavailableError(f"upstream sent a malformed verification answer ({type(exc).__name__})") from exc
