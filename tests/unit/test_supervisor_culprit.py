"""Which rank the local supervisor blames, and with what cause: the one the control plane recovers from."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.backends.local.supervisor import Supervisor, _Rank
from runtime.worker.cli import EXIT_PEER_LOST, EXIT_STOPPED


def supervisor(tmp_path: Path, *ranks: tuple[int | None, float | None, str | None, float | None]) -> Supervisor:
    made = Supervisor(tmp_path)
    for i, (code, exited_at, cause, detected_at) in enumerate(ranks):
        rank = _Rank(i, [], tmp_path / f"rank{i}.log")
        rank.exit_code, rank.exited_at, rank.cause, rank.detected_at = code, exited_at, cause, detected_at
        made.ranks.append(rank)
    return made


@pytest.mark.parametrize(
    ("name", "ranks", "culprit", "cause"),
    [
        # Killed first; its peers lost it afterwards.
        ("a kill", [(-9, 100.0, "signal", 100.0), (EXIT_PEER_LOST, 100.2, "exit", 100.2)], 0, "signal"),
        # A peer-lost exit seen first still does not take the blame from the rank that died.
        ("peer lost first", [(EXIT_PEER_LOST, 99.9, "exit", 99.9), (-9, 100.0, "signal", 100.0)], 1, "signal"),
        # A rank that stopped on request did not fail, even if it ended before the one that was killed.
        ("stopped beside a kill", [(EXIT_STOPPED, 50.0, None, None), (-9, 100.0, "signal", 100.0)], 1, "signal"),
        # Silence declared at 100.0 (a wall-clock time, as exits are).
        ("heartbeat", [(None, None, "heartbeat", 100.0), (EXIT_PEER_LOST, 100.5, "exit", 100.5)], 0, "heartbeat"),
    ],
)
def test_the_culprit_is_the_first_rank_to_fail_on_its_own(tmp_path, name, ranks, culprit, cause):
    chosen = supervisor(tmp_path, *ranks)._culprit()
    assert chosen is not None, name
    assert (chosen.rank, chosen.cause) == (culprit, cause), name


def test_ranks_that_all_stopped_on_request_blame_nobody(tmp_path):
    assert supervisor(tmp_path, (EXIT_STOPPED, 1.0, None, None), (EXIT_STOPPED, 2.0, None, None))._culprit() is None


def test_a_peer_lost_exit_names_nobody_while_the_rank_to_blame_may_still_show(tmp_path):
    # Rank 0 lost its peer and exited; rank 1, killed, has not been seen to end yet.
    made = supervisor(tmp_path, (EXIT_PEER_LOST, 100.0, "exit", 100.0), (None, None, None, None))
    made.ranks[1].proc = object()  # type: ignore[assignment]  # running, as far as the supervisor knows
    assert made._culprit() is None and made._first_failure() is None
    made.ranks[1].exit_code, made.ranks[1].exited_at = -9, 100.05
    made.ranks[1].cause, made.ranks[1].detected_at = "signal", 100.05
    assert (made._culprit().rank, made._first_failure()["cause"]) == (1, "signal")  # type: ignore[union-attr,index]


def test_with_every_rank_ended_and_nothing_else_to_blame_a_peer_lost_exit_is_named(tmp_path):
    made = supervisor(tmp_path, (EXIT_PEER_LOST, 100.0, "exit", 100.0), (-15, 100.4, "signal", 100.4))
    made.ranks[1].terminated_by_us = True  # stopped by the supervisor once rank 0 had failed
    assert made._culprit().rank == 0  # type: ignore[union-attr]
