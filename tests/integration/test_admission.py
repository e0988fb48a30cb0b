"""Admission against quotas, on PostgreSQL: caps, NAU charges, cohorts, preemption, reasons, races.

The admission cycle is called directly, as the Celery task would call it; no worker runs, so
admitted jobs stay admitted until a test ends them. The demo pool has 2 h100-sxm, 2 a100-sxm,
4 ascend-910b and 4 tpu-v4; one NAU is one a100-sxm.
"""

from __future__ import annotations

import random
import time
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from rest_framework.test import APIClient

from billing.models import UsageRecord
from controlplane.domain import Invalid
from jobs import dispatch, services, transitions
from jobs.admission import SERVED_SLACK
from jobs.models import AdmissionLock, AdmissionRequest, Allocation, JobEvent, JobState, TrainingJob
from runtime.jobspec import parse_job_spec
from tenants.models import Cohort, Quota, Tenant
from tests.conftest import make_tenant
from tests.threads import at_once

pytestmark = pytest.mark.integration


def quota(tenant, resource, nominal, borrowing=None, lending=None):
    Quota.objects.update_or_create(
        tenant_id=tenant.id,
        resource=resource,
        defaults={"nominal": nominal, "borrowing_limit": borrowing, "lending_limit": lending},
    )


def in_cohort(name, *tenant_fixtures):
    cohort, _ = Cohort.objects.get_or_create(name=name)
    Tenant.objects.filter(pk__in=[t.id for t in tenant_fixtures]).update(cohort=cohort)


def submit(tenant, devices, flavors=("ascend-910b",), priority=0, name="job", wait=False):
    spec = {"name": name, "devices": devices, "flavors": list(flavors), "priority": priority}
    if wait:
        spec["wait_for_capacity"] = True  # past what could ever be admitted: queued all the same
    return services.submit_job(tenant_id=tenant.id, user_id=None, spec=parse_job_spec(spec)).id


def job(job_id):
    return TrainingJob.objects.get(pk=job_id)


@pytest.fixture
def lab(db, pool):
    """Two tenants with no quota yet, and a third who must see nothing of theirs."""
    return make_tenant("acme", nau_quota=None), make_tenant("globex", nau_quota=None), make_tenant("initech")


def test_a_device_quota_caps_the_tenant_and_says_why(lab):
    acme = lab[0]
    quota(acme, "ascend-910b", 2)
    first = submit(acme, 2, name="first")
    second = submit(acme, 1, name="second")
    third = submit(acme, 1, name="third")
    assert services.admit_queued_jobs() == [first]
    waiting = job(second)
    assert waiting.state == JobState.QUEUED
    assert "2 of 2 ascend-910b in use by your tenant" in waiting.pending_reason
    positions = services.queue_positions(acme.id)
    assert (positions[second], positions[third]) == (1, 2)
    assert services.get_job(tenant_id=acme.id, job_id=third).queue_position == 2
    urgent = submit(acme, 1, priority=5, name="urgent")  # jumps the queue
    positions = services.queue_positions(acme.id)
    assert positions[urgent] == 1
    assert all(services.get_job(tenant_id=acme.id, job_id=j).queue_position == p for j, p in positions.items())
    services.cancel_job(tenant_id=acme.id, job_id=urgent)

    services.finish_job(first, JobState.SUCCEEDED)
    assert services.admit_queued_jobs() == [second, third]
    assert services.get_job(tenant_id=acme.id, job_id=second).queue_position is None
    assert job(second).pending_reason == ""


def test_no_quota_for_a_flavor_means_no_admission(lab):
    acme = lab[0]
    quota(acme, "ascend-910b", 4)
    with pytest.raises(Invalid, match="no quota for tpu-v4"):  # refused at submit: it could never start
        submit(acme, 1, flavors=("tpu-v4",))
    blocked = submit(acme, 1, flavors=("tpu-v4",), wait=True)
    assert services.admit_queued_jobs() == []
    assert "no quota for tpu-v4" in job(blocked).pending_reason


