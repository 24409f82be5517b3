"""Every number of an upstream answer replaced by one no server should send: refused, or harmless, never a crash.

Each parser of proxy/targets/ is given a good answer with one number (or, for vLLM, one token-id key)
changed to a value Python's json module reads without complaint: infinities, NaN, a fraction, a
bool, an int no float or int64 holds. The parser must raise UpstreamUnavailableError or return ids
inside the vocabulary and finite log-probs, for every number of the answer.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from proxy.errors import UpstreamUnavailableError
from proxy.targets import checks
from proxy.targets.base import Verification
from proxy.targets.sglang import parse_support, parse_verification
from proxy.targets.vllm_answers import parse_verification as parse_vllm
from tests.fakes.toy_model import VOCAB
from tests.unit.targets.test_checks import VLLM_VOCAB
from tests.unit.targets.test_sglang_parse import SUPPORT_IDS, answer, draft_probs, support_answer
from tests.unit.targets.test_vllm import VERIFY
from tests.unit.targets.test_vllm_parse import answer as vllm_answer

WILD = [math.inf, -math.inf, math.nan, 2.5, True, 1e300, 10**20, 10**400, -(10**400)]
WILD_KEYS = ["1" + "0" * 400, "-3", "inf", "2.5"]  # vLLM's token ids are the keys of its log-prob maps
MAX_CACHED = 2**31

Path = tuple[Any, ...]


def numbers(value: Any, path: Path = ()) -> Iterator[Path]:
    """The path of every number in a JSON value (bools count: JSON has none where a number belongs)."""
    if isinstance(value, int | float):
        yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from numbers(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from numbers(item, (*path, index))


def id_keys(value: Any, path: Path = ()) -> Iterator[Path]:
    """The path of every key that is a token id (digits, or vLLM's "token_id:" form)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key.removeprefix("token_id:").isdigit():
                yield (*path, key)
            yield from id_keys(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from id_keys(item, (*path, index))


def with_number(base: dict[str, Any], path: Path, wild: Any) -> dict[str, Any]:
    changed = copy.deepcopy(base)
    holder = changed
    for step in path[:-1]:
        holder = holder[step]
    holder[path[-1]] = wild
    return changed


def with_key(base: dict[str, Any], path: Path, wild: str) -> dict[str, Any]:
    changed = copy.deepcopy(base)
    holder = changed
    for step in path[:-1]:
        holder = holder[step]
    prefix = "token_id:" if path[-1].startswith("token_id:") else ""
    holder[prefix + wild] = holder.pop(path[-1])
    return changed


def sane(result: Any, vocab_size: int) -> bool:
    """Ids inside the vocabulary, finite log-probs at most 0 (vLLM's -inf aside), a plausible cache count."""
    if not isinstance(result, Verification):
        ids = np.asarray(result.ids)
        return bool(((ids == -1) | ((ids >= 0) & (ids < vocab_size))).all())
    ids = [result.bonus_token, *(t for p in result.positions if (t := p.token_id) is not None)]
    ids += [int(t) for p in result.positions for t in p.top_ids]
    logprobs = [v for p in result.positions for v in (*p.top_logprobs.tolist(), p.token_logprob) if v is not None]
    return (all(type(t) is int and 0 <= t < vocab_size for t in ids) and 0 <= result.cached_tokens < MAX_CACHED
            and all(v <= 0 and not math.isnan(v) for v in logprobs))


PARSERS: list[tuple[str, Callable[[], dict[str, Any]], Callable[[dict[str, Any]], Any], int]] = [
    ("sglang top-N", answer, lambda a: parse_verification(a, [5, 9], 11, top_n=2, vocab_size=VOCAB), VOCAB),
    ("sglang top-N, vocabulary unknown", answer, lambda a: parse_verification(a, [5, 9], 11, top_n=2), VOCAB),
    ("sglang draft support", support_answer,
     lambda a: parse_support(a, [5, 9], SUPPORT_IDS, draft_probs(), vocab_size=VOCAB), VOCAB),
    ("vllm", vllm_answer,
     lambda a: parse_vllm(a, VERIFY["context_len"], VERIFY["draft_tokens"], 2, vocab_size=VLLM_VOCAB), VLLM_VOCAB),
    ("vllm, vocabulary unknown", vllm_answer,
     lambda a: parse_vllm(a, VERIFY["context_len"], VERIFY["draft_tokens"], 2), VLLM_VOCAB),
]


def outcome(parse: Callable[[dict[str, Any]], Any], changed: dict[str, Any], vocab_size: int) -> str | None:
    """None when the parser refused the answer or returned something sane; else what went wrong."""
    try:
        result = parse(changed)
    except UpstreamUnavailableError:
        return None
    except Exception as exc:  # noqa: BLE001 -- the point: any other exception is the failure reported
        return f"{type(exc).__name__}: {str(exc)[:80]}"
    return None if sane(result, vocab_size) else "accepted"


@pytest.mark.parametrize(("base", "parse", "vocab_size"), [p[1:] for p in PARSERS], ids=[p[0] for p in PARSERS])
def test_a_wild_number_anywhere_is_refused_or_harmless(base: Callable[[], dict[str, Any]],
                                                         parse: Callable[[dict[str, Any]], Any],
                                                         vocab_size: int) -> None:
    good = base()
    assert outcome(parse, good, vocab_size) is None and any(numbers(good))
    failures = [(path, wild, problem) for path in numbers(good) for wild in WILD
                if (problem := outcome(parse, with_number(good, path, wild), vocab_size))]
    failures += [(path, wild, problem) for path in id_keys(good) for wild in WILD_KEYS
                 if (problem := outcome(parse, with_key(good, path, wild), vocab_size))]
    assert failures == []


@pytest.mark.parametrize(("value", "vocab_size", "message"), [
    (math.inf, VOCAB, "the answer holds Infinity where a token id belongs"),
    (math.nan, None, "the answer holds NaN where a token id belongs"),
    (True, VOCAB, "the answer holds true where a token id belongs"),
    (2.5, VOCAB, "the answer holds 2.5 where a token id belongs"),
    (2**31, None, "the answer holds token id 2147483648, outside the vocabulary (ids up to 2147483647)"),
    (10**400, VOCAB, ("the answer holds token id 1000000000000000000000000000000000000000..., outside the "
                      "vocabulary (0..23)")),
], ids=["Infinity", "NaN", "true", "a fraction", "past an int32", "past any float"])
def test_a_token_id_is_a_whole_number_inside_a_vocabulary(value: Any, vocab_size: int | None, message: str) -> None:
    with pytest.raises(UpstreamUnavailableError) as raised:
        checks.token_id(value, vocab_size, "the answer")
    assert raised.value.message == f"upstream answer rejected: {message}"


@pytest.mark.parametrize(("value", "expected"), [(2, 2), (2.0, 2), ("7", 7)])  # a string: as int() has always read it
def test_a_whole_number_is_a_token_id(value: Any, expected: int) -> None:
    assert checks.token_id(value, VOCAB, "the answer") == expected
