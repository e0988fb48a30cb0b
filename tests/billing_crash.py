"""Crash trials of the metering flush: kill -9 it at a stage of the flush chosen in advance, let a fresh
relay finish, and compare the ledger with the ground truth to the cent.

Used by ``tests/integration/test_billing_crash.py`` (200 trials in CI) and ``bench/billing.py``; both
run it in a process where Django is set up against PostgreSQL, with a Redis broker. It starts real
processes against that same database (``database_url``):

- Celery workers, ``celery -A controlplane worker --pool prefork --concurrency 1``, each on a queue of
  its own so that a spare one can boot in the background without taking anyone's task; the flush is
  ``billing.tasks.relay_usage`` sent to the current worker's queue;
- relays, ``manage.py relay_usage --loop``: the command runs in an interpreter that booted Django
  beforehand and waits for a line on stdin, so that a spare relay is warm but takes no outbox row
  until it is released. A relay that must stay out of a trial (the worker's) is stopped with SIGSTOP
  while the outbox is empty (it then holds no row lock) and continued with SIGCONT.

Each process sets ``PGAPPNAME``, so its database backends are found in ``pg_stat_activity``.

A trial:
1. ingest a known set of usage (``billing.services.ingest_usage``, one transaction): ``records``
   intervals over 5 tenants, 5 flavors (one of them priced per NAU-hour) and 4 jobs per tenant, about
   a third of them across the 2026-10/2026-11 month boundary, with sub-millisecond start times, under
   a price book of 12-decimal prices with a price change inside the trial window;
2. start the flush: send the task to the worker, or (for the relay) the ingest's commit is the start,
   since the relay polls the outbox every 20 ms;
3. hold the victim at the trial's planned point of the flush (``billing.crashpoints``: a named point
   of ``post_outbox_batch`` that is a no-op unless ``POLYCHIP_CRASH_POINTS`` is set; each worker and
   relay has a folder of its own there): ``claimed`` (rows locked, nothing written), ``posted``
   (ledger entries written, outbox rows not deleted), ``outbox_deleted`` (not committed) or
   ``committed`` (the batch committed, the task not returned nor acknowledged, the relay not on its
   next batch), in the planned batch of the flush (the relay's 800 rows take 4 batches of 200, the
   worker's one of 1,000). Once the victim holds there, note its backend state in
   ``pg_stat_activity``, then kill:
   - ``worker_child``: kill -9 the worker's pool child; prefork starts another and, with acks_late and
     reject_on_worker_lost, the task's message comes back and the new child runs it again (checked:
     every task the worker reports lost, WorkerLostError, is received a second time);
   - ``worker``: kill -9 the whole worker (its process group: main process and child); its message
     stays unacknowledged with the dead worker, and a fresh worker (the warm spare) gets a fresh task;
   - ``worker_connection``: ``pg_terminate_backend`` on the worker's backend; the task fails, and a
     fresh task finishes;
   - ``relay``: kill -9 the relay process; a fresh relay (the warm spare) is released and finishes;
   - ``relay_connection``: ``pg_terminate_backend`` on the relay's backend; the relay logs the error and
     finishes on its next round with a fresh connection;
4. count the outbox right after the kill (the flush was mid-way if it is neither full nor empty),
   release the hold (a victim whose connection was cut runs into the cut), and check that the
   outbox and the backend state are what the planned point implies (a trial that missed its point
   is a problem, so every kill provably landed where it was planned);
5. wait until the outbox is empty and the worker idle (an idle worker with rows left gets a fresh
   task, as beat would send one), then compare: per (tenant, flavor) the ledger's entries and the
   ground truth (the intervals themselves, cut at month ends) are both rated with ``billing.rating``
   at the tenant's prices, summed over periods, and must agree to the cent; per usage record the
   ledger's milliseconds must equal its duration (fewer: lost; more: counted twice);
6. keep the rows: the next trial's usage records have greater ids, and only those are compared (a
   per-trial DELETE costs more than the comparison). The trial tenants' rows from an earlier run are
   deleted when the harness starts; the CI test's database is flushed after it, the bench's dropped.

Trials alternate between a worker kind and a relay kind, so that a spare booting after a kill has a
trial's time to get ready; each kind walks through every (point, batch) pair of its driver in turn
(``plan``), so 200 trials try every pair of every kind, the same way on every run. The flush's
uninterrupted duration is still measured (calibration), each such flush checked against the truth.

Prefork notices a dead pool child through the child's sentinel, but when it wakes before the kernel
has made the child waitable it finds nothing and only its 5-second maintenance timer sees the death
later (celery 5.7); so the harness holds the worker's main process with SIGSTOP for the few
milliseconds the child takes to die. That changes nothing the trial checks and keeps a trial around
a second.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from billing import crashpoints

ROOT = Path(__file__).resolve().parents[1]

KINDS = ("worker_child", "worker", "worker_connection", "relay", "relay_connection")
WORKER_KINDS = frozenset({"worker_child", "worker", "worker_connection"})

BOUNDARY = datetime(2026, 11, 1, tzinfo=UTC)  # trial usage straddles this month end
INGEST_NOW = datetime(2026, 11, 20, tzinfo=UTC)  # "now" for ingest's lateness check: fixed, so runs agree
FLAVORS = ("h100-sxm", "a100-sxm", "ascend-910b", "tpu-v4", "mi300x")  # mi300x: priced per NAU-hour
BOOK = "crash-trials"
PRICES = (  # (resource, per hour, from): 12 decimals, and an H100 price change inside the trial window
    ("nau", Decimal("2.718281828459"), date(2026, 1, 1)),
    ("h100-sxm", Decimal("4.123456789012"), date(2026, 1, 1)),
    ("h100-sxm", Decimal("4.499999999999"), date(2026, 11, 2)),
    ("a100-sxm", Decimal("2.100000000001"), date(2026, 1, 1)),
    ("ascend-910b", Decimal("1.650000000007"), date(2026, 1, 1)),
    ("tpu-v4", Decimal("1.949999999993"), date(2026, 1, 1)),
)
TENANTS = 5
JOBS_PER_TENANT = 4
RELAY_BATCH = 200
RELAY_INTERVAL_MS = 20
POINTS = crashpoints.POINTS
IN_TRANSACTION_POINTS = frozenset(POINTS) - {"committed"}
# After a pool child's kill, how long the worker may take to notice it and to get the lost task's message
# back (0.1-0.6 s; a second or more on a busy machine).
LOST_WORKER_GRACE_S = 10.0
FINISH_TIMEOUT_S = 60.0
# The expected flush duration (a figure; no kill is timed by it) is the median of the last few
# uninterrupted flushes, one more of each measured, and checked against the truth, every
# RECALIBRATE_EVERY trials.
CALIBRATION_WINDOW = 3
RECALIBRATE_EVERY = 20
BOOT_TIMEOUT_S = 90.0


def database_url(settings_dict: dict[str, Any]) -> str:
    """The URL of the database Django uses now (the test database under pytest), for child processes."""
    user = settings_dict.get("USER") or "postgres"
    password = f":{settings_dict['PASSWORD']}" if settings_dict.get("PASSWORD") else ""
    host = settings_dict.get("HOST") or "127.0.0.1"
    port = settings_dict.get("PORT") or 5432
    return f"postgres://{user}{password}@{host}:{port}/{settings_dict['NAME']}"


# --- usage and the ground truth ---------------------------------------------------------------------


def make_usage(trial: int, records: int, tenant_ids: Sequence[int], *, seed: int = 0) -> list[Any]:
    """The trial's usage: deterministic for (seed, trial), unique keys, a third across the month end."""
    from billing.contracts import UsageInterval

    rng = random.Random(f"{seed}:{trial}")
    intervals = []
    for i in range(records):
        tenant_index = rng.randrange(len(tenant_ids))
        flavor = rng.choice(FLAVORS)
        job = 9_000_000 + tenant_index * 100 + rng.randrange(JOBS_PER_TENANT)
        # Starts up to 3 days before the boundary; a third last long enough to cross it.
        start = BOUNDARY - timedelta(seconds=rng.uniform(1, 3 * 86_400), microseconds=rng.randrange(1000))
        if rng.random() < 1 / 3:
            length = timedelta(days=3, seconds=rng.uniform(1, 86_400))
        else:
            length = timedelta(seconds=rng.uniform(0.001, 3_600))
        intervals.append(
            UsageInterval(
                key=f"crash-{seed}-{trial}-{i}",
                tenant_id=tenant_ids[tenant_index],
                job_id=job,
                device_id=f"{flavor}-{rng.randrange(4)}/{rng.randrange(8)}",
                flavor=flavor,
                started_at=start,
                ended_at=start + length,
                nau_milli=rng.randrange(250, 4000),
            )
        )
    return intervals


