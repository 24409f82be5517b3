"""The round loop's action for each decision, as one table."""

from __future__ import annotations

import pytest

from proxy.decode.decision import Action, Finish, Measure, Plain, Read, Speculate, action_for

PLAIN, PLAIN_READ, ROUND = Action.PLAIN, Action.PLAIN_READ, Action.ROUND
DECISIONS = {"speculate": Speculate(4, "r"), "measure": Measure("r"), "read": Read("r"), "plain": Plain("r"),
             "finish": Finish("r")}
# decision -> (model drafter, model drafter reading the prompt, lookup drafter, lookup drafter reading the prompt)
TABLE = {
    "speculate": (ROUND, PLAIN_READ, ROUND, ROUND),
    "measure": (PLAIN, PLAIN, PLAIN, PLAIN),
    "read": (PLAIN_READ, PLAIN_READ, ROUND, ROUND),
    "plain": (PLAIN_READ, PLAIN_READ, ROUND, ROUND),
    "finish": (PLAIN, PLAIN, PLAIN, PLAIN),
}
STATES = [(False, False), (False, True), (True, False), (True, True)]  # (looks_up, reading_prompt)


@pytest.mark.parametrize("name", sorted(TABLE))
def test_each_decision_maps_to_one_action_per_drafter_and_reading_state(name: str) -> None:
    actions = tuple(action_for(DECISIONS[name], looks_up=looks_up, reading_prompt=reading)
                    for looks_up, reading in STATES)
    assert actions == TABLE[name]