def test_a_nau_quota_charges_each_device_by_its_throughput(lab):
    acme = lab[0]
    quota(acme, "nau", "4.000")  # h100: 989/312 = 3.170 NAU; a100: 1.000; tpu-v4: 275/312 = 0.881
    fast = submit(acme, 1, flavors=("h100-sxm",))
    slow = submit(acme, 1, flavors=("a100-sxm",))
    assert services.admit_queued_jobs() == [fast]
    assert job(fast).demand == {"h100-sxm": 1, "nau": 3170}
    assert "NAU" in job(slow).pending_reason

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {acme.token}")
    body = client.get("/api/v1/quotas").json()
    assert body["quotas"] == [
        {
            "resource": "nau",
            "unit": "NAU",
            "nominal": 4.0,
            "borrowing_limit": None,
            "lending_limit": None,
            "in_use": 3.17,
            "borrowed": 0.0,
            "cohort": None,
            "cohort_can_lend": None,
        }
    ]
    queue = client.get("/api/v1/queue").json()["queue"]
    assert [(q["job"], q["position"]) for q in queue] == [(slow, 1)]
    # The third tenant sees none of it.
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {lab[2].token}")
    assert other.get("/api/v1/queue").json() == {"queue": []}


def test_a_tenant_reclaims_its_lent_quota_by_preempting_borrowed_work(lab):
    acme, globex, _ = lab
    in_cohort("lab", acme, globex)
    quota(acme, "ascend-910b", 2)
    quota(globex, "ascend-910b", 2)
    borrower = submit(globex, 4, name="borrower")
    assert services.admit_queued_jobs() == [borrower]
    assert job(borrower).borrowing is True

    owner = submit(acme, 2, name="owner")
    # Evict first, admit later: the owner gets the devices in the next cycle, once they are free.
    assert services.admit_queued_jobs() == []
    assert job(owner).pending_reason == f"making room: preempting job {borrower}"
    preempted = job(borrower)
    assert (preempted.state, preempted.attempt, preempted.preemptions) == (JobState.QUEUED, 1, 1)
    assert not Allocation.objects.filter(job_id=borrower, ended_at__isnull=True).exists()
    # The devices it held until then are metered, once each.
    assert UsageRecord.objects.filter(job_id=borrower).count() == 4
    event = JobEvent.objects.filter(job_id=borrower, to_state=JobState.QUEUED).last()
    assert "reclaimed" in event.message and event.data["preempted_by"] == owner
    # It waits now, and says why.
    assert services.admit_queued_jobs() == [owner]
    assert job(borrower).pending_reason


def test_one_cycle_preempts_several_victims_each_into_its_next_attempt(lab, monkeypatch):
    from jobs import dispatch
    from jobs.models import JobAttempt

    sent: list[tuple[str, list]] = []
    monkeypatch.setattr(dispatch, "after_commit_each", lambda name, args: sent.append((name, list(args))))
    acme, globex, _ = lab
    in_cohort("lab", acme, globex)
    quota(acme, "ascend-910b", 3)
    quota(globex, "ascend-910b", 1)
    singles = [submit(globex, 1, name=f"single-{i}") for i in range(4)]
    assert services.admit_queued_jobs() == singles  # one within its nominal quota, three borrowed
    borrowed = [j for j in singles if job(j).borrowing]
    assert len(borrowed) == 3
    JobAttempt.objects.filter(job_id=borrowed[0], number=0).update(backend_handle={"run": "launched"})
    devices_of = {
        j: list(Allocation.objects.filter(job_id=j).values_list("device__device_id", flat=True)) for j in borrowed
    }

    owner = submit(acme, 3, name="owner")
    sent.clear()
    assert services.admit_queued_jobs() == []

    for victim in borrowed:
        requeued = job(victim)
        assert (requeued.state, requeued.attempt, requeued.preemptions) == (JobState.QUEUED, 1, 1)
        ended = JobAttempt.objects.get(job_id=victim, number=0)
        assert ended.ended_as == JobState.QUEUED and ended.end_reason.startswith("reclaimed by tenant")
        assert JobAttempt.objects.get(job_id=victim, number=1).previous_devices == devices_of[victim]
        assert UsageRecord.objects.filter(job_id=victim).count() == 1
        event = JobEvent.objects.filter(job_id=victim, to_state=JobState.QUEUED).last()
        assert event.data == {"preempted_by": owner, "attempt": 1}
    assert job(singles[0]).state == JobState.ADMITTED  # its nominal share is never taken
    # Only an attempt that was launched has a run to tear down.
    assert ("jobs.tasks.teardown_job", [(borrowed[0],)]) in sent

    # Until its run is confirmed gone, that device is not free: the owner waits for it, keeping its
    # quota, and the victims (which would borrow) may not take the two free devices meanwhile; had
    # they, the owner would reclaim them again, cycle after cycle, while the run went.
    assert services.admit_queued_jobs() == []
    assert job(owner).pending_reason == (
        "waiting for devices being released (1 ascend-910b); its quota is kept for it meanwhile"
    )
    assert all(job(victim).state == JobState.QUEUED for victim in borrowed)
    JobAttempt.objects.filter(job_id=borrowed[0], number=0).update(torn_down_at=timezone.now())
    assert services.admit_queued_jobs() == [owner]


