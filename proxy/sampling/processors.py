"""Logits -> the distribution a backend samples from, as pure numpy (llama.cpp, vLLM and SGLang orders).

Greedy decoding is a one-hot distribution at the argmax, not a second code path.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

# vLLM treats temperatures below this as greedy (`_SAMPLING_EPS`, vllm/sampling_params.py); SGLang only below 1e-6.
GREEDY_TEMPERATURE_EPS = 1e-5
TOP_K_OFF = (0, -1)


class SamplerOrder(enum.Enum):
    """Which backend's truncation semantics turn logits into the distribution it samples from."""

    TRUNCATE_THEN_TEMPERATURE = "truncate_then_temperature"  # llama.cpp default chain
    TEMPERATURE_THEN_TRUNCATE = "temperature_then_truncate"  # vLLM
    TEMPERATURE_THEN_JOINT_TRUNCATE = "temperature_then_joint_truncate"  # SGLang


# What each backend does, read from its source (float32 there, float64 here). Ties are
# decided by sort order, which the sources leave unspecified; we pick the order a stable sort gives.
#
# llama.cpp (ggml-org/llama.cpp): common/common.h `common_params_sampling::samplers` defaults to
#   penalties, dry, top_n_sigma, top_k, typical_p, top_p, min_p, xtc, temperature, and
#   common/sampling.cpp `common_sampler_init` appends `dist`: truncation sees the RAW logits,
#   temperature comes last. In src/llama-sampling.cpp:
#   - top_k (`llama_sampler_top_k_impl`): partial sort by logit, keep exactly k.
#   - top_p (`llama_sampler_top_p_apply`): softmax over the surviving candidates, walk down, stop
#     at the first token with cum_sum >= p, that token included: keep iff mass before it < p.
#   - min_p (`llama_sampler_min_p_apply`): keep logit >= max_logit + log(p), i.e. prob >= p * max.
#   - temperature (`llama_sampler_temp_impl`): logit /= temp; temp <= 0 keeps only the first max.
#   min_keep defaults to 0 (common.h), so it never widens these sets.
# vLLM (vllm-project/vllm): vllm/v1/sample/sampler.py `Sampler.sample`: temperature < 1e-5 is
#   argmax; else temperature, then argmax-invariant processors, i.e. min_p
#   (vllm/v1/sample/logits_processor/builtin.py `MinPLogitsProcessor`: mask prob < min_p * max of
#   the tempered softmax), then vllm/v1/sample/ops/topk_topp_sampler.py `apply_top_k_top_p`:
#   top_k masks logits < the k-th largest (ties at the boundary all survive); top_p softmaxes what
#   survived, sorts ascending, masks cumsum <= 1 - p but never the largest: keep iff mass above
#   < p, as llama.cpp, but masked from the bottom, so among tied tokens the higher ids survive.
#   Recent vllm/sampling_params.py raises 0 < temperature < 1e-2 to 1e-2: pass the value used.
# SGLang (sgl-project/sglang): python/sglang/srt/layers/sampler.py divides by temperature, takes
#   one softmax, and `top_k_top_p_min_p_sampling_from_probs_torch` judges every filter on that
#   same distribution: rank < k (exactly k), (cumsum - p_i) <= top_p (<=, where the others use <),
#   p_i >= min_p * max; no renormalisation between filters, unlike vLLM, hence a third member.
#   Greedy (temperature < 1e-6, not vLLM's 1e-5) becomes top_k = 1 (python/sglang/srt/sampling/sampling_params.py).
#   The default flashinfer backend also filters jointly (filter_apply_order="joint"), but its
#   boundary and tie rules, and its min_p path (top_k_renorm_prob, top_p_renorm_prob first),
#   differ in detail; we follow the PyTorch reference.