def truth_ms(intervals: Iterable[Any]) -> dict[str, int]:
    from billing import rating

    return {i.key: rating.epoch_ms(i.ended_at) - rating.epoch_ms(i.started_at) for i in intervals}


def rate_by_tenant_flavor(
    rows: Iterable[tuple[int, str, date, int, int, int, int]], books: dict[int, Any]
) -> dict[tuple[int, str], Decimal]:
    """(tenant, flavor, period, job, start ms, ms, nau_milli) rows to money per (tenant, flavor): rated
    with billing.rating per period (lines rounded once each), summed over periods."""
    from billing import rating

    grouped: dict[tuple[int, str, date], list[Any]] = defaultdict(list)
    for tenant_id, flavor, period, job_id, start_ms, ms, nau_milli in rows:
        grouped[tenant_id, flavor, period].append(rating.RatedUsage(job_id, flavor, period, start_ms, ms, nau_milli))
    money: dict[tuple[int, str], Decimal] = defaultdict(lambda: Decimal("0.00"))
    for (tenant_id, flavor, period), usages in grouped.items():
        money[tenant_id, flavor] += rating.rate(usages, books[tenant_id], period).total
    return dict(money)


def truth_rows(intervals: Iterable[Any]) -> list[tuple[int, str, date, int, int, int, int]]:
    """The ground truth: each interval cut at month ends, straight from what was sent."""
    from billing import rating

    rows = []
    for i in intervals:
        start = rating.epoch_ms(i.started_at)
        for period, piece_start, piece_ms in rating.split_by_period(start, rating.epoch_ms(i.ended_at) - start):
            rows.append((i.tenant_id, i.flavor, period, i.job_id, piece_start, piece_ms, i.nau_milli))
    return rows


@dataclass
class Comparison:
    mismatch_cents: int = 0
    lost: int = 0
    doubled: int = 0
    pairs: int = 0
    differences: list[str] = field(default_factory=list)