def test_priority_preempts_borrowed_work_but_never_a_nominal_share(lab):
    acme, globex, _ = lab
    in_cohort("lab", acme, globex)
    quota(acme, "ascend-910b", 2)
    quota(globex, "ascend-910b", 2)
    nominal = submit(acme, 2, name="nominal")
    borrowed = submit(acme, 2, name="borrowed")
    assert services.admit_queued_jobs() == [nominal, borrowed]
    assert (job(nominal).borrowing, job(borrowed).borrowing) == (False, True)

    urgent = submit(acme, 2, priority=10, name="urgent")
    assert services.admit_queued_jobs() == []
    assert job(borrowed).state == JobState.QUEUED
    assert services.admit_queued_jobs() == [urgent]
    assert job(nominal).state == JobState.ADMITTED

    # Nothing of higher priority takes the nominal share: only borrowed work can be preempted.
    top = submit(acme, 4, priority=1000, name="top")
    services.admit_queued_jobs()
    assert job(nominal).state == JobState.ADMITTED
    assert job(top).state == JobState.QUEUED
    # ...and a preemption that would not make room is not made at all.
    assert job(urgent).state == JobState.ADMITTED


def test_a_tenant_without_a_cohort_never_borrows(lab):
    acme = lab[0]
    quota(acme, "ascend-910b", 2, borrowing=2)
    with pytest.raises(Invalid, match="may hold at most 2"):
        submit(acme, 3)
    big = submit(acme, 3, wait=True)
    assert services.admit_queued_jobs() == []
    assert job(big).state == JobState.QUEUED


def test_an_old_attempt_cannot_move_the_new_one(lab):
    acme, globex, _ = lab
    in_cohort("lab", acme, globex)
    quota(acme, "ascend-910b", 2)
    quota(globex, "ascend-910b", 2)
    borrower = submit(globex, 4)
    services.admit_queued_jobs()
    submit(acme, 2)
    services.admit_queued_jobs()  # preempts the borrower: attempt 0 is over
    services.admit_queued_jobs()  # admits acme's job on the devices it gave back
    services.finish_job(TrainingJob.objects.filter(tenant_id=acme.id).get().pk, JobState.SUCCEEDED)
    services.admit_queued_jobs()  # the borrower comes back as attempt 1
    assert (job(borrower).state, job(borrower).attempt) == (JobState.ADMITTED, 1)
    from django.db import transaction

    with transaction.atomic():
        stale = transitions.claim(borrower, JobState.RUNNING, from_states=[JobState.ADMITTED], attempt=0, message="old")
    assert stale is None
    assert services.run_key(job(borrower)).endswith("-a1")


@pytest.mark.django_db(transaction=True)
def test_concurrent_submissions_never_overshoot_the_quota(tenants, pool):
    acme = make_tenant("racer", nau_quota=None)
    quota(acme, "ascend-910b", 4)
    rng = random.Random(5)
    sizes = [rng.choice((1, 2, 4)) for _ in range(16)]

    def client(index: int) -> None:
        job_id = submit(acme, sizes[index])
        services.admit_queued_jobs()
        if job(job_id).state == JobState.ADMITTED and sizes[index] < 4:
            services.finish_job(job_id, JobState.SUCCEEDED)
        services.admit_queued_jobs()

    at_once(len(sizes), client)
    edges = []
    for a in Allocation.objects.filter(job__tenant_id=acme.id):
        edges.append((a.started_at, 1, 1))
        if a.ended_at:
            edges.append((a.ended_at, 0, -1))
    held = peak = 0
    for _, _, delta in sorted(edges):
        held += delta
        peak = max(peak, held)
    assert 0 < peak <= 4


