"""A round's verification: the draft (and each other path a lookup found) scored at once, acceptance exact."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from proxy.decode.session import Session
from proxy.drafting.base import Draft
from proxy.sampling.candidates import verify_candidates
from proxy.sampling.draft_rows import DraftRows
from proxy.sampling.rejection import verify_on_support
from proxy.targets.base import ScorePlan, Scores, Target


@dataclass(frozen=True)
class Verdict:
    """What a round's verification decided."""

    emitted: tuple[int, ...]  # the accepted drafts and the target's own token (the loop cuts them at an end)
    accepted: int  # drafts accepted
    followed: tuple[int, ...]  # the path the round followed: the draft, or another path a lookup found
    tv_bound: float  # bounded sampling's bound on the round's error (0 where exact)


async def verify_round(session: Session, target: Target, context: list[int], draft: Draft) -> Verdict:
    """Score the draft (and its other paths) and accept exactly."""
    paths = (draft.tokens, *draft.alternatives)
    path_drafts = [draft, *(Draft(path, DraftRows.one_hot(path, draft.probs.vocab_size), draft.source)
                            for path in draft.alternatives)]
    plans = [session.score_plan() for _ in paths]  # drawn in order, so a seeded request's seeds do not depend on timing
    scored = await _score_all(target, context, path_drafts, plans)
    if len(scored) == 1:
        result = verify_on_support(draft.tokens, scored[0].support, session.random.accept)
        emitted, accepted, followed = result.emitted, result.accepted, draft.tokens
    else:
        tree = verify_candidates(paths, [s.support for s in scored], session.random.accept)
        emitted, accepted, followed = tree.emitted, tree.accepted, paths[tree.candidate]
    return Verdict(emitted, accepted, followed, max(s.tv_bound for s in scored))


async def _score_all(target: Target, context: list[int], drafts: list[Draft], plans: list[ScorePlan]) -> list[Scores]:
    """Score the paths at once; when one fails (or the round is cancelled), the others are cancelled and awaited."""
    if len(drafts) == 1:
        return [await target.score(context, drafts[0], plans[0])]
    scoring = [asyncio.ensure_future(target.score(context, d, plan)) for d, plan in zip(drafts, plans, strict=True)]
    try:
        return await asyncio.gather(*scoring)
    finally:
        # gather leaves the others running when one fails: their answers would be for nobody.
        if pending := [task for task in scoring if not task.done()]:
            for task in pending:
                task.cancel()
            await asyncio.wait(pending)