@dataclass(frozen=True)
class SamplingParams:
    """The request's sampling knobs, validated once."""

    temperature: float = 1.0  # 0 means greedy
    top_k: int = 0  # 0 or -1 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off
    # Applied by the server to the logits of every id in the prompt or output (vLLM's `repetition_penalty`), never in
    # its raw log-probs: rounds follow it through the server's own choices, or the distribution it says it samples.
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be >= 1, or 0 or -1 for off, got {self.top_k}")
        if not 0.0 <= self.top_p <= 1.0:
            raise ValueError(f"top_p must be in [0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not (self.repetition_penalty > 0.0 and math.isfinite(self.repetition_penalty)):
            raise ValueError(f"repetition_penalty must be finite and > 0, got {self.repetition_penalty}")

    @property
    def greedy(self) -> bool:
        """True when the backend takes the argmax instead of sampling."""
        return self.temperature < GREEDY_TEMPERATURE_EPS


def _softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:  # [rows, vocab] -> [rows, vocab]
    """Row-wise softmax of logits / temperature; -inf logits get probability 0."""
    # In place on one fresh array: a verification scores tens of rows of the whole vocabulary.
    weights = logits - logits.max(axis=-1, keepdims=True)
    if temperature != 1.0:
        weights /= temperature
    np.exp(weights, out=weights)
    weights /= weights.sum(axis=-1, keepdims=True)
    return weights


def _keep_top_n(
    values: np.ndarray,  # [rows, vocab]
    threshold: np.ndarray,  # [rows], the n-th largest value
    n: np.ndarray,  # [rows]
    high_ids_first: bool = False,
) -> np.ndarray:
    """Mask of the n largest values per row; ties at the threshold go to the lowest (or highest) id."""
    above = values > threshold[:, None]
    tied = values == threshold[:, None]
    room = n - above.sum(axis=-1)
    if (tied.sum(axis=-1) <= room).all():  # the usual case: no tie straddles the boundary
        return above | tied
    if high_ids_first:
        tie_rank = np.cumsum(tied[:, ::-1], axis=-1)[:, ::-1]
    else:
        tie_rank = np.cumsum(tied, axis=-1)
    return above | (tied & (tie_rank <= room[:, None]))


def _top_k_mask(logits: np.ndarray, top_k: int, keep_ties: bool) -> np.ndarray | None:
    """Mask of the top_k largest logits per row (None, keep all, when top_k is off or >= vocab)."""
    rows, vocab = logits.shape
    if top_k in TOP_K_OFF or top_k >= vocab:
        return None
    threshold = np.partition(logits, vocab - top_k, axis=-1)[:, vocab - top_k]
    if keep_ties:
        return logits >= threshold[:, None]
    return _keep_top_n(logits, threshold, np.full(rows, top_k))


def _top_p_mask(logits: np.ndarray, top_p: float, inclusive: bool, high_ids_first: bool) -> np.ndarray | None:
    """Mask of tokens whose preceding softmax mass (descending) is < top_p, or <= if inclusive (None: all)."""
    if top_p >= 1.0:
        return None
    probs = _softmax(logits)
    descending = -np.sort(-probs, axis=-1)
    mass_before = np.zeros_like(descending)
    mass_before[:, 1:] = np.cumsum(descending, axis=-1)[:, :-1]
    within = (mass_before <= top_p) if inclusive else (mass_before < top_p)
    # The most likely token always survives (top_p = 0 keeps one token in every backend).
    n = np.maximum(within.sum(axis=-1), 1)
    return _keep_top_n(probs, descending[np.arange(len(probs)), n - 1], n, high_ids_first)


def _min_p_mask(logits: np.ndarray, min_p: float) -> np.ndarray | None:
    """Mask of prob >= min_p * max prob, in llama.cpp's form: logit >= max logit + log(min_p) (None: all)."""
    if min_p <= 0.0:
        return None
    return logits >= logits.max(axis=-1, keepdims=True) + np.log(min_p)


def _mask(logits: np.ndarray, keep: np.ndarray | None) -> np.ndarray:
    """Logits with the dropped tokens set to -inf, as every backend does (unchanged when all are kept)."""
    return logits if keep is None else np.where(keep, logits, -np.inf)


def _truncate_then_temperature(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """llama.cpp: top_k, top_p, min_p on the raw logits (each on what survived), then temperature."""
    top_k = _top_k_mask(logits, params.top_k, keep_ties=False)
    if top_k is not None:  # exactly top_k survive per row: the rest of the chain runs on those columns only
        columns = np.nonzero(top_k)[1].reshape(len(logits), params.top_k)  # ascending ids, so ties break alike
        probs = np.zeros(logits.shape)
        np.put_along_axis(probs, columns, _truncated_tail(np.take_along_axis(logits, columns, -1), params), -1)
        return probs
    return _truncated_tail(logits, params)


def _truncated_tail(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """llama.cpp's chain after top_k: top_p, min_p, temperature."""
    logits = _mask(logits, _top_p_mask(logits, params.top_p, inclusive=False, high_ids_first=False))
    logits = _mask(logits, _min_p_mask(logits, params.min_p))
    return _softmax(logits, params.temperature)


def _temperature_then_truncate(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """vLLM: temperature, then min_p, top_k (ties kept), top_p, each on what survived."""
    logits = logits / params.temperature
    logits = _mask(logits, _min_p_mask(logits, params.min_p))
    logits = _mask(logits, _top_k_mask(logits, params.top_k, keep_ties=True))
    logits = _mask(logits, _top_p_mask(logits, params.top_p, inclusive=False, high_ids_first=True))
    return _softmax(logits)


def _temperature_then_joint_truncate(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """SGLang: temperature, then top_k, top_p (<=) and min_p all judged on the same logits."""
    logits = logits / params.temperature
    masks = [
        _top_k_mask(logits, params.top_k, keep_ties=False),
        _top_p_mask(logits, params.top_p, inclusive=True, high_ids_first=False),
        _min_p_mask(logits, params.min_p),
    ]
    keep = [mask for mask in masks if mask is not None]
    return _softmax(_mask(logits, np.logical_and.reduce(keep) if keep else None))


_PIPELINES: dict[SamplerOrder, Callable[[np.ndarray, SamplingParams], np.ndarray]] = {
    SamplerOrder.TRUNCATE_THEN_TEMPERATURE: _truncate_then_temperature,
    SamplerOrder.TEMPERATURE_THEN_TRUNCATE: _temperature_then_truncate,
    SamplerOrder.TEMPERATURE_THEN_JOINT_TRUNCATE: _temperature_then_joint_truncate,
}


def processed_probs(logits: np.ndarray, params: SamplingParams, order: SamplerOrder) -> np.ndarray:
    """The distribution the backend samples from, per row.

    logits: [rows, vocab] (or [vocab]) raw logits or raw logprobs (shift-invariant).
    Greedy -> one-hot at argmax (lowest id on ties, like np.argmax).
    """
    rows = np.atleast_2d(np.asarray(logits, dtype=np.float64))
    if rows.ndim != 2:
        raise ValueError(f"logits must be [vocab] or [rows, vocab], got shape {np.shape(logits)}")
    if not np.all(rows.max(axis=-1) > -np.inf):
        raise ValueError("every row of logits needs at least one finite value")
    if params.greedy:
        result = one_hot(np.argmax(rows, axis=-1), rows.shape[-1])
    else:
        result = _PIPELINES[order](rows, params)
    return result[0] if np.ndim(logits) == 1 else result


def one_hot(tokens: Sequence[int] | np.ndarray, vocab_size: int) -> np.ndarray:
    """[len(tokens), vocab_size] float64 rows with a single 1 at each token."""
    ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"token ids must be in [0, {vocab_size}), got {ids.tolist()}")
    rows = np.zeros((ids.size, vocab_size), dtype=np.float64)
    rows[np.arange(ids.size), ids] = 1.0
    return rows


def truncate_to_top(probs: np.ndarray, size: int) -> np.ndarray:
    """Keep the `size` most likely entries of a row and renormalise (a draft distribution with a small support)."""
    row = np.asarray(probs, dtype=np.float64)
    if np.count_nonzero(row) <= size:
        return row
    keep = np.argpartition(-row, size - 1)[:size]
    kept = np.zeros_like(row)
    kept[keep] = row[keep]
    return kept / kept.sum()