@pytest.fixture
def cycles():
    """The reports of the cycles that commit during the test."""
    reports: list[services.CycleReport] = []
    services.cycle_listeners.append(reports.append)
    yield reports
    services.cycle_listeners.remove(reports.append)


def test_a_request_for_admission_is_served_by_any_cycle_that_read_its_snapshot_later(lab, cycles):
    """A burst of submissions sends a request each; the worker runs a cycle for the first and finds
    the rest served by it (one read each), rather than running a cycle per request."""
    acme = lab[0]
    quota(acme, "ascend-910b", 4)
    waiting = submit(acme, 8, name="too big", wait=True)  # never admitted: the queue is never empty below

    first = submit(acme, 1, name="first")
    sent_at = time.time()  # as jobs.dispatch.send stamps it, after the submit committed
    time.sleep(SERVED_SLACK.total_seconds() + 0.01)  # the cycle below reads its snapshot past the clocks' slack
    assert services.admit_queued_jobs(sent_at) == [first]
    assert len(cycles) == 1 and first in cycles[0].decided

    assert services.admit_queued_jobs(sent_at) == []  # served by that cycle: none runs, though a job waits
    second = submit(acme, 1, name="second")
    assert services.admit_queued_jobs(sent_at) == []  # an old request does not see the new job...
    assert len(cycles) == 1
    assert services.admit_queued_jobs(time.time()) == [second]  # ...its own request does
    assert len(cycles) == 2
    # Sent as the last cycle read its snapshot (within the clocks' slack of it): not served, a cycle runs.
    assert services.admit_queued_jobs(cycles[-1].snapshot_at.timestamp()) == [] and len(cycles) == 3

    assert services.admit_queued_jobs(None) == []  # beat's request: always a cycle
    for not_a_time in (float("nan"), float("inf"), "yesterday"):  # from the broker: a cycle, not an error
        assert services.admit_queued_jobs(not_a_time) == []
    assert len(cycles) == 7 and all(waiting in c.decided for c in cycles)


@pytest.mark.django_db(transaction=True)
def test_the_lock_row_is_there_after_a_flush_as_after_a_migrate():
    """A flush (every transactional test ends with one) empties the lock's table; post_migrate puts the row
    back, so a test that runs after it sees the database as migrated, whatever ran before it in its worker."""
    from django.core.management import call_command

    AdmissionLock.objects.filter(pk=1).update(served_at=timezone.now())
    call_command("flush", interactive=False, verbosity=0)
    assert list(AdmissionLock.objects.values_list("pk", "served_at")) == [(1, None)]


def test_a_request_sent_before_one_written_down_leaves_the_cycle_to_that_one(lab, cycles):
    """A worker writes a request down before it tries the lock: it runs the cycle, or the holder runs once
    more for it. Every request sent before then (past the clocks' slack) is covered, and costs one read."""
    acme = lab[0]
    quota(acme, "ascend-910b", 4)
    submit(acme, 8, name="too big", wait=True)  # the queue is never empty below
    sent_at = time.time()
    time.sleep(SERVED_SLACK.total_seconds() + 0.01)
    AdmissionRequest.objects.update_or_create(pk=1, defaults={"requested_at": timezone.now()})
    assert services.admit_queued_jobs(sent_at) == [] and cycles == []  # covered: no cycle
    time.sleep(0.01)
    assert services.admit_queued_jobs(time.time()) == [] and len(cycles) == 1  # sent after it: a cycle


def test_the_holder_runs_once_more_for_a_job_submitted_after_its_snapshot(lab, cycles):
    """In a burst, a submission's own request may wait in the broker behind the others; the job is in the
    database already, and the worker holding the lock decides it at once rather than when its request
    comes. A job stamped further ahead than the clocks' slack (another host's clock running fast) is left
    to its request, or a holder would cycle until its own clock caught up."""
    acme = lab[0]
    quota(acme, "ascend-910b", 4)
    first = submit(acme, 1, name="first")
    submit(acme, 8, name="waits, submitted before the first cycle", wait=True)
    ahead = submit(acme, 8, name="stamped an hour ahead", wait=True)
    TrainingJob.objects.filter(pk=ahead).update(created_at=timezone.now() + timedelta(hours=1))
    late: list[int] = []

    def submit_during_the_first_cycle(report):
        assert len(cycles) <= 3, "the holder kept cycling with nothing new to decide"
        if len(cycles) == 1:
            late.append(submit(acme, 1, name="late"))

    services.cycle_listeners.append(submit_during_the_first_cycle)
    try:
        admitted = services.admit_queued_jobs(time.time())
    finally:
        services.cycle_listeners.remove(submit_during_the_first_cycle)
    assert admitted == [first, *late] and len(late) == 1
    assert len(cycles) == 2 and late[0] in cycles[1].decided  # and no third: nothing new since the second


