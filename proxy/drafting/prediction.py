"""Predicted Outputs: the output the client expects (`prediction`) as a draft source of its own.

An editing client sends the text it expects back, usually the file it asked to change. The draft
continues the prediction from where the output stands:
- while the output copies the prediction, from the token after the copy;
- once the output departs from it (a changed, inserted or deleted stretch), from where the
  output's latest tokens match the prediction again (suffix lookup's `match_lengths`): the
  longest match close ahead of where the copy stopped, or a long one anywhere (a deleted block).
  Until then the draft waits at the stop: when a line inserted into the prediction ends, the
  tokens before the stop match again, and the copy goes on.
A short replacement between two stretches of copy (a renamed variable) is a change that repeats:
it is made to the rest of the prediction too (`proxy.drafting.edits`), so the next occurrence
is drafted as the output will write it.
Each token of a path comes with the estimated probability that the copy goes on that far: the
rule of succession over the output's copied tokens and departures (a Beta prior that trusts the
client's claim, PRIOR_COPIED to PRIOR_DEPARTURES), times the trust in a fresh re-alignment (by
how many tokens matched). A path ends below MIN_ESTIMATE, so long copies earn long drafts; the
request's policy then trims it by the costs, as for lookup paths. Where the round lets the draft
model draft, the model reads the path in one batched step and the path ends at the first token the
model would write differently, with the model's token in its place (`PredictionDrafter._checked`).
Where the output has departed, the model drafts the edit; when its tokens bring the output back to
the prediction, the copy goes on in the same round (the model's `led` tokens, then the path). A
lookup path the route's drafter finds instead is checked the same way.
The draft is deterministic: one-hot, verified exactly as any lookup path is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from proxy.drafting.base import Draft, Drafter, DraftPlan, InFront, Source
from proxy.drafting.edits import MAX_INSERTED, MAX_REMOVED, MIN_ANCHOR, Edit, replay
from proxy.drafting.suffix import MAX_MATCH, Continuation, match_lengths
from proxy.engine.prefix import common_prefix_length
from proxy.sampling.draft_rows import DraftRows

PRIOR_COPIED, PRIOR_DEPARTURES = 16, 1  # the client's claim: copies run this long between departures, a priori
MIN_ESTIMATE = 0.5  # a path ends where the copy is likelier to have stopped than to go on
FAR_MATCH = 4  # tokens a match far from the stop needs to count (a deleted block, a moved line)
EDIT_GAP = 4  # copied tokens after which leaving the copy again is another edit, not the same one
NEAR_SLACK = 8  # prediction tokens past the stop (beyond those written since) where a short match counts


@dataclass(frozen=True)
class Alignment:
    """Where an output stands in the prediction, and what its copying so far says about the rest."""

    prediction: np.ndarray = field(compare=False, repr=False)  # [n] its tokens, with the output's changes made
    anchor: int = 0  # the prediction position the output's next token copies (when synced)
    written: int = 0  # output tokens followed
    synced: bool = True  # the output is copying from the anchor (False: departed, waiting to match again)
    trust: float = 1.0  # the probability that the anchor is right: 1 once a copied token confirmed it
    match: int = 0  # tokens of the output's tail that equal the prediction's before the anchor
    copied: int = 0  # output tokens that continued a copy
    departures: int = 0  # times the output left a copy
    stopped: int = 0  # output tokens written when the copy last stopped
    stop_match: int = 0  # how long that copy had run
    change: Edit | None = None  # the replacement between that copy and this one, made once this one is long enough

    def follow(self, output: Sequence[int]) -> Alignment:
        """The alignment after the output's tokens since this one (output extends what this one followed)."""
        new = output[self.written:]
        if not len(new):
            return self
        state = self
        if self.synced:
            same = common_prefix_length(new, self.prediction[self.anchor:self.anchor + len(new)].tolist())
            state = replace(self, anchor=self.anchor + same, written=self.written + same, copied=self.copied + same,
                            match=self.match + same, trust=1.0 if same else self.trust)
            if same == len(new):
                return state._settled()
            # Departures close together are one edit (a changed line leaves and rejoins the copy several times):
            # the output left a copy only where the copy that stopped had run EDIT_GAP tokens (or from the start).
            left = 1 if state.match >= EDIT_GAP or state.written == state.match else 0
            state = replace(state, synced=False, match=0, departures=state.departures + left, stopped=state.written,
                            stop_match=state.match, change=None)
        return state._realigned(output)

    def _realigned(self, output: Sequence[int]) -> Alignment:
        """Synced again where the output's tail matches the prediction near the stop, or matches it long; else
        still waiting at the stop."""
        ends, lengths = match_lengths(self.prediction, np.asarray(output[-MAX_MATCH:], dtype=np.int64), MAX_MATCH)
        starts = ends + 1  # where each match's copy would go on
        since = len(output) - self.stopped
        near = (starts >= self.anchor) & (starts <= self.anchor + since + NEAR_SLACK)
        eligible = np.flatnonzero(near | (lengths >= FAR_MATCH))
        if not eligible.size:
            return replace(self, written=len(output))
        # The longest match; among equals, one near the stop, then the closest to it.
        best = eligible[np.lexsort((np.abs(starts[eligible] - self.anchor), ~near[eligible], -lengths[eligible]))[0]]
        anchor, match = int(starts[best]), int(lengths[best])
        # A match that ends right at the stop is the end of an inserted stretch: one token more of trust.
        trust = 1.0 - 0.5 ** (match + (anchor == self.anchor))
        return replace(self, anchor=anchor, written=len(output), synced=True, match=match, trust=trust,
                       change=self._change(output, anchor, match))._settled()

    def _change(self, output: Sequence[int], anchor: int, match: int) -> Edit | None:
        """The replacement the output made between the copy that stopped and the one matched again (short, after
        a copy of MIN_ANCHOR tokens), or None."""
        removed = tuple(self.prediction[self.anchor:anchor - match].tolist())
        inserted = tuple(output[self.stopped:len(output) - match])
        if (self.stop_match >= MIN_ANCHOR and 0 < len(removed) <= MAX_REMOVED and 0 < len(inserted) <= MAX_INSERTED
                and len(output) - match >= self.stopped):
            return Edit(removed, inserted)
        return None

    def _settled(self) -> Alignment:
        """The replacement made in the rest of the prediction too, once the copy after it ran MIN_ANCHOR tokens: a
        change between two copied stretches (a renamed variable) repeats."""
        if self.change is None or self.match < MIN_ANCHOR:
            return self
        rest, _ = replay(self.prediction[self.anchor:].tolist(), [self.change])
        changed = np.concatenate([self.prediction[:self.anchor], np.asarray(rest, dtype=np.int64)])
        return replace(self, prediction=changed, change=None)

    def path(self, limit: int, floor: float = MIN_ESTIMATE) -> Continuation:
        """Up to limit tokens of the prediction from the anchor, each with the probability the copy goes on to it,
        ending where that falls below floor."""
        if not self.synced or limit <= 0:
            return Continuation((), ())
        copied, departed = self.copied + PRIOR_COPIED, self.departures + PRIOR_DEPARTURES
        tokens, estimates, running = self.prediction[self.anchor:self.anchor + limit].tolist(), [], self.trust
        for position in range(len(tokens)):
            running *= (copied + position) / (copied + departed + position)  # Beta-Binomial: one more copied token
            if running < floor:
                break
            estimates.append(running)
        return Continuation(tuple(tokens[:len(estimates)]), tuple(estimates), self.match, self.anchor)


