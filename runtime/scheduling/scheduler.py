"""One admission cycle over a ``Snapshot``, shaped like Kueue's scheduler: pure, deterministic.

- The queue manager keeps one queue per tenant, ordered by priority (high first), then submission time,
  then job id.
- The capacity snapshot is a ``FreePool`` (free devices by flavor and node) and a ``QuotaLedger``.
- The decision loop takes, again and again, the tenant whose head job has the lowest dominant share (fair
  sharing; a heap whose entries are re-keyed lazily: an entry is dropped when its tenant's usage or head has
  changed since it was pushed). The head gets a flavor assignment if one fits both the free devices and the
  quota; else, if preempting borrowed work makes room, it gets one with victims; else it waits, and its
  tenant's next job is tried (best-effort FIFO). Each pending job is decided once per cycle.

Two passes, as Kueue orders its heads: first the jobs that fit their tenant's nominal quota, admitted only
within it (one flavor or a mix); then the rest, which may borrow. A job that fits nominal on paper but could
only borrow with what is free now is decided in the second pass: capacity a tenant is owed is never lent to
another first, and a victim of reclaim never comes back ahead of the job that reclaimed its room (else the
two evict each other cycle after cycle).

Checking a fit costs O(flavors + resources); devices are chosen only for admitted jobs.

Preemption never touches a tenant's nominal share: only jobs admitted as ``borrowing``, from the snapshot
(not from this cycle), whose tenant still uses more than its nominal quota, are candidates. *Reclaim*: when
the head's tenant stays within its nominal quota, borrowing jobs of the other tenants of its cohort, at any
priority. *Priority*: otherwise, the head's own tenant's borrowing jobs of strictly lower priority (a tenant
cannot evict another tenant's work by the priority it names; Kueue's defaults). Devices that victims free but
the preempting job does not use are not handed to anyone else in the same cycle: they are busy until the
victims stop, and the next cycle sees them free. An elastic victim on one flavor gives back only what the job
needs, down to its minimum (``Preemption.keep``): it moves onto the rest and stays a candidate for the
next job of the cycle, with what it keeps.
"""

from __future__ import annotations

import heapq
import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace

from runtime.scheduling.fairshare import dominant_share
from runtime.scheduling.model import (
    MILLI,
    NAU,
    Admission,
    AdmittedJob,
    CycleResult,
    PendingJob,
    Preemption,
    Snapshot,
    Waiting,
)
from runtime.scheduling.placement import FreeDevice, FreePool
from runtime.scheduling.policies import Config, Policy, PolicyJob, preferred_flavors
from runtime.scheduling.quota import QuotaLedger, demand_for

__all__ = ["assign_elastic", "assign_flavors", "queue_order", "schedule"]

logger = logging.getLogger(__name__)

NOW = "now"
NOMINAL = "nominal"  # now, within the tenant's nominal quota
RECLAIM = "reclaim"
PRIORITY = "priority"


def queue_order(job: PendingJob) -> tuple[int, float, int]:
    """A tenant's queue: higher priority first, then earlier submission, then lower job id."""
    return (-job.priority, job.submitted_at, job.job_id)


def _victim_order(job: AdmittedJob) -> tuple[int, float, int]:
    """Preemption candidates: lowest priority first, then the most recently admitted."""
    return (job.priority, -job.admitted_at, -job.job_id)


