"""Issue 17, item 14: a rank starved of CPU is not dead (the supervisor's verdict on a late heartbeat)."""

from __future__ import annotations

import pytest

from runtime.backends.local.supervisor import STARVED_PATIENCE, heartbeat_lost


def never() -> bool:
    raise AssertionError("the process need not be looked at while the heartbeat is on time")


@pytest.mark.parametrize(
    ("age", "starved", "lost"),
    [
        (3.9, never, False),  # on time
        (4.1, lambda: False, True),  # late and not waiting for a CPU: stopped, frozen or gone
        (4.1, lambda: True, False),  # late but runnable: starved on a loaded host
        (STARVED_PATIENCE * 4.0 - 0.1, lambda: True, False),
        (STARVED_PATIENCE * 4.0 + 0.1, lambda: True, True),  # starved this long: a hang, not a load
    ],
)
def test_a_late_heartbeat_counts_as_lost_only_without_a_runnable_thread(age, starved, lost):
    assert heartbeat_lost(age, 4.0, starved=starved) is lost


@pytest.mark.parametrize(
    ("cause", "exit_code", "suspect"),
    [
        ("signal", -9, True),  # SIGKILL: the device or its host went away
        ("signal", -11, True),  # a crash
        ("signal", -15, False),  # SIGTERM: someone stopped it on purpose (issue 17, item 20)
        ("heartbeat", None, True),
        ("exit", 1, False),  # the program's own error
    ],
)
def test_only_a_death_the_platform_did_not_cause_is_evidence_against_a_device(cause, exit_code, suspect):
    from runtime.backends.base import Failure

    assert Failure(rank=0, cause=cause, detected_at=0.0, exit_code=exit_code).device_suspect is suspect
