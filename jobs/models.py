"""The pool (flavors, nodes, devices), training jobs, their events and their allocations."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models

from runtime.jobspec import JobSpec, stored_job_spec
from tenants.scoping import TenantScopedManager


class Flavor(models.Model):
    name = models.CharField(max_length=63, unique=True)
    vendor = models.CharField(max_length=63)
    kind = models.CharField(max_length=8)
    model = models.CharField(max_length=120)
    peak_bf16_tflops = models.FloatField()
    memory_gib = models.FloatField()
    interconnect = models.CharField(max_length=120)
    interconnect_gbps = models.FloatField()
    torch_device_type = models.CharField(max_length=16)
    collective_backend = models.CharField(max_length=16)

    def __str__(self) -> str:
        return self.name


class Node(models.Model):
    name = models.CharField(max_length=120, unique=True)
    flavor = models.ForeignKey(Flavor, on_delete=models.PROTECT, related_name="nodes")
    rack = models.CharField(max_length=63, blank=True)
    # The node's place in the pool's topology (a list of integers whose meaning the topology kind
    # gives, see runtime.inventory.topology): hop distances between nodes are computed from these.
    coords = models.JSONField(default=list, blank=True)

    def __str__(self) -> str:
        return self.name


class PoolTopology(models.Model):
    """The pool's one topology (a singleton row): its kind and parameters, as the pool file gave
    them or as derived from the nodes' racks; with the nodes' coordinates it gives hop distances."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    kind = models.CharField(max_length=32)
    parameters = models.JSONField(default=dict, blank=True)

    def __str__(self) -> str:
        return f"{self.kind} topology"


class DeviceHealth(models.TextChoices):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    CORDONED = "cordoned"
    FAILED = "failed"


class Device(models.Model):
    device_id = models.CharField(max_length=200, unique=True)
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="devices")
    flavor = models.ForeignKey(Flavor, on_delete=models.PROTECT, related_name="devices")
    index = models.PositiveIntegerField()
    health = models.CharField(max_length=16, choices=DeviceHealth.choices, default=DeviceHealth.HEALTHY)
    # From its flavor when the pool is loaded; kept per device so the inventory answers per device.
    memory_gib = models.FloatField(default=0.0)
    # Health telemetry from the device's rank (runtime.recovery.health.FEATURES, one row a minute,
    # the last hour), and the failure predictor's latest score of it (jobs.recovery.score_devices).
    health_readings = models.JSONField(default=list, blank=True)
    readings_at = models.DateTimeField(null=True, blank=True)
    failure_score = models.FloatField(null=True, blank=True)
    scored_at = models.DateTimeField(null=True, blank=True)
    # Consecutive scores at or above the predictor's threshold: a drain needs a few in a row.
    alert_streak = models.PositiveSmallIntegerField(default=0)
    unscored_rows = models.PositiveIntegerField(default=0)  # readings that arrived since the last score
    # Corrected errors the device's readings have reported, ever: /metrics exports them as counters
    # (DCGM's ECC and PCIe replay counters), which the hour of readings above cannot give.
    last_reading = models.JSONField(default=list, blank=True)  # the newest row of health_readings, for a scrape
    ecc_errors_total = models.BigIntegerField(default=0)
    pcie_errors_total = models.BigIntegerField(default=0)
    # The time (the rank's clock, unix seconds) of the newest heartbeat whose readings were stored: a
    # batch that a worker sends again after a lost answer adds no row and no error twice.
    readings_event_ts = models.FloatField(null=True, blank=True)
    # Failures of jobs that pointed at this device but were not evidence enough to mark it failed (a
    # lost heartbeat): [{"job", "at" (unix time), "cause"}], the newest last (jobs.recovery).
    suspicions = models.JSONField(default=list, blank=True)

    def __str__(self) -> str:
        return self.device_id


