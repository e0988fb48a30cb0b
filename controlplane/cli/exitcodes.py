"""What ``polychip`` exits with: a pipeline branches on these (documented in the README)."""

from __future__ import annotations

SUCCEEDED = 0  # the command did what it was asked; a job waited for succeeded
ERROR = 1  # transport or authentication: the server cannot be reached, or refused the token
USAGE = 2  # the command or its input is wrong: an unknown option, a missing file, a spec the API refuses
FAILED = 100  # the job waited for failed
NOT_FINISHED = 101  # the job had not ended when the wait's time was up
NOT_FOUND = 102  # no such job (or not one of your tenant's)
CANCELLED = 103  # the job waited for was cancelled
REFUSED = 104  # the job can never run here (larger than the pool or than the quota could ever give)
INTERRUPTED = 130  # Ctrl-C while waiting: the job goes on

BY_STATE = {"succeeded": SUCCEEDED, "failed": FAILED, "cancelled": CANCELLED}
