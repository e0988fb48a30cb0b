"""The transition table on its own: a job's life can always end, and an ended job never moves."""

from __future__ import annotations

from jobs.models import TERMINAL_STATES, TRANSITIONS, JobState, sources_of


def _reachable(start: str) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for target in TRANSITIONS[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_every_state_is_in_the_table():
    assert set(TRANSITIONS) == set(JobState.values)


def test_every_state_is_reachable_from_submission():
    assert _reachable(JobState.QUEUED) == set(JobState.values)


def test_ended_jobs_never_move_and_live_ones_can_always_end():
    for state in JobState.values:
        if state in TERMINAL_STATES:
            assert TRANSITIONS[state] == frozenset()
        else:
            assert TRANSITIONS[state] >= TERMINAL_STATES, state
            assert state not in TRANSITIONS[state], f"{state} -> {state} is no move"


def test_sources_of_inverts_the_table():
    for target in JobState.values:
        assert sources_of(target) == {state for state, targets in TRANSITIONS.items() if target in targets}
    assert sources_of(JobState.RUNNING) == {JobState.ADMITTED}
    assert sources_of(JobState.RECOVERING) == {JobState.ADMITTED, JobState.RUNNING}
