"""A round's figures (`sapo.round.round_figures`): what the node logs of the groups it took, whatever senders claim."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

from sapo.round import Round, RoundOutcome, round_figures
from tests.trainer_fixtures import candidate


def test_a_senders_claimed_step_moves_the_step_lag_by_one_rank_at_most():
    # Three senders at steps 8, 9 and 10 and one claiming 2**63 - 1 (the wire's largest step): the node at step 10
    # logs the median lag, 0.5, where the mean was about -2.3e18 (a plot no one could read).
    steps = [8, 9, 10, 2**63 - 1]
    taken = tuple(
        dataclasses.replace(c, group=dataclasses.replace(c.group, step=s))
        for c, s in zip([candidate(f"peer{i}", [0.0, 1.0]) for i in range(4)], steps, strict=True)
    )
    round_ = Round(rows=(), external=MappingProxyType({}), chosen=taken, share=taken, first_slot=0, num_generations=2)
    figures = round_figures(round_, RoundOutcome(), slots=4, scored=4, zero_advantage=0, step=10)
    assert figures["sapo/external_step_lag"] == 0.5
    assert figures["sapo/external_groups"] == 4.0 and figures["sapo/distinct_senders"] == 4.0
    assert 0 <= figures["sapo/external_age_seconds"] < 5