class JobState(models.TextChoices):
    QUEUED = "queued"
    ADMITTED = "admitted"
    RUNNING = "running"
    # A failure was detected (or the job was asked to move): its run is stopped, its devices given
    # back, and it waits for new ones before it restores its newest checkpoint and goes on.
    RECOVERING = "recovering"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})

# Every move a job's state may make, and the only ones: ``jobs.transitions.claim`` refuses any other.
# A job is born queued (submission). Any live state may end in any terminal state (``finish_job``:
# a cancel, a launch that failed, a run that finished or failed for good, an operator's end), and a
# terminal state is never left.
_ENDINGS = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
TRANSITIONS: dict[str, frozenset[str]] = {
    JobState.QUEUED: frozenset({JobState.ADMITTED}) | _ENDINGS,  # admitted by a cycle
    # launched; preempted back to the queue; placed again (a device went away before launch)
    JobState.ADMITTED: frozenset({JobState.RUNNING, JobState.QUEUED, JobState.RECOVERING}) | _ENDINGS,
    # preempted back to the queue; frozen after a failure or a stop, to be placed again
    JobState.RUNNING: frozenset({JobState.QUEUED, JobState.RECOVERING}) | _ENDINGS,
    JobState.RECOVERING: frozenset({JobState.ADMITTED}) | _ENDINGS,  # given its next devices
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


def sources_of(to_state: str) -> frozenset[str]:
    """The states from which ``to_state`` may be reached."""
    return frozenset(state for state, targets in TRANSITIONS.items() if to_state in targets)


class TrainingJob(models.Model):
    # No index of its own on tenant or state: the composite indexes below lead with each, and every index
    # costs each new row version of a job (a claim, a submission) an entry.
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="jobs", db_index=False)
    submitted_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    name = models.CharField(max_length=120)
    spec = models.JSONField()
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.QUEUED)
    pending_reason = models.CharField(max_length=500, blank=True)
    priority = models.IntegerField(default=0)
    # What kind of work it is, for the throughput matrix that prices it in NAU.
    job_class = models.CharField(max_length=63, default="synthetic-mlp")
    failure_reason = models.TextField(blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    state_changed_at = models.DateTimeField(auto_now_add=True)
    admitted_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    # What admission charged against the tenant's quota (resource -> devices or milli-NAU), and
    # whether that went above the tenant's nominal share: only such work may be preempted.
    demand = models.JSONField(default=dict, blank=True)
    borrowing = models.BooleanField(default=False)
    # Each admission is a new attempt, launched under its own run key; a preempted job goes back
    # to the queue and comes back as the next attempt.
    attempt = models.PositiveIntegerField(default=0)
    preemptions = models.PositiveIntegerField(default=0)
    # Recovery (jobs.recovery): restarts after failures (the spec's max_restarts bounds them), and
    # what the worker reported of its checkpoints and restores, and the last failure. What belongs to
    # one run (its handle, its launch claim, a stop asked of it, its teardown) is on its JobAttempt.
    restarts = models.PositiveIntegerField(default=0)
    recovery = models.JSONField(default=dict, blank=True)

    # Progress, fed by worker telemetry.
    steps_done = models.PositiveIntegerField(default=0)
    total_steps = models.PositiveIntegerField(default=0)
    first_loss = models.FloatField(null=True, blank=True)
    last_loss = models.FloatField(null=True, blank=True)
    recent_losses = models.JSONField(default=list, blank=True)
    samples_per_s = models.FloatField(null=True, blank=True)
    # The current attempt's latest step figures per rank, keyed by the rank as a string.
    rank_stats = models.JSONField(default=dict, blank=True)
    # Rank 0's view of the current attempt: the split of the global batch (jobs.queries.balance_view)
    # and the gradient exchange (jobs.queries.comm_view).
    balance_stats = models.JSONField(default=dict, blank=True)
    comm_stats = models.JSONField(default=dict, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    artifact_path = models.CharField(max_length=500, blank=True)

    # System code (admission, sweeps) uses ``objects``; anything answering a tenant uses
    # ``scoped.for_tenant(id)``, which returns nothing until scoped.
    objects = models.Manager()
    scoped = TenantScopedManager()

    class Meta:
        indexes = [
            # The jobs list: a tenant's jobs newest first, a page after a given id (keyset paging).
            models.Index(fields=["tenant", "-id"], name="job_tenant_newest"),
            models.Index(fields=["state", "created_at"]),
            models.Index(fields=["tenant", "state", "-priority", "created_at"]),
        ]

    def __str__(self) -> str:
        return f"job {self.pk} ({self.name}, {self.state})"

    @property
    def job_spec(self) -> JobSpec:
        """The spec, typed: every default in one place (``runtime.jobspec``), never a raw dict."""
        cached: JobSpec | None = self.__dict__.get("_job_spec")
        if cached is None or self.__dict__.get("_job_spec_raw") is not self.spec:
            cached = stored_job_spec(self.spec)
            self.__dict__["_job_spec"], self.__dict__["_job_spec_raw"] = cached, self.spec
        return cached


class JobAttempt(models.Model):
    """One run of a job: each admission (the first, after a preemption, after a recovery) is a new
    attempt, launched under its own run key.

    The job row says what is true of the job; this row says what is true of one run of it: the
    backend's handle, who claimed its launch, a stop asked of it, whether the backend confirmed it
    gone, and why it ended. An attempt whose run the backend has not confirmed gone still holds its
    devices: admission does not hand them out, and the sweep tears it down.
    """

    job = models.ForeignKey(TrainingJob, on_delete=models.PROTECT, related_name="attempts")
    number = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    # Set by the one worker that won the right to launch it (a claim; see jobs.lifecycle).
    provision_claimed_at = models.DateTimeField(null=True, blank=True)
    backend_handle = models.JSONField(null=True, blank=True)
    # A request to checkpoint and stop so that the job can move (a drain, growing back, a predicted
    # failure), and when a run being replaced (a preemption) was asked to stop before its teardown.
    stop_requested = models.CharField(max_length=300, blank=True)
    # The device count that stop asked the next attempt to run on (an elastic resize); null: as many
    # as its spec and its tenant's quota allow, as after any other move.
    resize_to = models.PositiveIntegerField(null=True, blank=True)
    # The flavors an elastic round moved the job to (the next attempt is placed on them when they are
    # free then, on any of the job's flavors otherwise); null: the job's own order.
    resize_flavors = models.JSONField(null=True, blank=True)
    stop_asked_at = models.DateTimeField(null=True, blank=True)
    # Set once the backend confirmed that nothing of the run is left; until then the sweep keeps
    # asking it to tear down (a lost teardown message must not leave work running).
    torn_down_at = models.DateTimeField(null=True, blank=True)
    # The devices the attempt before this one held: a restart prefers them (runtime.recovery.plan).
    previous_devices = models.JSONField(default=list, blank=True)
    # When and why it ended, and the state the job moved to then: queued (preempted), recovering
    # (frozen after a failure or a stop), or a terminal state.
    # When its run reported its first and its latest training step (ingest; never overwritten by a
    # later attempt retraining the same steps): the stretch its devices trained, for idle time.
    first_step_at = models.DateTimeField(null=True, blank=True)
    last_step_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    ended_as = models.CharField(max_length=16, choices=JobState.choices, blank=True)
    end_reason = models.CharField(max_length=500, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "number"], name="attempt_one_per_number")]

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.number}"


