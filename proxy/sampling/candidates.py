"""Several deterministic candidates in one round: multi-candidate speculative sampling, as pure numpy.

SpecInfer (Miao et al. 2024, arXiv:2305.09781), multi-step speculative sampling, for drafts that
are deterministic (one-hot: suffix lookups). The candidates form a token tree; at each node the
target's distribution p is known on a few ids plus the mass outside them. The node's children
are tried in the candidates' order: child c is accepted with probability p'(c) / Σp' where p' is
what remains of p; on rejection p'(c) is set to 0. If every child is rejected, the emitted token
is a sample of the remaining p'. Whatever the children, the token emitted at a node follows p
exactly: P(c_1) = p(c_1), P(c_2) = (1 − p(c_1)) · p(c_2) / (1 − p(c_1)) = p(c_2), and so on,
with the rest of p for the residual. A node with no children (a candidate ran out) emits a
bonus token from p.

A node's distribution comes from the first candidate through it (one evaluation of the target);
a child whose token that evaluation did not return among its known ids is not tried there, which
keeps the outside column a sample of exactly the ids not tried.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from proxy.sampling.rejection import KnownSupport, sample


@dataclass(frozen=True)
class TreeResult:
    """Outcome of a round with several candidates."""

    emitted: tuple[int, ...]  # accepted draft tokens, then one target token
    candidate: int  # the candidate the accepted tokens came from (0 when none was accepted)

    @property
    def accepted(self) -> int:
        """Draft tokens accepted before the target's own token."""
        return len(self.emitted) - 1


def try_children(mass: np.ndarray, columns: Sequence[int], rng: np.random.Generator) -> tuple[int | None, np.ndarray]:
    """Test each child's column in turn: the index of the accepted one (None if all were rejected) and what remains."""
    remaining = np.asarray(mass, dtype=np.float64).copy()
    for i, column in enumerate(columns):
        total = remaining.sum()
        # u < chance (not <=): a token with no probability is never accepted, even when u == 0.0.
        if total > 0 and rng.random() < remaining[column] / total:
            return i, remaining
        remaining[column] = 0.0
    return None, remaining


def verify_candidates(paths: Sequence[Sequence[int]], supports: Sequence[KnownSupport],
                      rng: np.random.Generator) -> TreeResult:
    """Walk the candidates' token tree, accepting exactly; supports[i] scores paths[i] (len + 1 rows)."""
    if not paths or len(paths) != len(supports):
        raise ValueError(f"need one support per candidate, got {len(paths)} paths and {len(supports)} supports")
    alive, emitted, depth = list(range(len(paths))), [], 0
    while True:
        owner = supports[alive[0]]
        ids = owner.ids[depth]
        mass = np.append(owner.target_probs[depth], owner.outside_mass[depth])
        children, columns = [], []
        for index in alive:
            if len(paths[index]) > depth and (token := int(paths[index][depth])) not in children:
                found = np.flatnonzero(ids == token)
                if found.size:  # not among the node's known ids: not tried here (see the module docstring)
                    children.append(token)
                    columns.append(int(found[0]))
        chosen, remaining = try_children(mass, columns, rng)
        if chosen is None:
            column = sample(remaining, rng)
            token = int(owner.outside_tokens[depth]) if column == len(ids) else int(ids[column])
            if token < 0:
                raise ValueError(f"depth {depth}: the residual chose the outside but no outside token was drawn")
            return TreeResult((*emitted, token), alive[0] if emitted else 0)
        emitted.append(children[chosen])
        alive = [i for i in alive if len(paths[i]) > depth and int(paths[i][depth]) == children[chosen]]
        depth += 1