def compare_ledger(
    intervals: Sequence[Any],
    tenant_ids: Sequence[int],
    books: dict[int, Any] | None = None,
    *,
    after_record: int = 0,
) -> Comparison:
    """The ledger of these tenants against the intervals: cents per (tenant, flavor), ms per record.
    ``books``: each tenant's price book (billing.rating), read from the database when not given;
    ``after_record``: only entries of usage records with a greater id (those of one trial) count."""
    from billing import services
    from billing.models import LedgerEntry

    books = books or {t: services.price_book_for(t) for t in tenant_ids}
    rows = list(
        LedgerEntry.objects.filter(tenant_id__in=tenant_ids, record_id__gt=after_record).values_list(
            "record__key", "tenant_id", "flavor", "period", "job_id", "start_ms", "duration_ms", "nau_milli"
        )
    )
    ledger = rate_by_tenant_flavor((row[1:] for row in rows), books)
    truth = rate_by_tenant_flavor(truth_rows(intervals), books)
    result = Comparison(pairs=len(set(truth) | set(ledger)))
    for pair in sorted(set(truth) | set(ledger)):
        want, got = truth.get(pair, Decimal(0)), ledger.get(pair, Decimal(0))
        if want != got:
            result.mismatch_cents += int(abs(want - got) * 100)
            result.differences.append(f"tenant {pair[0]} {pair[1]}: ledger {got} != truth {want}")
    expected = truth_ms(intervals)
    posted: Counter[str] = Counter()
    for key, *_, ms, _nau in rows:
        posted[key] += ms
    for key, ms in expected.items():
        got_ms = posted.get(key, 0)
        if got_ms < ms:
            result.lost += 1
        elif got_ms > ms:
            result.doubled += 1
    result.doubled += len(set(posted) - set(expected))  # entries for usage nobody sent
    return result


def setup_tenants(count: int = TENANTS) -> list[int]:
    """Trial tenants billed from a price book of their own (12-decimal prices, a change mid-window)."""
    from billing.models import BillingAccount, Price, PriceBook
    from tenants.models import Tenant

    book, _ = PriceBook.objects.get_or_create(name=BOOK, defaults={"description": "crash trials"})
    for resource, per_hour, effective_from in PRICES:
        Price.objects.get_or_create(
            book=book, resource=resource, effective_from=effective_from, defaults={"per_hour": per_hour}
        )
    ids = []
    for n in range(count):
        tenant, _ = Tenant.objects.get_or_create(slug=f"crash-trials-{n}", defaults={"name": f"Crash trials {n}"})
        BillingAccount.objects.update_or_create(tenant=tenant, defaults={"price_book": book})
        ids.append(tenant.pk)
    return ids


def last_record_id() -> int:
    """Usage records of a trial all have greater ids: nothing else writes usage meanwhile."""
    from django.db.models import Max

    from billing.models import UsageRecord

    return UsageRecord.objects.aggregate(last=Max("id"))["last"] or 0


def delete_usage(tenant_ids: Sequence[int]) -> None:
    """Drop these tenants' usage, outbox and ledger rows (DELETE, not TRUNCATE, which would wait on any
    transaction a parked relay holds open)."""
    from django.db import connection

    from billing.models import LedgerEntry, UsageOutbox, UsageRecord

    ledger, outbox, records = (m._meta.db_table for m in (LedgerEntry, UsageOutbox, UsageRecord))
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {ledger} WHERE tenant_id = ANY(%s)", [list(tenant_ids)])
        cursor.execute(
            f"DELETE FROM {outbox} WHERE record_id IN (SELECT id FROM {records} WHERE tenant_id = ANY(%s))",
            [list(tenant_ids)],
        )
        cursor.execute(f"DELETE FROM {records} WHERE tenant_id = ANY(%s)", [list(tenant_ids)])


def outbox_count() -> int:
    from billing.models import UsageOutbox

    return UsageOutbox.objects.count()