class PredictionDrafter(InFront):
    """One request's prediction before the route's drafter: the prediction's path when one is worth verifying,
    the route's drafter otherwise. Sequences and reading stay the route drafter's."""

    def __init__(self, drafter: Drafter, prediction: Sequence[int], prompt_length: int) -> None:
        self._inner = drafter
        self.vocabulary = drafter.vocabulary
        self.looks_up = True  # a prediction path costs what a lookup path does: the request decides round by round
        self._prompt_length = prompt_length
        self._has_model = drafter.occupancy() is not None  # a drafter that holds sequences has a model to read with
        self._followed: list[int] = []  # the output the latest alignment followed
        # (output length, alignment) along it: a draft-ahead proposes after drafts the target may then reject,
        # and the next round goes on from the alignment of the output it shares
        self._alignments: list[tuple[int, Alignment]] = [(0, Alignment(np.asarray(prediction, dtype=np.int64)))]

    def alignment(self, output: Sequence[int]) -> Alignment:
        """Where this output stands in the prediction."""
        output = list(output)
        shared = common_prefix_length(self._followed, output)
        while self._alignments[-1][0] > shared:
            self._alignments.pop()
        aligned = self._alignments[-1][1].follow(output)
        if len(output) > self._alignments[-1][0]:
            self._alignments.append((len(output), aligned))
        self._followed = output
        return aligned

    async def propose(self, context: Sequence[int], plan: DraftPlan) -> Draft:
        """The prediction's path after context (trimmed to what is worth verifying, and checked by the draft model
        where the round lets it draft), else the route drafter's, which the prediction may then continue."""
        limit = plan.lookup_k or plan.k
        # Not before the first token: the model would read the whole prompt first, and the client wait for it.
        may_check = (self._has_model and plan.k > 0 and len(context) > self._prompt_length
                     and self._inner.fits(len(context) + limit))
        aligned = self.alignment(context[self._prompt_length:])
        tokens, declined = await self._copy(aligned, context, plan, limit, may_check)
        if tokens:
            return Draft(tokens, DraftRows.one_hot(tokens, self.vocabulary.n_vocab), Source.PREDICTION,
                         checked=may_check, match=aligned.match)
        if plan.k == 0 and not self._inner.looks_up:
            return Draft((), DraftRows.one_hot((), self.vocabulary.n_vocab), Source.PREDICTION, declined=declined,
                         match=aligned.match)
        editing = may_check and not aligned.synced
        found = await self._inner.propose(context, _model_first(plan) if editing else plan)
        if editing and found.source == Source.MODEL and 0 < len(found) < limit:
            return await self._rejoined(context, plan, found, limit)
        if may_check and found.source == Source.LOOKUP and len(found) > 1 and not found.alternatives:
            tokens = await self._checked(context, plan.request_id, found.tokens)  # a lookup path is cut the same way
            found = replace(found, tokens=tokens, probs=DraftRows.one_hot(tokens, self.vocabulary.n_vocab),
                            checked=True, beyond=found.beyond if tokens == found.tokens else None)
        if found.declined or not declined:
            return found
        # The prediction's declined path, to learn from; a lookup path of the route's keeps the match it was found by.
        return replace(found, declined=declined,
                       match=found.match if len(found) and found.source != Source.MODEL else aligned.match)

    async def _copy(self, aligned: Alignment, context: Sequence[int], plan: DraftPlan, limit: int,
                    checked: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(the prediction's path from the alignment worth verifying, the path found but not worth it)."""
        # A path the model checks may run as far as the round allows: the model cuts it where the output departs.
        path = aligned.path(limit, floor=0.0 if checked else MIN_ESTIMATE)
        length = (plan.worth(path.probs, aligned.match, predicted=True) if plan.worth is not None and path.tokens
                  else len(path.tokens))
        if length <= 0:
            return (), path.tokens
        tokens = path.tokens[:length]
        return (await self._checked(context, plan.request_id, tokens) if checked else tokens), ()

    async def _rejoined(self, context: Sequence[int], plan: DraftPlan, draft: Draft, limit: int) -> Draft:
        """The model's draft, then the prediction if the draft brings the output back to it: where the output
        departed for an edit, the model drafts the edit's new tokens and the copy goes on in the same round."""
        if self.vocabulary.is_end_of_generation(draft.tokens[-1]):
            return draft
        drafted = [*context, *draft.tokens]
        aligned = self.alignment(drafted[self._prompt_length:])
        if not aligned.synced:
            return draft
        tokens, _ = await self._copy(aligned, drafted, plan, limit - len(draft), checked=True)
        if not tokens:
            return draft
        probs = draft.probs + DraftRows.one_hot(tokens, self.vocabulary.n_vocab)
        return replace(draft, tokens=draft.tokens + tokens, probs=probs, source=Source.PREDICTION, led=len(draft),
                       checked=True, match=aligned.match)

    async def _checked(self, context: Sequence[int], request_id: str, tokens: tuple[int, ...]) -> tuple[int, ...]:
        """The path up to the first token the draft model would not write there, then the model's token instead.

        The model reads the whole path in one batched step. It read the request (the edit asked for), so where it
        leaves the prediction, the output usually does too: the path ends there rather than at a rejection the
        target pays to verify, and the edit's first token is drafted as well. Deterministic either way.
        """
        reading = self._inner.read(request_id, context, tokens)
        if reading is None:
            return tokens
        choices = await reading
        differs = next((i for i, (token, choice) in enumerate(zip(tokens, choices)) if token != choice), None)
        return tokens if differs is None else (*tokens[:differs], choices[differs])

    def close(self) -> None:
        """Nothing: the route's drafter outlives the request."""


def _model_first(plan: DraftPlan) -> DraftPlan:
    """The plan while the output departs from the prediction: the model, which read the edit asked for, drafts it,
    and a lookup path shorter than its draft gives way."""
    def worth(probs: Sequence[float], match: int, *, predicted: bool = False) -> int:
        length = plan.worth(probs, match, predicted=predicted) if plan.worth is not None else len(probs)
        return length if length >= plan.k else 0

    return replace(plan, worth=worth)


def with_prediction(drafter: Drafter, prediction: str | None, prompt_length: int) -> Drafter:
    """The route's drafter, behind the request's prediction if it sent one (tokenized once, in the draft's
    vocabulary, which the tokenizer check found to be the target's)."""
    if not prediction:
        return drafter
    return PredictionDrafter(drafter, drafter.vocabulary.tokenize(prediction, add_special=False), prompt_length)
