"""Which of the elastic policy's choices the round carries out as a move to other flavors."""

from __future__ import annotations

import pytest

from jobs.resizing import _moves_flavors
from runtime.scheduling.policies import Config

pytestmark = pytest.mark.unit

A, H, T = "a100-sxm", "h100-sxm", "tpu-v4"


@pytest.mark.parametrize(
    ("held", "chosen", "moves"),
    [
        ({A: 2}, {H: 2}, True),  # to another flavor
        ({A: 2}, {A: 2, H: 1}, True),  # keeps its own, adds another flavor
        ({A: 2, T: 1}, {H: 2, T: 1}, True),  # leaves one flavor whole, keeps the other whole
        ({A: 2}, {A: 1, H: 1}, False),  # keeps part of a flavor: it would land back on both A100s
        ({A: 2}, {A: 4}, False),  # the same flavor, more of it: a grow, not a move
        ({A: 2}, {A: 2}, False),  # no change
    ],
)
def test_a_move_changes_flavors_and_keeps_or_leaves_each_held_flavor_whole(held, chosen, moves):
    assert _moves_flavors(Config.from_mapping(held), Config.from_mapping(chosen)) is moves