class AdmissionLock(models.Model):
    """One row whose lock serializes admission cycles, so that every cycle sees the usage that
    the previous one committed: quota checks are exact, not best effort."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    last_cycle_at = models.DateTimeField(null=True, blank=True)
    last_cycle_s = models.FloatField(null=True, blank=True)  # how long that cycle took, snapshot to writes
    # When the newest committed cycle read its snapshot: a request for admission sent before then is served.
    served_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"admission lock (last cycle {self.last_cycle_at})"


class AdmissionWait(models.Model):
    """How long admitted jobs had waited since they last entered the queue, per tenant and priority band, as a
    cumulative histogram that only grows: each cycle adds the jobs it admitted (under the admission
    lock, so cycles never race on it). /metrics exports it as polychip_admission_wait_seconds."""

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    band = models.CharField(max_length=8)  # controlplane.monitoring.priority_band
    count = models.BigIntegerField(default=0)
    sum_s = models.FloatField(default=0.0)
    buckets = models.JSONField(default=list)  # cumulative counts at jobs.monitoring.WAIT_BUCKETS, then +Inf

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "band"], name="admission_wait_per_band")]

    def __str__(self) -> str:
        return f"admission waits of tenant {self.tenant_id} ({self.band})"


class AdmissionRequest(models.Model):
    """When a cycle was last asked for; a cycle that started before it runs once more."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    requested_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"admission requested at {self.requested_at}"