def test_a_holder_without_a_loop_asks_for_the_cycle_left_to_it(lab, monkeypatch, django_capture_on_commit_callbacks):
    """Recovery, the pool's sync and a device's health hold the admission lock but run no cycle: a worker
    that found it held left its request (and every request it covers) to them, so they ask on its behalf."""
    sent: list[str] = []
    monkeypatch.setattr(dispatch, "send", lambda name, *args: sent.append(name))
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        dispatch.admit_requests_left_to_this_transaction()
    assert sent == []  # nobody asked meanwhile
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        dispatch.admit_requests_left_to_this_transaction()
        AdmissionRequest.objects.update_or_create(pk=1, defaults={"requested_at": timezone.now()})  # found it held
    assert sent == [dispatch.ADMIT]


@pytest.fixture
def coalescing(settings, monkeypatch):
    """Requests for admission coalesce through a cache in Redis that every process shares, as in
    production (POLYCHIP_CACHE_URL). The requests for admission are recorded rather than sent: no worker
    runs here, and the test takes each request as a worker would."""
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": settings.CELERY_BROKER_URL,
            "KEY_PREFIX": "test-coalescing",
        }
    }
    settings.POLYCHIP_COALESCE_ADMISSION_REQUESTS = True
    from django.core.cache import cache

    cache.delete(dispatch.PENDING_ADMIT_KEY)
    sent: list[tuple[float, ...]] = []

    def record(name, args=(), **_):
        if name == dispatch.ADMIT:
            sent.append(tuple(args))

    monkeypatch.setattr(dispatch.app, "send_task", record)
    yield sent
    cache.delete(dispatch.PENDING_ADMIT_KEY)


@pytest.mark.django_db(transaction=True)
def test_a_burst_of_submissions_sends_one_request_whose_cycle_decides_them_all(pool, cycles, coalescing):
    acme = make_tenant("burst", nau_quota=None)
    quota(acme, "ascend-910b", 4)
    submitted = at_once(16, lambda _: submit(acme, 1, wait=True))
    assert len(set(submitted)) == 16
    assert len(coalescing) == 1  # one request in the broker; the other 15 submissions found it untaken
    ((sent_at,),) = coalescing
    services.admit_queued_jobs(sent_at)  # a worker takes it
    assert len(cycles) == 1 and set(submitted) <= set(cycles[0].decided)
    assert TrainingJob.objects.filter(pk__in=submitted, state=JobState.ADMITTED).count() == 4
    submit(acme, 1, name="after it was taken")
    assert len(coalescing) == 2


@pytest.mark.django_db(transaction=True)
def test_a_coalesced_request_covers_the_changes_up_to_when_it_is_taken(lab, cycles, coalescing):
    """A request waits in the broker while a cycle (beat's sweep) decides the job that sent it; a job
    submitted next finds the request untaken and sends none. Stamped when it was sent, the request
    would count as served by the sweep's cycle, which never saw that job: it stands for when it is taken."""
    acme = lab[0]
    quota(acme, "ascend-910b", 4)
    first = submit(acme, 1, name="first")
    ((sent_at,),) = coalescing
    time.sleep(SERVED_SLACK.total_seconds() + 0.01)
    services.admit_queued_jobs(None)  # the sweep's cycle reads its snapshot past the request's stamp
    assert len(cycles) == 1 and first in cycles[0].decided
    second = submit(acme, 8, name="held back", wait=True)
    assert len(coalescing) == 1  # the first request is still in the broker
    services.admit_queued_jobs(sent_at)  # taken now
    assert len(cycles) == 2 and second in cycles[1].decided
    assert job(second).pending_reason  # decided: it waits, saying why