def backend_of(application_name: str) -> tuple[int, str, str] | None:
    """(pid, state, query) of a live backend with this application name, busiest first."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, coalesce(state, ''), left(coalesce(query, ''), 80) FROM pg_stat_activity "
            "WHERE application_name = %s AND datname = current_database() "
            "ORDER BY (state = 'active') DESC, (state = 'idle in transaction') DESC, backend_start DESC LIMIT 1",
            [application_name],
        )
        row = cursor.fetchone()
    return (int(row[0]), row[1], row[2]) if row else None


def terminate_backend(pid: int) -> bool:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        return bool(cursor.fetchone()[0])


# --- processes --------------------------------------------------------------------------------------


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if stat[1] == str(pid) and stat[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return found


class Process:
    """A child in a session of its own (so kill -9 of its group takes its pool child too), logging to a file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path, *, stdin: Any = None) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("wb")
        # Its billing.crashpoints folder: a trial arms a point there and waits for the hold.
        self.points = log_dir / "points" / name
        self.points.mkdir(parents=True)
        self.popen = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=dict(env, **{crashpoints.ENV: str(self.points)}),
            stdin=stdin,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid = self.popen.pid
        self.started = time.monotonic()
        self._offset = 0
        self.stopped = False  # SIGSTOPped by us

    def alive(self) -> bool:
        return self.popen.poll() is None

    def read_new(self) -> str:
        with self.log_path.open("rb") as log:
            log.seek(self._offset)
            data = log.read()
        # Only whole lines: a line being written is read on the next call.
        cut = data.rfind(b"\n") + 1
        self._offset += cut
        return data[:cut].decode(errors="replace")

    def wait_for(self, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.log_path.read_text(errors="replace"):
            if not self.alive():
                raise RuntimeError(f"{self.name} exited ({self.popen.returncode}): {self.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: no {text!r} within {timeout_s} s: {self.tail()}")
            time.sleep(0.02)

    def tail(self, chars: int = 2000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def arm(self, trial_id: str, point: str, skip: int) -> None:
        """Hold at the ``skip + 1``-th arrival at ``point`` from now on (billing.crashpoints)."""
        self.unhold()
        staged = self.points / "arm.tmp"
        staged.write_text(json.dumps({"id": trial_id, "point": point, "skip": skip}))
        staged.rename(self.points / "arm")  # atomic: the process never reads half an arm

    def wait_held(self, timeout_s: float) -> bool:
        """Until the process holds at the armed point (True), or ``timeout_s`` passed or it died (False)."""
        deadline = time.monotonic() + timeout_s
        while not (self.points / "held").exists():
            if time.monotonic() > deadline or not self.alive():
                return (self.points / "held").exists()
            time.sleep(0.002)
        return True

    def unhold(self) -> None:
        """Let a held process go on, and disarm a point it did not reach."""
        for name in ("held", "arm"):
            (self.points / name).unlink(missing_ok=True)

    def kill_group(self) -> None:
        """kill -9 the process and everything in its session, then reap it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.popen.wait(timeout=30)

    def request_stop(self) -> None:
        """Ask it to end (SIGTERM to its group), continuing it first if we stopped it."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                if self.stopped:
                    os.killpg(self.pid, signal.SIGCONT)
                os.killpg(self.pid, signal.SIGTERM)

    def finish_stop(self, deadline: float) -> None:
        """Wait for it until ``deadline`` (monotonic), then kill -9 whatever is left of its group (a
        group id stays taken while any member lives, so this reaches only what it started)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.popen.wait(timeout=30)
        self._log.close()


LOST = "Task handler raised error: WorkerLostError"


def _task_ended(line: str) -> bool:
    """A worker's log line saying a relay task ended: it succeeded, raised, or lost its pool child."""
    if "relay_usage[" in line and ("] succeeded in" in line or "] raised " in line):
        return True
    return LOST in line


class Worker(Process):
    """``celery -A controlplane worker --pool prefork --concurrency 1`` on a queue of its own."""

    def __init__(self, name: str, env: dict[str, str], log_dir: Path) -> None:
        argv = [
            sys.executable, "-m", "celery", "-A", "controlplane", "worker",
            "--pool", "prefork", "--concurrency", "1", "-Q", name, "-n", f"{name}@%h",
            "--without-mingle", "--without-gossip", "--without-heartbeat", "--loglevel", "INFO",
        ]  # fmt: skip
        super().__init__(name, argv, dict(env, PGAPPNAME=name), log_dir)
        self.received: Counter[str] = Counter()
        self.finished = 0  # tasks that succeeded, raised, or lost their pool child
        self.receptions = 0
        self.lost = 0  # tasks whose pool child died under them
        self.exited: set[int] = set()  # pool children whose death the worker noticed
        self.sent = 0  # tasks sent to its queue

    def scan(self) -> None:
        for line in self.read_new().splitlines():
            if "billing.tasks.relay_usage[" in line and "] received" in line:
                self.receptions += 1
                self.received[line.split("relay_usage[", 1)[1].split("]", 1)[0]] += 1
            elif _task_ended(line):
                self.finished += 1
                self.lost += LOST in line
            elif " exited with " in line and " pid:" in line:
                self.exited.add(int(line.split(" pid:", 1)[1].split()[0]))

    def idle(self) -> bool:
        """Every task sent to it has arrived, and every task that arrived has ended."""
        self.scan()
        return len(self.received) >= self.sent and self.receptions == self.finished

    def child(self) -> int | None:
        children = _children(self.pid)
        return children[0] if children else None

    def ready(self) -> bool:
        return " ready." in self.log_path.read_text(errors="replace")

    def kill_child(self, child: int) -> None:
        """kill -9 the pool child, with the main process held still (SIGSTOP) until the child is a zombie.

        Prefork notices a dead child through its sentinel, but if it wakes before the kernel has made
        the child waitable it drops the sentinel and finds the death only at its 5-second maintenance
        timer (celery 5.7). Holding the main process for the few milliseconds the child takes to die
        changes nothing that the trial checks and keeps the redelivery prompt."""
        os.kill(self.pid, signal.SIGSTOP)
        try:
            os.kill(child, signal.SIGKILL)
            deadline = time.monotonic() + 2
            while _state(child) not in ("Z", "X", "") and time.monotonic() < deadline:
                time.sleep(0.001)
        finally:
            os.kill(self.pid, signal.SIGCONT)


RELAY_LAUNCHER = """
import os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
import django
django.setup()
from django.core.management import execute_from_command_line
import billing.management.commands.relay_usage  # noqa: F401  (imported now, not when released)
print(f"launcher {sys.argv[1]} ready: release me with a line on stdin", flush=True)
sys.stdin.readline()
execute_from_command_line(["manage.py", "relay_usage", *sys.argv[2:]])
"""


class Relay(Process):
    """``manage.py relay_usage --loop``, booted in advance and released with a line on stdin."""

    def __init__(self, name: str, env: dict[str, str], log_dir: Path) -> None:
        argv = [
            sys.executable, "-c", RELAY_LAUNCHER, name,
            "--loop", "--batch", str(RELAY_BATCH), "--interval-ms", str(RELAY_INTERVAL_MS),
        ]  # fmt: skip
        super().__init__(name, argv, dict(env, PGAPPNAME=name), log_dir, stdin=subprocess.PIPE)
        self.released = False

    def release(self, timeout_s: float = BOOT_TIMEOUT_S) -> None:
        self.wait_for(f"launcher {self.name} ready", timeout_s)
        assert self.popen.stdin is not None
        self.popen.stdin.write(b"go\n")
        self.popen.stdin.flush()
        self.wait_for("relaying the usage outbox", timeout_s)
        self.released = True

    def park(self) -> None:
        """SIGSTOP it so that it takes no part in a worker's trial; the caller makes sure the outbox is
        empty, so whatever transaction it is stopped in holds no row."""
        if not self.stopped:
            os.kill(self.pid, signal.SIGSTOP)
            self.stopped = True

    def resume(self) -> None:
        if self.stopped:
            os.kill(self.pid, signal.SIGCONT)
            self.stopped = False


# --- trials -----------------------------------------------------------------------------------------


@dataclass
class Trial:
    n: int
    kind: str
    records: int
    kill_at_s: float  # from the flush's start to the kill (the victim held at the planned point)
    expected_s: float
    point: str = ""  # the planned point of the flush (billing.crashpoints) ...
    batch: int = 0  # ... in this batch of the flush (0: the first)
    held: bool = False  # the victim held at the planned point, and was killed there
    expected_outbox: int = -1  # the outbox that the planned point implies: what the kill must find
    outbox_at_kill: int = -1
    backend_state: str = ""  # the victim's backend just before the kill: active, idle in transaction, idle, none
    backend_query: str = ""
    ingest_s: float = 0.0  # writing the trial's usage (and sending the task)
    finish_s: float = 0.0  # the kill to the flush finished by a fresh relay
    check_s: float = 0.0  # comparing with the truth
    worker_lost: bool = False  # worker_child: the worker saw its child die under the task (WorkerLostError)
    requeued: bool = False  # worker_child: the killed task's message was delivered again
    extra_tasks: int = 0  # relay tasks sent to finish (the killed worker's, or after a failed one)
    mismatch_cents: int = 0
    lost: int = 0
    doubled: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def mid_flush(self) -> bool:
        """Some batches of the flush were committed at the kill, not all."""
        return 0 < self.outbox_at_kill < self.records

    @property
    def in_transaction(self) -> bool:
        return self.backend_state in ("active", "idle in transaction")

    @property
    def inside_flush(self) -> bool:
        """Mid-way, or inside the first batch's transaction (nothing committed yet, but rows claimed)."""
        return self.mid_flush or (self.outbox_at_kill == self.records and self.in_transaction)

    @property
    def as_planned(self) -> bool:
        """Held at the planned point; the outbox and the backend were as that point implies."""
        return (
            self.held
            and self.outbox_at_kill == self.expected_outbox
            and self.in_transaction == (self.point in IN_TRANSACTION_POINTS)
        )


def batch_size(driver: str) -> int:
    """Outbox rows per transaction: the Celery task's (billing.services.RELAY_BATCH) or the relay's."""
    from billing import services

    return services.RELAY_BATCH if driver == "worker" else RELAY_BATCH


def batches(driver: str, records: int) -> int:
    return max(1, math.ceil(records / batch_size(driver)))


def expected_outbox(driver: str, point: str, batch: int, records: int) -> int:
    """The outbox left at ``point`` of batch ``batch``: the batches before it committed, and this one
    too once at ``committed``; an uncommitted batch's work is invisible to others, and lost in a kill."""
    committed = batch + (point == "committed")
    return max(0, records - committed * batch_size(driver))


class CrashTrials:
    """Workers, relays and the trial loop; a context manager that stops every process it started."""

    def __init__(
        self,
        database_url: str,
        work_dir: Path,
        *,
        records: int = 800,
        seed: int = 0,
        log: Callable[[str], None] = print,
    ) -> None:
        from django.conf import settings

        self.records = records
        self.seed = seed
        self.say = log
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.env = dict(
            os.environ,
            DATABASE_URL=database_url,
            CELERY_BROKER_URL=settings.CELERY_BROKER_URL,
            DJANGO_SETTINGS_MODULE="controlplane.settings",
            PYTHONUNBUFFERED="1",
            # The harness follows each task by the worker's "received" and "succeeded" lines, which only
            # the DEBUG level keeps (controlplane.logs quiets them otherwise).
            POLYCHIP_LOG_LEVEL="DEBUG",
        )
        self.env.pop("PGAPPNAME", None)
        self._names = 0
        self.tenant_ids: list[int] = []
        self.books: dict[int, Any] = {}
        self.worker: Worker | None = None
        self.spare_worker: Worker | None = None
        self.relay: Relay | None = None
        self.spare_relay: Relay | None = None
        self.retired: list[Process] = []
        self.expected: dict[str, float] = {}
        self.calibration: dict[str, list[float]] = defaultdict(list)
        self._calibrations = 0
        self.tasks_sent = 0
        self.results: list[Trial] = []

    # processes

    @property
    def prefix(self) -> str:
        """In every process name (a worker's queue, a relay's argv), so leftovers can be found."""
        return f"billing-crash-{os.getpid()}-"

    def _name(self, what: str) -> str:
        self._names += 1
        return f"{self.prefix}{what}{self._names}"

    def _new_worker(self) -> Worker:
        return Worker(self._name("worker"), self.env, self.work_dir)

    def _new_relay(self) -> Relay:
        return Relay(self._name("relay"), self.env, self.work_dir)

    def __enter__(self) -> CrashTrials:
        from billing import services

        self.tenant_ids = setup_tenants()
        self.books = {t: services.price_book_for(t) for t in self.tenant_ids}
        delete_usage(self.tenant_ids)
        self.worker, self.spare_worker = self._new_worker(), self._new_worker()
        self.relay, self.spare_relay = self._new_relay(), self._new_relay()
        self.worker.wait_for(" ready.", BOOT_TIMEOUT_S)
        self.relay.release()
        self.relay.park()
        # The spares finish booting before anything is measured, so their start does not slow the flushes.
        self.spare_worker.wait_for(" ready.", BOOT_TIMEOUT_S)
        self.spare_relay.wait_for(f"launcher {self.spare_relay.name} ready", BOOT_TIMEOUT_S)
        return self

    def __exit__(self, *exc: object) -> None:
        processes = [p for p in (self.worker, self.spare_worker, self.relay, self.spare_relay, *self.retired) if p]
        for process in processes:
            process.request_stop()
        deadline = time.monotonic() + 15
        for process in processes:
            process.finish_stop(deadline)

    def _promote_worker(self) -> Worker:
        assert self.worker is not None and self.spare_worker is not None
        self.retired.append(self.worker)
        self.worker, self.spare_worker = self.spare_worker, self._new_worker()
        self.worker.wait_for(" ready.", BOOT_TIMEOUT_S)
        return self.worker

    def _promote_relay(self) -> Relay:
        assert self.relay is not None and self.spare_relay is not None
        self.retired.append(self.relay)
        self.relay, self.spare_relay = self.spare_relay, self._new_relay()
        self.relay.release()
        return self.relay

    def _send(self, worker: Worker) -> str:
        from controlplane.celery import app

        self.tasks_sent += 1
        worker.sent += 1
        return app.send_task("billing.tasks.relay_usage", queue=worker.name).id

    # one flush

    def _start(self, driver: str, intervals: Sequence[Any]) -> tuple[float, str | None]:
        """Ingest the trial's usage and start the flush; returns when it started and the task's id."""
        from billing import services

        assert self.worker is not None and self.relay is not None
        if driver == "worker":
            self.relay.park()
        else:
            self.relay.resume()
        services.ingest_usage(intervals, now=INGEST_NOW)  # committed: a running relay starts on it now
        if driver == "worker":
            return time.monotonic(), self._send(self.worker)
        return time.monotonic(), None

    def _wait_redelivery(self, trial: Trial, child: int, task_id: str, lost_before: int) -> None:
        """After a pool child's kill: once the worker has noticed the death, a task it reports lost
        (WorkerLostError) must come back and run again (acks_late, reject_on_worker_lost)."""
        assert self.worker is not None
        deadline = time.monotonic() + LOST_WORKER_GRACE_S
        while child not in self.worker.exited:
            if time.monotonic() > deadline:
                trial.problems.append(f"the worker did not notice its child's death in {LOST_WORKER_GRACE_S} s")
                return
            time.sleep(0.01)
            self.worker.scan()
        # The task under the dead child is reported lost a moment after the death; one that had ended,
        # or not yet reached the child, leaves the worker idle or busy with it as usual.
        while self.worker.lost == lost_before and not self.worker.idle():
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        trial.worker_lost = self.worker.lost > lost_before
        while trial.worker_lost and self.worker.received[task_id] < 2:
            if time.monotonic() > deadline:
                trial.problems.append(f"the lost task's message did not come back in {LOST_WORKER_GRACE_S} s")
                return
            time.sleep(0.01)
            self.worker.scan()
        trial.requeued = self.worker.received[task_id] > 1

    def _wait_finished(self, driver: str, trial: Trial | None = None, *, poll_s: float = 0.01) -> None:
        """Until the outbox is empty and the worker idle; a worker idle with rows left gets a fresh task,
        as beat would send one."""
        assert self.worker is not None
        deadline = time.monotonic() + FINISH_TIMEOUT_S
        while True:
            left = outbox_count()
            idle = self.worker.idle() if driver == "worker" else True
            if left == 0 and idle:
                return
            if driver == "worker" and idle:
                self._send(self.worker)
                if trial is not None:
                    trial.extra_tasks += 1
            if driver == "relay" and self.relay is not None and not self.relay.alive():
                raise RuntimeError(f"{self.relay.name} died: {self.relay.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the flush did not finish within {FINISH_TIMEOUT_S} s ({left} outbox rows left)")
            time.sleep(poll_s)

    def calibrate(self, flushes: int = 3, *, quiet: bool = False) -> dict[str, float]:
        """The flush's duration, uninterrupted, for the worker and the relay: from its start to the
        creation of the last ledger entry, read afterwards so that no polling slows it. The expected
        duration is the median of the last few. Each such flush must agree with the truth."""
        from django.db.models import Max

        from billing.models import LedgerEntry

        for driver in ("worker", "relay"):
            for _ in range(flushes):
                self._calibrations += 1
                intervals = make_usage(-self._calibrations, self.records, self.tenant_ids, seed=self.seed)
                floor = last_record_id()
                began, _ = self._start(driver, intervals)
                started = time.time() - (time.monotonic() - began)  # the wall clock, as created_at is
                time.sleep(0.2)
                self._wait_finished(driver, poll_s=0.05)
                last = LedgerEntry.objects.filter(record_id__gt=floor).aggregate(last=Max("created_at"))
                duration = last["last"].timestamp() - started + 0.005  # + its batch's DELETE and COMMIT
                comparison = compare_ledger(intervals, self.tenant_ids, self.books, after_record=floor)
                if comparison.mismatch_cents or comparison.lost or comparison.doubled:
                    raise AssertionError(f"an uninterrupted {driver} flush disagrees with the truth: {comparison}")
                self.calibration[driver].append(round(duration, 4))
            self.expected[driver] = statistics.median(self.calibration[driver][-CALIBRATION_WINDOW:])
        if not quiet:
            self.say(
                "calibration: flush of "
                + ", ".join(f"{d} {self.expected[d]:.3f} s" for d in self.expected)
                + f" for {self.records} records"
            )
        return self.expected

    def trial(self, n: int, kind: str, point: str = "claimed", batch: int = 0) -> Trial:
        """Kill ``kind``'s victim held at ``point`` of the flush's batch ``batch`` (see ``plan``)."""
        assert self.worker is not None and self.relay is not None
        assert point in POINTS, point
        driver = "worker" if kind in WORKER_KINDS else "relay"
        assert 0 <= batch < batches(driver, self.records), (driver, batch)
        trial = Trial(n, kind, self.records, kill_at_s=0.0, expected_s=self.expected.get(driver, 0.0))
        trial.point, trial.batch = point, batch
        trial.expected_outbox = expected_outbox(driver, point, batch, self.records)
        intervals = make_usage(n, self.records, self.tenant_ids, seed=self.seed)
        victim: Process = self.worker if driver == "worker" else self.relay
        child = self.worker.child() if kind == "worker_child" else None
        self.worker.scan()
        lost_before = self.worker.lost
        floor = last_record_id()
        victim.arm(f"{self.prefix}trial{n}", point, skip=batch)
        began = time.monotonic()
        started, task_id = self._start(driver, intervals)
        trial.ingest_s = started - began
        trial.held = victim.wait_held(FINISH_TIMEOUT_S)
        trial.kill_at_s = time.monotonic() - started
        if not trial.held:
            trial.problems.append(f"{victim.name} never reached {point} of batch {batch} in {FINISH_TIMEOUT_S} s")
        backend = backend_of(victim.name)
        trial.backend_state, trial.backend_query = (backend[1], backend[2]) if backend else ("none", "")
        if kind == "worker_child":
            if child is None:
                trial.problems.append("the worker had no pool child to kill")
            else:
                self.worker.kill_child(child)
        elif kind == "worker":
            self.worker.kill_group()
        elif kind == "relay":
            self.relay.kill_group()
        elif backend is not None:  # worker_connection, relay_connection
            terminate_backend(backend[0])
        killed = time.monotonic()
        trial.outbox_at_kill = outbox_count()
        victim.unhold()  # a victim whose connection was cut goes on, into the cut
        if trial.held and not trial.as_planned:
            trial.problems.append(
                f"held at {point} of batch {batch}, the kill found {trial.outbox_at_kill} outbox rows (expected "
                f"{trial.expected_outbox}) and the backend {trial.backend_state!r} (in a transaction: "
                f"{point in IN_TRANSACTION_POINTS})"
            )
        try:
            if kind == "worker":
                self._send(self._promote_worker())  # the old worker's message stays unacked with it
                trial.extra_tasks += 1
            elif kind == "relay":
                self._promote_relay()
            if kind == "worker_child" and child is not None and task_id is not None:
                self._wait_redelivery(trial, child, task_id, lost_before)
            self._wait_finished(driver, trial)
        except RuntimeError as exc:
            trial.problems.append(str(exc))
            from billing import services

            services.relay_usage()  # finish here, so the comparison still says what the ledger holds
        trial.finish_s = time.monotonic() - killed
        checking = time.monotonic()
        comparison = compare_ledger(intervals, self.tenant_ids, self.books, after_record=floor)
        trial.mismatch_cents, trial.lost, trial.doubled = comparison.mismatch_cents, comparison.lost, comparison.doubled
        trial.problems += comparison.differences[:5]
        trial.check_s = time.monotonic() - checking
        return trial

    def run(self, trials: int, *, every: int = 20) -> dict[str, Any]:
        """``trials`` trials (see ``schedule``); the summary of figures."""
        started = time.monotonic()
        if not self.expected:
            self.calibrate()
        results = self.results = []
        for n, (kind, point, batch) in enumerate(plan(trials, self.records, self.seed)):
            if n and n % RECALIBRATE_EVERY == 0:
                self.calibrate(1, quiet=True)
            results.append(self.trial(n, kind, point, batch))
            if (n + 1) % every == 0 or n + 1 == trials:
                bad = sum(1 for r in results if r.mismatch_cents or r.lost or r.doubled or r.problems)
                expected = ", ".join(f"{d} {v:.3f} s" for d, v in self.expected.items())
                self.say(
                    f"  {n + 1}/{trials} crash trials, {bad} with a problem, {time.monotonic() - started:.0f} s "
                    f"(expected flush: {expected})"
                )
        return summarize(results, self, time.monotonic() - started)


def schedule(trials: int, seed: int = 0) -> list[str]:
    """Worker and relay kinds in turn (a worker's spare boots while relays are tried, and back), each
    side cycling through its kinds in shuffled rounds."""
    rng = random.Random(f"kinds:{seed}")
    sides: list[list[str]] = [[], []]
    for side, kinds in zip(sides, (sorted(WORKER_KINDS), [k for k in KINDS if k not in WORKER_KINDS]), strict=True):
        while len(side) < trials:
            rotation = list(kinds)
            rng.shuffle(rotation)
            side += rotation
    return [sides[n % 2][n // 2] for n in range(trials)]


def plan(trials: int, records: int, seed: int = 0) -> list[tuple[str, str, int]]:
    """(kind, point, batch) per trial: the kinds of ``schedule``; the j-th trial of a kind holds at
    point j mod 4 of batch (j + j div 4) mod (its driver's batches), so the first 4 x batches trials
    of a kind try each (point, batch) pair once (the relay's 4 batches: 16; the worker's 1: 4), each
    point early on and the batches mixed, the same way on every run."""
    seen: Counter[str] = Counter()
    planned = []
    for kind in schedule(trials, seed):
        j = seen[kind]
        seen[kind] += 1
        count = batches("worker" if kind in WORKER_KINDS else "relay", records)
        planned.append((kind, POINTS[j % len(POINTS)], (j + j // len(POINTS)) % count))
    return planned


def summarize(results: Sequence[Trial], harness: CrashTrials | None = None, wall_s: float = 0.0) -> dict[str, Any]:
    n = len(results)
    by_kind = Counter(r.kind for r in results)
    states = Counter(r.backend_state or "none" for r in results)
    in_transaction = sum(1 for r in results if r.in_transaction)
    child_kills = [r for r in results if r.kind == "worker_child"]
    lost_tasks = [r for r in child_kills if r.worker_lost]
    summary: dict[str, Any] = {
        "crash_trials": n,
        "ledger_mismatch_cents": sum(r.mismatch_cents for r in results),
        "lost_records": sum(r.lost for r in results),
        "double_counted_records": sum(r.doubled for r in results),
        "trials_with_problems": sum(1 for r in results if r.problems or r.mismatch_cents or r.lost or r.doubled),
        "by_kind": dict(sorted(by_kind.items())),
        "records_per_trial": results[0].records if results else 0,
        "mid_flush_share": round(sum(r.mid_flush for r in results) / n, 3) if n else 0.0,
        "outbox_full_at_kill": sum(1 for r in results if r.outbox_at_kill == r.records),
        "outbox_empty_at_kill": sum(1 for r in results if r.outbox_at_kill == 0),
        "in_transaction_share": round(in_transaction / n, 3) if n else 0.0,
        "inside_flush_share": round(sum(r.inside_flush for r in results) / n, 3) if n else 0.0,
        "backend_states_at_kill": dict(sorted(states.items())),
        # Each trial's victim held at its planned point (billing.crashpoints) and the kill found the outbox
        # and the backend as that point implies; which (kind, point) pairs were tried, how often.
        "held_as_planned": sum(1 for r in results if r.as_planned),
        "by_kind_point": dict(sorted(Counter(f"{r.kind}@{r.point}" for r in results).items())),
        "by_point_batch": dict(sorted(Counter(f"{r.point}#{r.batch}" for r in results).items())),
        # Pool children killed under a running task (the worker reported WorkerLostError; a kill that
        # lands before the child takes the task or after it ended does not), and how many of those
        # tasks' messages came back and ran again.
        "child_kills_under_task": len(lost_tasks),
        "redelivered_after_child_kill": sum(r.requeued for r in lost_tasks),
        "extra_relay_tasks": sum(r.extra_tasks for r in results),
        "trial_s_median": {
            phase: round(statistics.median(getattr(r, f"{phase}_s") for r in results), 3) if n else 0.0
            for phase in ("ingest", "kill_at", "finish", "check")
        },
        "finish_s_median_by_kind": {
            kind: round(statistics.median(r.finish_s for r in results if r.kind == kind), 3) for kind in sorted(by_kind)
        },
        "wall_s": round(wall_s, 1),
        "problems": [f"trial {r.n} ({r.kind}): {p}" for r in results for p in r.problems][:20],
    }
    if harness is not None:
        summary["expected_flush_s"] = {k: round(v, 3) for k, v in harness.expected.items()}
        summary["calibration_flushes_s"] = {k: list(v) for k, v in harness.calibration.items()}
    return summary


def trial_rows(results: Sequence[Trial]) -> list[dict[str, Any]]:
    return [
        asdict(r) | {"mid_flush": r.mid_flush, "inside_flush": r.inside_flush, "as_planned": r.as_planned}
        for r in results
    ]