class AppendOnlyError(RuntimeError):
    pass


class JobEvent(models.Model):
    """What happened to a job, in order.

    Append-only by convention of this code: an instance refuses a second save and a delete, and
    nothing here updates events in bulk. The database does not enforce it (a cascade from the job
    would remove them), so jobs are never deleted: the admin does not offer it.
    """

    class Kind(models.TextChoices):
        TRANSITION = "transition"
        PROGRESS = "progress"
        RECOVERY = "recovery"  # a failure detected, a device marked, devices reallocated, a restore
        ACTION = "action"  # the tenant's: a priority changed, a retry

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="events")
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16, blank=True)
    message = models.CharField(max_length=500, blank=True)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    objects = models.Manager()
    scoped = TenantScopedManager()

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.job_id}: {self.kind} {self.from_state}->{self.to_state} {self.message}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise AppendOnlyError("job events are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError("job events are append-only")


class DeviceEvent(models.Model):
    """A device's health history, append-only: each change of its health (who or what made it) and each
    failure-predictor score at or above the threshold (an alert; a few in a row drain the device)."""

    class Kind(models.TextChoices):
        HEALTH = "health"
        ALERT = "alert"

    device = models.ForeignKey(Device, on_delete=models.PROTECT, related_name="events")
    kind = models.CharField(max_length=8, choices=Kind.choices)
    from_health = models.CharField(max_length=16, blank=True)
    to_health = models.CharField(max_length=16, blank=True)
    by = models.CharField(max_length=300, blank=True)  # an operator's name, "recovery", a predictor's reason
    score = models.FloatField(null=True, blank=True)  # an alert's failure score
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.device_id}: {self.kind} {self.from_health}->{self.to_health} {self.by}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise AppendOnlyError("device events are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError("device events are append-only")


class Allocation(models.Model):
    """A device held by a job from ``started_at`` until ``ended_at`` (open while null)."""

    job = models.ForeignKey(TrainingJob, on_delete=models.PROTECT, related_name="allocations")
    device = models.ForeignKey(Device, on_delete=models.PROTECT, related_name="allocations")
    rank = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # The database, not the scheduler, is the last word on double-booking.
            models.UniqueConstraint(
                fields=["device"], condition=models.Q(ended_at__isnull=True), name="allocation_one_open_per_device"
            ),
            models.UniqueConstraint(
                fields=["job", "rank"], condition=models.Q(ended_at__isnull=True), name="allocation_one_open_per_rank"
            ),
        ]
        # Fair sharing reads the allocations that ended in the last few half-lives.
        indexes = [models.Index(fields=["ended_at"])]

    def __str__(self) -> str:
        return f"job {self.job_id} rank {self.rank} on {self.device_id}"


class ThroughputSource(models.TextChoices):
    BENCHMARK = "benchmark"
    MEASURED = "measured"
    ESTIMATED = "estimated"