def assign_flavors(
    count: int,
    flavors: Sequence[str],
    rates: Sequence[int],
    free: Sequence[int],
    rooms: Sequence[int | None],
    nau_room: int | None,
) -> dict[str, int] | None:
    """Devices per flavor for a gang of ``count``, or None. O(flavors).

    First each single flavor, in the job's order, with enough free devices and quota; else flavors filled in
    order, each up to what is free and what its quota and the NAU quota leave. Per flavor, in the job's order:
    ``rates`` (milli-NAU per device), ``free`` (devices), ``rooms`` (quota headroom, None = unlimited);
    ``nau_room`` is the NAU headroom.
    """
    if sum(free) < count:
        return None  # not enough free whatever the mix: most calls, once the pool is full
    for flavor, rate, available, room in zip(flavors, rates, free, rooms, strict=True):
        if available >= count and (room is None or room >= count) and (nau_room is None or count * rate <= nau_room):
            return {flavor: count}
    counts: dict[str, int] = {}
    left = count
    for index, (flavor, rate, available, room) in enumerate(zip(flavors, rates, free, rooms, strict=True)):
        take = min(available, left)
        if room is not None:
            take = min(take, room)
        if take <= 0:
            continue  # the NAU cap below only lowers it
        if nau_room is not None and rate > 0:
            take = min(take, nau_room // rate)
            # Leave enough NAU for the devices still to find at the cheapest rate after this flavor,
            # or an expensive flavor taken greedily spends what a cheaper mix would have fitted in.
            later = rates[index + 1 :]
            cheapest = min(later) if later else None
            if cheapest is not None and rate > cheapest:
                take = min(take, max(0, (nau_room - left * cheapest) // (rate - cheapest)))
        if take > 0:
            counts[flavor] = take
            left -= take
            if nau_room is not None:
                nau_room -= take * rate
            if left == 0:
                return counts
    return None


def assign_elastic(
    job: PendingJob,
    flavors: Sequence[str],
    rates: Sequence[int],
    free: Sequence[int],
    rooms: Sequence[int | None],
    nau_room: int | None,
) -> dict[str, int] | None:
    """``assign_flavors`` for the job's full count; for an elastic job that does not fit whole, the most
    devices down to its ``min_devices`` that do. O(devices x flavors), and only for elastic jobs."""
    assignment = assign_flavors(job.devices, flavors, rates, free, rooms, nau_room)
    if assignment is not None or job.min_devices is None:
        return assignment
    for count in range(job.devices - 1, job.min_devices - 1, -1):
        assignment = assign_flavors(count, flavors, rates, free, rooms, nau_room)
        if assignment is not None:
            return assignment
    return None


@dataclass(frozen=True)
class _GiveBack:
    released: Mapping[str, int]  # resource -> amount the tenant gives back
    relief: Mapping[str, int]  # resource -> drop of its cohort's pool usage
    freed: Mapping[str, int]  # flavor -> devices freed


_NOTHING = _GiveBack({}, {}, {})
_EMPTY: Mapping[str, int] = {}


class _Rooms:
    """Quota headroom and free devices for one tenant in one state, now or after hypothetical preemptions.

    Filled lazily, one resource at a time; valid until the next admission (the cycle's epoch)."""

    __slots__ = ("free", "freed", "ledger", "pool", "released", "relief", "rooms", "tenant_id", "within")

    def __init__(
        self,
        ledger: QuotaLedger,
        pool: FreePool,
        tenant_id: int,
        *,
        within: bool = False,
        released: Mapping[str, int] = _EMPTY,
        relief: Mapping[str, int] = _EMPTY,
        freed: Mapping[str, int] = _EMPTY,
    ) -> None:
        self.ledger, self.pool, self.tenant_id, self.within = ledger, pool, tenant_id, within
        self.released, self.relief, self.freed = released, relief, freed
        self.rooms: dict[str, int | None] = {}
        self.free: dict[str, int] = {}

    def vectors(self, flavors: Sequence[str]) -> tuple[list[int | None], int | None, list[int]]:
        """(headroom per flavor, NAU headroom, free devices per flavor)."""
        rooms, free = self.rooms, self.free
        try:
            return [rooms[f] for f in flavors], rooms[NAU], [free[f] for f in flavors]
        except KeyError:
            pass
        for resource in (*flavors, NAU):
            if resource not in rooms:
                rooms[resource] = self.ledger.headroom(
                    self.tenant_id,
                    resource,
                    within_nominal=self.within,
                    released=self.released.get(resource, 0),
                    relief=self.relief.get(resource, 0),
                )
        for flavor in flavors:
            if flavor not in free:
                free[flavor] = self.pool.count(flavor) + self.freed.get(flavor, 0)
        return [rooms[f] for f in flavors], rooms[NAU], [free[f] for f in flavors]


def _flavor_counts(devices: Sequence[FreeDevice], pool: FreePool) -> dict[str, int]:
    counts: dict[str, int] = {}
    for device in devices:
        if device.device_id not in pool:
            counts[device.flavor] = counts.get(device.flavor, 0) + 1
    return counts


def _accumulate(total: dict[str, int], part: Mapping[str, int], sign: int = 1) -> None:
    for key, amount in part.items():
        total[key] = total.get(key, 0) + sign * amount


class _Cycle:
    def __init__(self, snapshot: Snapshot, blend: float) -> None:
        if not 0.0 <= blend <= 1.0:
            raise ValueError(f"blend must be between 0 and 1, got {blend!r}")
        self.snapshot = snapshot
        self.blend = blend
        self.ledger = QuotaLedger.from_snapshot(snapshot)
        # A device listed as free but held by a running job is taken as held: never handed out twice.
        held = {device.device_id for job in snapshot.admitted for device in job.devices}
        self.pool = FreePool((d for d in snapshot.free if d.device_id not in held), distance=snapshot.distance)
        free_ids = {d.device_id for d in snapshot.free}
        self.releasing = Counter(
            d.flavor
            for d in {d.device_id: d for d in snapshot.releasing}.values()
            if d.device_id not in held | free_ids
        )
        queues: dict[int, list[PendingJob]] = defaultdict(list)
        for job in snapshot.pending:
            queues[job.tenant_id].append(job)
        for jobs in queues.values():
            jobs.sort(key=queue_order)
        self.queues = dict(queues)
        self.cursor = dict.fromkeys(self.queues, 0)
        # Preemption candidates: per cohort, per tenant, in victim order.
        self.borrowers: dict[Hashable, dict[int, list[AdmittedJob]]] = defaultdict(lambda: defaultdict(list))
        for admitted in sorted(snapshot.admitted, key=_victim_order):
            if admitted.borrowing:
                self.borrowers[self.ledger.cohort_key(admitted.tenant_id)][admitted.tenant_id].append(admitted)
        # Versions: a tenant's usage (or candidates) changed / a cohort's candidates or their tenants changed.
        self.tenant_version: dict[int, int] = defaultdict(int)
        self.cohort_version: dict[Hashable, int] = defaultdict(int)
        self.give_backs: dict[tuple[int, int | None], tuple[int, _GiveBack]] = {}
        self.cohort_give_backs: dict[tuple[Hashable, int | None], tuple[int, _GiveBack]] = {}
        # Room vectors per (tenant, mode, priority), valid for one epoch: the time between two admissions.
        self.epoch = 0
        self.cached_epoch = 0  # the epoch that rooms and refusals hold answers for
        self.rooms: dict[tuple[int, str, int | None], _Rooms | None] = {}
        self.rates: dict[tuple[str, tuple[str, ...]], list[int]] = {}
        self.flavor_sets: dict[tuple[str, ...], tuple[str, ...]] = {}
        self.refusals: dict[tuple[int, str, int], str] = {}  # (tenant, resource, amount) -> why, for the epoch
        self.stamp: dict[int, int] = defaultdict(int)
        self.shares: dict[int, tuple[int, float]] = {}  # tenant -> (usage version, dominant share)
        # tenant -> (usage version, room within nominal per resource, and the answer per job shape), for
        # _fits_nominal: a waiting head is asked again each time its tenant is pushed back on the heap
        self.nominal_rooms: dict[int, tuple[int, dict[str, int | None], dict[Hashable, bool]]] = {}
        self.heap: list[tuple[int, float, int, float, int, int, int]] = []
        self.admissions: list[Admission] = []
        self.preemptions: list[Preemption] = []
        self.waiting: dict[int, list[tuple[int, str]]] = defaultdict(list)

    # --- queue manager ---------------------------------------------------------------------------------

    def _push(self, tenant_id: int) -> None:
        self.stamp[tenant_id] += 1
        jobs = self.queues.get(tenant_id)
        if not jobs or self.cursor[tenant_id] >= len(jobs):
            return
        head = jobs[self.cursor[tenant_id]]
        version = self.tenant_version[tenant_id]
        cached = self.shares.get(tenant_id)
        if cached is not None and cached[0] == version:
            share = cached[1]
        else:
            quota = self.snapshot.tenants.get(tenant_id)
            share = dominant_share(
                self.ledger.limits(tenant_id),
                self.ledger.usage(tenant_id),
                self.snapshot.history.get(tenant_id, {}),
                quota.weight if quota is not None else 1.0,
                self.blend,
            )
            self.shares[tenant_id] = (version, share)
        # Kueue's order: heads that fit within their tenant's nominal quota go before heads that
        # would borrow, so that capacity a tenant is owed is never lent to another first.
        tier = 0 if self._fits_nominal(head) else 1
        entry = (tier, share, -head.priority, head.submitted_at, head.job_id, tenant_id, self.stamp[tenant_id])
        heapq.heappush(self.heap, entry)

    def _fits_nominal(self, job: PendingJob) -> bool:
        """Whether some assignment of the job's flavors, one flavor or a mix, keeps its tenant within
        nominal, whatever is free: a mix counts, or a job that only fits nominal as a mix would be
        decided among the borrowers, after the borrower that its reclaim then evicts."""
        flavors = self._flavors(job)
        if job.devices <= 0 or not flavors:
            return True  # decided (and refused, saying why) in the first pass
        tenant_id = job.tenant_id
        version = self.tenant_version[tenant_id]
        cached = self.nominal_rooms.get(tenant_id)
        if cached is None or cached[0] != version:
            cached = (version, {}, {})
            self.nominal_rooms[tenant_id] = cached
        _, known, answers = cached
        count = job.min_devices or job.devices
        shape = (count, flavors, job.job_class)  # all the answer depends on, for one usage version
        answer = answers.get(shape)
        if answer is None:
            for resource in (*flavors, NAU):
                if resource not in known:
                    known[resource] = self.ledger.nominal_room(tenant_id, resource)
            rooms = [known[flavor] for flavor in flavors]
            rates = self._rates(job, flavors)
            answer = assign_flavors(count, flavors, rates, [count] * len(flavors), rooms, known[NAU]) is not None
            answers[shape] = answer
        return answer

    def _nominal_assignment(
        self, job: PendingJob, flavors: Sequence[str], rates: Sequence[int]
    ) -> dict[str, int] | None:
        nominal = self._rooms(job.tenant_id, NOMINAL, None)
        if nominal is None:
            raise RuntimeError("_rooms gave no room for NOMINAL, which always has one")
        rooms, nau_room, free = nominal.vectors(flavors)
        return assign_elastic(job, flavors, rates, free, rooms, nau_room)

    def _reserve(self, job: PendingJob, flavors: Sequence[str], rates: Sequence[int]) -> bool:
        """For a job that fits its nominal quota but waits for devices that runs being torn down still
        occupy (often its own victims): keep that quota for it until the cycle ends, so that no borrower
        decided after it takes the room and is reclaimed in turn, cycle after cycle, while they go."""
        if not self.releasing:
            return False
        nominal = self._rooms(job.tenant_id, NOMINAL, None)
        if nominal is None:
            raise RuntimeError("_rooms gave no room for NOMINAL, which always has one")
        rooms, nau_room, free = nominal.vectors(flavors)
        soon = [available + self.releasing.get(flavor, 0) for flavor, available in zip(flavors, free, strict=True)]
        assignment = assign_elastic(job, flavors, rates, soon, rooms, nau_room)
        if assignment is None:
            return False
        self.ledger.add(job.tenant_id, demand_for(job.job_class, assignment, self.snapshot.nau_rates))
        self.epoch += 1
        self._usage_changed(job.tenant_id)
        releasing = ", ".join(f"{self.releasing[f]} {f}" for f in flavors if self.releasing.get(f))
        self.waiting[job.tenant_id].append(
            (job.job_id, f"waiting for devices being released ({releasing}); its quota is kept for it meanwhile")
        )
        return True

    def run(self) -> CycleResult:
        # Kueue's order: first every job that fits its tenant's nominal quota, then the jobs that
        # would borrow, each pass in fair-share order. So capacity a tenant is owed is never lent
        # to another in the same cycle, not even when the owed job waits behind its own tenant's
        # larger head (which would otherwise lend it away, and reclaim it the cycle after).
        would_borrow: dict[int, list[PendingJob]] = defaultdict(list)
        self._pass(would_borrow)
        self.queues = dict(would_borrow)
        self.cursor = dict.fromkeys(self.queues, 0)
        self._pass(None)
        order = {job.job_id: queue_order(job) for job in self.snapshot.pending}
        waiting = tuple(
            Waiting(job_id=job_id, reason=reason, position=position)
            for tenant_id in sorted(self.waiting)
            for position, (job_id, reason) in enumerate(
                sorted(self.waiting[tenant_id], key=lambda item: order[item[0]]), start=1
            )
        )
        return CycleResult(admissions=tuple(self.admissions), preemptions=tuple(self.preemptions), waiting=waiting)

    def _pass(self, would_borrow: dict[int, list[PendingJob]] | None) -> None:
        """Decide the queued jobs in fair-share order; with ``would_borrow``, only those that fit
        their tenant's nominal quota now, setting the others aside there in queue order."""
        self.heap = []
        for tenant_id in sorted(self.queues):
            self._push(tenant_id)
        while self.heap:
            *_, tenant_id, stamp = heapq.heappop(self.heap)
            if stamp != self.stamp[tenant_id]:
                continue  # stale: the tenant's usage or head changed since
            job = self.queues[tenant_id][self.cursor[tenant_id]]
            self.cursor[tenant_id] += 1
            # Its tenant's usage only grows in this pass, so a job that does not fit nominal now would not
            # later either. A job that fits nominal on paper but, with what is free now, could only borrow
            # (``_decide`` gives None) goes with the borrowers too: admitted here, it would take room owed
            # to a within-nominal job decided after it; that job would reclaim it, its victim would come
            # back ahead of it in the next cycle's first pass, and the two would evict each other cycle
            # after cycle.
            touched = None
            if would_borrow is None or self._fits_nominal(job):
                touched = self._decide(job, nominal_only=would_borrow is not None)
            if touched is None:
                if would_borrow is None:
                    raise RuntimeError(f"job {job.job_id}: set aside in the pass that decides every job")
                would_borrow[tenant_id].append(job)
                self._push(tenant_id)
                continue
            self._push(tenant_id)
            for other in sorted(touched - {tenant_id}):
                self._push(other)

    # --- decisions -------------------------------------------------------------------------------------

    def _flavors(self, job: PendingJob) -> tuple[str, ...]:
        """The job's flavors, each once, in its order; kept per flavor list (a cycle asks 40,000 times)."""
        flavors = self.flavor_sets.get(job.flavors)
        if flavors is None:
            flavors = self.flavor_sets[job.flavors] = tuple(dict.fromkeys(job.flavors))
        return flavors

    def _rates(self, job: PendingJob, flavors: tuple[str, ...]) -> list[int]:
        """Milli-NAU per device of each flavor for the job's class; kept per (class, flavors): a cycle
        asks 20,000 times for a few dozen distinct answers. Callers only read the list."""
        key = (job.job_class, flavors)
        rates = self.rates.get(key)
        if rates is None:
            table = self.snapshot.nau_rates
            rates = self.rates[key] = [table.get((job.job_class, flavor), MILLI) for flavor in flavors]
        return rates

    def _decide(self, job: PendingJob, *, nominal_only: bool = False) -> set[int] | None:
        """Admit the job (perhaps preempting) or record why it waits; the tenants whose usage fell.
        ``nominal_only``: without victims, only within the tenant's nominal quota, and None (undecided)
        when it could only borrow with what is free now."""
        tenant_id = job.tenant_id
        flavors = self._flavors(job)
        if job.devices <= 0 or not flavors:
            why = "asks for no devices" if job.devices <= 0 else "allows no flavor"
            self.waiting[tenant_id].append((job.job_id, f"cannot be placed: it {why}"))
            return set()
        rates = self._rates(job, flavors)
        ledger = self.ledger
        now = self._rooms(tenant_id, NOW, None)
        if now is None:
            raise RuntimeError("_rooms gave no room for NOW, which always has one")
        rooms, nau_room, free = now.vectors(flavors)
        assignment = assign_elastic(job, flavors, rates, free, rooms, nau_room)
        if nominal_only:  # the first pass admits within nominal only, a mix if need be (see _pass)
            could_borrow = assignment is not None
            assignment = self._nominal_assignment(job, flavors, rates)
            if assignment is None and could_borrow:
                return None
            if assignment is None and self._reserve(job, flavors, rates):
                return set()
        victims: list[AdmittedJob] = []
        kept: dict[int, AdmittedJob] = {}  # victim id -> what it keeps, for those that shrink
        mode = ""
        # An elastic job that fits nowhere now preempts for its smallest count: the least it disturbs.
        smallest = job if job.min_devices is None else replace(job, devices=job.min_devices, min_devices=None)
        if assignment is None:
            found = self._preempt(smallest, flavors, rates)
            if found is not None:
                mode, victims, kept, assignment = found
        if assignment is None:
            reason = self._reason(smallest, flavors, rates, free, rooms, nau_room)
            self.waiting[tenant_id].append((job.job_id, reason))
            return set()

        demand = demand_for(job.job_class, assignment, self.snapshot.nau_rates)
        borrowing = ledger.would_borrow(tenant_id, demand)  # victims are out of the ledger already
        # A victim that shrinks keeps the first of its devices (``_shrink``) and gives back the rest.
        keeps = {job_id: len(smaller.devices) for job_id, smaller in kept.items()}
        freed = self.pool.put([d for v in victims for d in v.devices[keeps.get(v.job_id, 0) :]])
        chosen = self.pool.take_many(assignment)
        self.pool.discard(freed)  # busy until the victims stop
        ledger.add(tenant_id, demand)
        self.epoch += 1
        self._usage_changed(tenant_id)
        for victim in victims:
            if mode == RECLAIM:
                reason = f"reclaimed by tenant {tenant_id} within its nominal quota"
            else:
                reason = f"preempted by higher-priority job {job.job_id} (priority {job.priority} > {victim.priority})"
            smaller = kept.get(victim.job_id)
            keep = None if smaller is None else len(smaller.devices)
            if keep is not None:
                reason += f"; shrinks from {len(victim.devices)} to {keep} devices"
            self.preemptions.append(Preemption(job_id=victim.job_id, by_job_id=job.job_id, reason=reason, keep=keep))
            cohort = self.borrowers[ledger.cohort_key(victim.tenant_id)]
            place = cohort[victim.tenant_id].index(victim)
            if smaller is not None:  # still running, on less: a candidate again, down to its minimum
                cohort[victim.tenant_id][place] = smaller
            else:
                del cohort[victim.tenant_id][place]
            if not cohort[victim.tenant_id]:
                del cohort[victim.tenant_id]
            self._usage_changed(victim.tenant_id, candidate=True)
        self.admissions.append(
            Admission(
                job_id=job.job_id,
                devices=tuple(chosen),
                demand=demand,
                borrowing=borrowing,
                preempts=tuple(v.job_id for v in victims),
            )
        )
        return {v.tenant_id for v in victims}

    def _usage_changed(self, tenant_id: int, *, candidate: bool = False) -> None:
        self.tenant_version[tenant_id] += 1
        cohort = self.ledger.cohort_key(tenant_id)
        if candidate or tenant_id in self.borrowers.get(cohort, {}):
            self.cohort_version[cohort] += 1

    def _preempt(
        self, job: PendingJob, flavors: Sequence[str], rates: Sequence[int]
    ) -> tuple[str, list[AdmittedJob], dict[int, AdmittedJob], dict[str, int]] | None:
        tenant_id = job.tenant_id
        cohort = self.ledger.cohort_key(tenant_id)
        borrowers = self.borrowers.get(cohort)
        if not borrowers:
            return None
        for mode in (RECLAIM, PRIORITY):
            if not self._room_if_all_preempted(job, flavors, rates, mode):
                continue
            candidates = sorted(
                (
                    victim
                    for owner, jobs in borrowers.items()
                    # Reclaim takes from the others; priority only from the tenant's own borrowed
                    # work (Kueue's defaults), so no tenant can evict another's by naming a number.
                    if (owner == tenant_id) == (mode == PRIORITY)
                    for victim in jobs
                    if mode == RECLAIM or victim.priority < job.priority
                ),
                key=_victim_order,
            )
            found = self._choose_victims(job, flavors, rates, candidates, mode == RECLAIM)
            if found is not None:
                return (mode, *found)
        return None

    def _give_back(self, tenant_id: int, cohort: Hashable, below: int | None) -> _GiveBack:
        """What greedy preemption would take from one tenant: its candidates (priority < ``below``, or all) in
        victim order, each while its tenant still uses more than nominal for a resource it holds. Depends on
        that tenant's usage alone, so tenants add up; memoized per usage version."""
        key = (tenant_id, below)
        version = self.tenant_version[tenant_id]
        cached = self.give_backs.get(key)
        if cached is not None and cached[0] == version:
            return cached[1]
        ledger = self.ledger
        released: dict[str, int] = {}
        freed: dict[str, int] = {}
        for victim in self.borrowers[cohort].get(tenant_id, ()):
            if below is not None and victim.priority >= below:
                break
            if ledger.is_borrowing(tenant_id, victim.demand, released):
                _accumulate(released, victim.demand)
                _accumulate(freed, _flavor_counts(victim.devices, self.pool))
        relief = {r: n for r, n in ledger.relief(tenant_id, released).items() if n}
        result = _GiveBack(released, relief, freed)
        self.give_backs[key] = (version, result)
        return result

    def _cohort_give_back(self, cohort: Hashable, below: int | None) -> _GiveBack:
        key = (cohort, below)
        version = self.cohort_version[cohort]
        cached = self.cohort_give_backs.get(key)
        if cached is not None and cached[0] == version:
            return cached[1]
        relief: dict[str, int] = {}
        freed: dict[str, int] = {}
        for tenant_id in self.borrowers[cohort]:
            part = self._give_back(tenant_id, cohort, below)
            _accumulate(relief, part.relief)
            _accumulate(freed, part.freed)
        result = _GiveBack({}, {r: n for r, n in relief.items() if n}, {f: n for f, n in freed.items() if n})
        self.cohort_give_backs[key] = (version, result)
        return result

    def _rooms(self, tenant_id: int, mode: str, below: int | None) -> _Rooms | None:
        """The tenant's room now (NOW), or once every candidate is preempted; None when there is none to take."""
        self._start_epoch()
        key = (tenant_id, mode, below)
        if key in self.rooms:
            return self.rooms[key]
        ledger = self.ledger
        rooms: _Rooms | None
        if mode == NOW:
            rooms = _Rooms(ledger, self.pool, tenant_id)
        elif mode == NOMINAL:
            rooms = _Rooms(ledger, self.pool, tenant_id, within=True)
        else:
            cohort = ledger.cohort_key(tenant_id)
            total = self._cohort_give_back(cohort, below)
            own = self._give_back(tenant_id, cohort, below) if tenant_id in self.borrowers[cohort] else _NOTHING
            if mode == RECLAIM:  # the others' jobs only
                relief = {r: n - own.relief.get(r, 0) for r, n in total.relief.items()}
                freed = {f: n - own.freed.get(f, 0) for f, n in total.freed.items()}
                if not any(relief.values()) and not any(freed.values()):
                    rooms = None  # nothing to take: the state that just refused the job, with a tighter cap
                else:
                    rooms = _Rooms(ledger, self.pool, tenant_id, within=True, relief=relief, freed=freed)
            elif not own.relief and not own.freed and not own.released:
                rooms = None  # priority preempts the tenant's own borrowed work only
            else:
                rooms = _Rooms(ledger, self.pool, tenant_id, released=own.released, relief=own.relief, freed=own.freed)
        self.rooms[key] = rooms
        return rooms

    def _room_if_all_preempted(self, job: PendingJob, flavors: Sequence[str], rates: Sequence[int], mode: str) -> bool:
        """Whether the job fits once greedy preemption has taken every candidate it may take.

        Exact: greedy stops at the first fit and only ever adds room, so it succeeds iff this says so.
        Memoized per cohort state, so that a full cohort turns jobs away in O(flavors + resources).
        """
        rooms = self._rooms(job.tenant_id, mode, None if mode == RECLAIM else job.priority)
        if rooms is None:
            return False
        flavor_rooms, nau_room, free = rooms.vectors(flavors)
        return assign_flavors(job.devices, flavors, rates, free, flavor_rooms, nau_room) is not None

    def _choose_victims(
        self,
        job: PendingJob,
        flavors: Sequence[str],
        rates: Sequence[int],
        candidates: list[AdmittedJob],
        within_nominal: bool,
    ) -> tuple[list[AdmittedJob], dict[int, AdmittedJob], dict[str, int]] | None:
        """Greedy victims until the job fits, then drop those not needed, then shrink the elastic ones
        that need not stop: (victims, what each shrunk one keeps, the job's assignment). Victims stay out
        of the ledger, but for what the shrunk ones keep."""
        tenant_id = job.tenant_id
        ledger = self.ledger
        extra: dict[str, int] = {}

        def fits() -> dict[str, int] | None:
            free = [self.pool.count(flavor) + extra.get(flavor, 0) for flavor in flavors]
            rooms = [ledger.headroom(tenant_id, flavor, within_nominal=within_nominal) for flavor in flavors]
            nau_room = ledger.headroom(tenant_id, NAU, within_nominal=within_nominal)
            return assign_flavors(job.devices, flavors, rates, free, rooms, nau_room)

        # A victim that holds none of what the job can use changes nothing for it: no need to check again.
        wanted = set(flavors)
        if NAU in ledger.limits(tenant_id):
            wanted.add(NAU)

        def matters(victim: AdmittedJob) -> bool:
            return any(r in wanted for r in victim.demand) or any(d.flavor in wanted for d in victim.devices)

        victims: list[AdmittedJob] = []
        for victim in candidates:
            if not ledger.is_borrowing(victim.tenant_id, victim.demand):
                continue  # what is left of its tenant is within nominal: never preempt that
            ledger.remove(victim.tenant_id, victim.demand)
            _accumulate(extra, _flavor_counts(victim.devices, self.pool))
            victims.append(victim)
            if matters(victim) and fits() is not None:
                break
        else:
            for victim in victims:
                ledger.add(victim.tenant_id, victim.demand)
            return None
        for victim in reversed(list(victims)):
            ledger.add(victim.tenant_id, victim.demand)
            _accumulate(extra, _flavor_counts(victim.devices, self.pool), -1)
            if not matters(victim) or fits() is not None:
                victims.remove(victim)
            else:
                ledger.remove(victim.tenant_id, victim.demand)
                _accumulate(extra, _flavor_counts(victim.devices, self.pool))
        kept: dict[int, AdmittedJob] = {}
        for victim in reversed(victims):
            smaller = self._shrink(victim, fits, extra)
            if smaller is not None:
                kept[victim.job_id] = smaller
        assignment = fits()
        if assignment is None:  # not reached: every pass of the loop above leaves a state in which the job fits
            raise RuntimeError(f"job {job.job_id}: no assignment with the victims chosen to make it fit")
        return victims, kept, assignment

    def _shrink(
        self, victim: AdmittedJob, fits: Callable[[], dict[str, int] | None], extra: dict[str, int]
    ) -> AdmittedJob | None:
        """An elastic victim on one flavor gives back only what the preempting job needs: the victim as it
        would run on the most devices, down to its minimum, that still let the job fit (its share put back
        in the ledger and off ``extra``), or None when it must stop. Stopping re-queues it behind everyone;
        shrinking keeps it running, on less, through the same checkpointed move a resize makes."""
        held = len(victim.devices)
        if victim.min_devices is None or victim.min_devices >= held:
            return None
        flavor = victim.devices[0].flavor
        if any(d.flavor != flavor for d in victim.devices) or any(a % held for a in victim.demand.values()):
            return None  # a mix: which flavor to give back is the restart planner's; it stops whole
        for keep in range(held - 1, victim.min_devices - 1, -1):
            smaller = victim.shrunk(keep)
            self.ledger.add(victim.tenant_id, smaller.demand)
            extra[flavor] -= keep
            if fits() is not None:
                return smaller
            self.ledger.remove(victim.tenant_id, smaller.demand)
            extra[flavor] += keep
        return None

    def _start_epoch(self) -> None:
        """Forget what the epoch's caches (rooms, refusals) hold once an admission has begun another."""
        if self.cached_epoch != self.epoch:
            self.rooms.clear()
            self.refusals.clear()
            self.cached_epoch = self.epoch

    def _refusal(self, tenant_id: int, resource: str, amount: int) -> str:
        """``QuotaLedger.refusal``, kept for the epoch: once the pool is full, a tenant's waiting jobs ask
        for the same few amounts, and the ledger changes only with an admission."""
        self._start_epoch()
        key = (tenant_id, resource, amount)
        why = self.refusals.get(key)
        if why is None:
            why = self.refusals[key] = self.ledger.refusal(tenant_id, resource, amount)
        return why

    def _reason(
        self,
        job: PendingJob,
        flavors: Sequence[str],
        rates: Sequence[int],
        free: Sequence[int],
        rooms: Sequence[int | None],
        nau_room: int | None,
    ) -> str:
        """The most useful reason: the quota's, when quota refuses whatever is free; else what is free."""
        tenant_id = job.tenant_id
        count = job.devices
        ledger = self.ledger

        def single(flavor: str, room: int | None, rate: int) -> str | None:
            """Why ``count`` devices of one flavor do not fit the quota now (None: they do)."""
            if room is not None and count > room:
                return self._refusal(tenant_id, flavor, count)
            if nau_room is not None and count * rate > nau_room:
                return self._refusal(tenant_id, NAU, count * rate)
            return None

        if assign_flavors(count, flavors, rates, [count] * len(flavors), rooms, nau_room) is None:
            # Quota blocks, whatever is free: say why for the most preferred flavor the tenant has quota for.
            for flavor, room, rate in zip(flavors, rooms, rates, strict=True):
                if ledger.has_quota(tenant_id, flavor):
                    why = single(flavor, room, rate)
                    if why is not None:
                        return why
            return f"no quota for {' or '.join(flavors)}; ask an operator"
        free_now = ", ".join(f"{available} {flavor}" for flavor, available in zip(flavors, free, strict=True))
        reason = f"waiting for {count} devices; free now: {free_now}"
        for flavor, available, room, rate in zip(flavors, free, rooms, rates, strict=True):
            if available >= count:
                why = single(flavor, room, rate)
                if why is not None:
                    return f"{reason}; {why}"
        return reason


def schedule(snapshot: Snapshot, *, blend: float = 0.5, policy: Policy | None = None) -> CycleResult:
    """One admission cycle: which pending jobs start (on which devices, preempting whom) and why others wait.

    With a placement ``policy``, each pending job's flavors are tried in the order the policy's allocation
    prefers (``policies.preferred_flavors``); without one, in the job's own order."""
    # The policy only reorders each job's allowed flavors: with one flavor each there is nothing to
    # reorder, and its LPs (two solves, most of a small cycle's decision) are skipped.
    if policy is not None and any(len(job.flavors) > 1 for job in snapshot.pending):
        snapshot = _follow_policy(snapshot, policy)
    return _Cycle(snapshot, blend).run()


# The policy orders the flavors of at most this many pending jobs per cycle: the heads of the tenants'
# queues, taken in turn. A cycle rarely admits more, and an LP over 1,000 jobs solves in a fraction of a
# second where one over 10,000 takes seconds, all of it under the admission lock. Jobs further back keep
# their own order until they come near the head.
POLICY_MAX_JOBS = 1000


def _queue_heads(pending: Sequence[PendingJob], limit: int) -> list[PendingJob]:
    queues: dict[int, list[PendingJob]] = defaultdict(list)
    for job in pending:
        queues[job.tenant_id].append(job)
    for queue in queues.values():
        queue.sort(key=queue_order, reverse=True)  # pop() takes the head
    heads: list[PendingJob] = []
    while len(heads) < limit and queues:
        for tenant_id in sorted(queues):
            heads.append(queues[tenant_id].pop())
            if not queues[tenant_id]:
                del queues[tenant_id]
            if len(heads) == limit:
                break
    return heads


def _follow_policy(snapshot: Snapshot, policy: Policy) -> Snapshot:
    # Admission never moves running jobs, so the policy divides what is free among the pending ones.
    held = {device.device_id for job in snapshot.admitted for device in job.devices}
    capacity: dict[str, int] = defaultdict(int)
    for device in {d.device_id: d for d in snapshot.free if d.device_id not in held}.values():
        capacity[device.flavor] += 1
    heads = _queue_heads(snapshot.pending, POLICY_MAX_JOBS)
    classes = {job.job_id: job.job_class for job in heads}

    def rate(job: PolicyJob, config: Config) -> float:
        # Work per second in milli-NAU: what one device of each flavor is worth to the job's class.
        job_class = classes[job.job_id]
        return float(sum(n * snapshot.nau_rates.get((job_class, f), MILLI) for f, n in config.counts))

    pending = [
        PolicyJob(j.job_id, j.devices, j.flavors, j.submitted_at, j.tenant_id, mixable=len(j.flavors) > 1)
        for j in heads
    ]
    try:
        order = preferred_flavors(policy, pending, [], capacity, rate)
    except Exception as exc:  # the policy only orders flavors: it must never stop admission
        logger.warning("placement policy %s failed (%s); trying each job's flavors in its own order", policy.name, exc)
        return snapshot
    # Only the heads the policy saw can change order (a thousand of 10,000 waiting jobs): the rest stay as they are.
    return replace(
        snapshot,
        pending=[
            job if order.get(job.job_id, job.flavors) == job.flavors else replace(job, flavors=order[job.job_id])
            for job in snapshot.pending
        ],
    )
