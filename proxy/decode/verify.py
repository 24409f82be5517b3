"""A round's verification: the draft (and each other path a lookup found) scored at once, acceptance exact."""

from __future__ import annotations

import asyncio

from proxy.decode.session import Session
from proxy.drafting.base import Draft
from proxy.sampling.candidates import verify_candidates
from proxy.sampling.draft_rows import DraftRows
from proxy.sampling.rejection import verify_on_support
from proxy.targets.base import ScorePlan, Scores, Target


async def verify_round(session: Session, target: Target, context: list[int],
                       draft: Draft) -> tuple[tuple[int, ...], int, tuple[int, ...], float]:
    """Score the draft (and its other paths) and accept exactly: (emitted, accepted, path followed, tv bound)."""
    if not draft.alternatives:
        scores = await target.score(context, draft, session.score_plan())
        result = verify_on_support(draft.tokens, scores.support, session.random.accept)
        return result.emitted, result.accepted, draft.tokens, scores.tv_bound
    paths = (draft.tokens, *draft.alternatives)
    vocab = draft.probs.vocab_size
    path_drafts = [draft, *(Draft(path, DraftRows.one_hot(path, vocab), draft.source) for path in draft.alternatives)]
    plans = [session.score_plan() for _ in paths]  # drawn in order, so a seeded request's seeds do not depend on timing
    scored = await _score_all(target, context, path_drafts, plans)
    tree = verify_candidates(paths, [s.support for s in scored], session.random.accept)
    return tree.emitted, tree.accepted, paths[tree.candidate], max(s.tv_bound for s in scored)


async def _score_all(target: Target, context: list[int], drafts: list[Draft], plans: list[ScorePlan]) -> list[Scores]:
    """Score the paths at once; when one fails (or the round is cancelled), the others are cancelled and awaited."""
    scoring = [asyncio.ensure_future(target.score(context, d, plan)) for d, plan in zip(drafts, plans, strict=True)]
    try:
        return await asyncio.gather(*scoring)
    finally:
        # gather leaves the others running when one fails: their answers would be for nobody.
        if pending := [task for task in scoring if not task.done()]:
            for task in pending:
                task.cancel()
            await asyncio.wait(pending)