class ThroughputEntry(models.Model):
    """Samples per second of a job class on ``devices`` devices of one flavor (``runtime.throughput``).

    Seeded by ``seed_throughput`` (benchmarks on the local backend) and learned online from step
    telemetry (``jobs.throughput.learn``)."""

    job_class = models.CharField(max_length=63)
    flavor = models.CharField(max_length=63)  # a name, not a key: the table outlives pool edits
    devices = models.PositiveIntegerField()
    samples_per_s = models.FloatField()  # the whole gang's
    source = models.CharField(max_length=16, choices=ThroughputSource.choices)
    samples = models.PositiveIntegerField(default=0)  # observations the figure rests on
    # The benchmark's figure, kept when real steps replace it: what bounds a worker's claims (bounds.py).
    benchmark_samples_per_s = models.FloatField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job_class", "flavor", "devices"], name="throughput_one_entry_per_key"),
            models.CheckConstraint(condition=models.Q(devices__gte=1), name="throughput_devices_at_least_one"),
            models.CheckConstraint(condition=models.Q(samples_per_s__gt=0), name="throughput_rate_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.job_class} on {self.devices} x {self.flavor}: {self.samples_per_s:.1f} samples/s ({self.source})"


class ThroughputObservation(models.Model):
    """One job's own figure for a throughput key: its moving average of what its steps measured.

    The shared entry is the median of the recent jobs' figures (``jobs.throughput.learn``), so that
    no one job, whose worker telemetry is untrusted, can move what every tenant's admission reads."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="throughput_observations")
    job_class = models.CharField(max_length=63)
    flavor = models.CharField(max_length=63)
    devices = models.PositiveIntegerField()
    samples_per_s = models.FloatField()  # the whole gang's, this job's moving average
    samples = models.PositiveIntegerField(default=0)  # telemetry batches it rests on
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["job", "job_class", "flavor", "devices"], name="throughput_one_observation_per_job_key"
            ),
            models.CheckConstraint(condition=models.Q(samples_per_s__gt=0), name="throughput_observation_positive"),
        ]
        indexes = [models.Index(fields=["job_class", "flavor", "devices", "-updated_at"], name="throughput_obs_recent")]

    def __str__(self) -> str:
        return f"job {self.job_id}: {self.job_class} on {self.devices} x {self.flavor}: {self.samples_per_s:.1f}"


class Bundle(models.Model):
    """A tenant's training code: a tar.gz uploaded through the API, stored content-addressed.

    The same bytes uploaded twice by one tenant are one bundle; another tenant's identical upload is
    its own row (tenants never learn what others hold). The file lives at
    ``POLYCHIP_BUNDLES_DIR/<tenant id>/<sha256>.tar.gz``; it was checked when it was uploaded
    (``runtime.bundles``) and is checked again when a run unpacks it."""

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="+")
    sha256 = models.CharField(max_length=64)
    size_bytes = models.BigIntegerField()  # the tar.gz as uploaded
    unpacked_bytes = models.BigIntegerField()  # the regular files inside, summed
    files = models.PositiveIntegerField()  # regular files inside
    name = models.CharField(max_length=255, blank=True)  # what the client called it, for people
    uploaded_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = models.Manager()
    scoped = TenantScopedManager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "sha256"], name="bundle_one_per_tenant_content")]

    def __str__(self) -> str:
        return f"tenant {self.tenant_id}: sha256:{self.sha256[:12]} ({self.size_bytes} bytes)"


class MetricPoint(models.Model):
    """One reported scalar of a job at one step (the loss, or any name the training code reports).

    A step that is trained again after a restore overwrites its earlier value: the series shows the
    run that led to the final model. Charts read it downsampled (``jobs.metrics``)."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=64)
    step = models.BigIntegerField()
    value = models.FloatField()
    attempt = models.PositiveIntegerField(default=0)
    recorded_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "name", "step"], name="metric_one_point_per_step")]

    def __str__(self) -> str:
        return f"job {self.job_id} {self.name}@{self.step}={self.value:g}"
