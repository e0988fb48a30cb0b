// Renders the jobs table and keeps it live from the /ws/jobs/ WebSocket.
(function () {
  "use strict";
  const tbody = document.querySelector("#jobs tbody");
  const live = document.getElementById("live");
  const jobs = new Map();
  const events = new Map();  // job id -> its events, oldest first: pushed ones, and its history once asked for
  const history = new Map();  // job id -> "loading" or "loaded": its history, asked for when its events are opened

  // The portal's shared helpers (portal.js).
  const {text, fmtBytes, escapeHtml, deviceChips} = window.Polychip;
  const fmtLoss = (value) => window.Polychip.fmtNumber(value, 3);

  // "rank 2 (ascend-910b): 38 samples/step, 210 samples/s" per rank, then the split's balance.
  function rankLines(job) {
    const ranks = (job.ranks || []).filter((r) => r.micro_batch !== null && r.micro_batch !== undefined);
    if (!ranks.length || !["running", "admitted"].includes(job.state)) return "";
    const lines = ranks.map((r) => {
      const rate = typeof r.samples_per_s === "number" ? `, ${Math.round(r.samples_per_s)} samples/s` : "";
      return `<div class="rank" data-rank="${r.rank}">rank ${r.rank} (${escapeHtml(r.flavor)}): ${r.micro_batch} samples/step${rate}</div>`;
    });
    const b = job.balance;
    if (b) {
      const eff = typeof b.efficiency === "number" ? ` · efficiency ${Math.round(b.efficiency * 100)}%` : "";
      const acc = b.accumulation > 1 ? ` · ${b.accumulation} accumulation steps` : "";
      const moves = b.rebalances ? ` · ${b.rebalances} re-split${b.rebalances > 1 ? "s" : ""}` : "";
      const slow = (b.stragglers || []).length ? ` · straggler: rank ${b.stragglers.join(", ")}` : "";
      lines.push(`<div class="balance" data-testid="balance">balance ${escapeHtml(b.mode)}${eff}${acc}${moves}${slow}</div>`);
    }
    return `<div class="ranks">${lines.join("")}</div>`;
  }

  // "comm topk (density 0.01) · rank 0 sends 1.2 MB/step across groups · collective 35 ms · 80% hidden",
  // and auto's why.
  function commLine(job) {
    const c = job.comm;
    if (!c) return "";
    const asked = c.requested && c.requested.compression;
    if (!c.policy) {
      if (!asked || asked === "none" || !["queued", "admitted", "running"].includes(job.state)) return "";
      return `<div class="comm" data-testid="comm">comm ${escapeHtml(asked)} requested</div>`;
    }
    const parts = [`comm ${escapeHtml(c.policy)}${asked === "auto" ? " (auto)" : ""}`];
    const p = c.per_step;
    if (p) {
      const where = p.source === "run" ? " (run average)" : "";
      parts.push(`rank 0 sends ${fmtBytes(p.bytes_cross)}/step across groups${where}`);
      if (typeof p.collective_s === "number") parts.push(`collective ${(p.collective_s * 1000).toFixed(1)} ms`);
      if (typeof p.hidden_share === "number") parts.push(`${Math.round(p.hidden_share * 100)}% hidden`);
    }
    if (c.link && c.link.mode && c.link.mode !== "none") parts.push(`link ${c.link.gbit} Gbit/s (${escapeHtml(c.link.mode)})`);
    const why = asked === "auto" && c.reason ? `<div class="comm-reason">${escapeHtml(c.reason)}</div>` : "";
    const title = c.groups ? ` title="vendor groups: ${escapeHtml(JSON.stringify(c.groups))}${c.hierarchical ? ", hierarchical" : ""}"` : "";
    return `<div class="comm" data-testid="comm"${title}>${parts.join(" · ")}${why}</div>`;
  }

  // 0.0042 -> "4.2 ms", 5400 -> "1.5 h", as the advisor words durations.
  function fmtSeconds(s) {
    if (typeof s !== "number") return "–";
    if (s < 1) return `${+(s * 1000).toPrecision(2)} ms`;
    if (s < 120) return `${+s.toPrecision(3)} s`;
    if (s < 2 * 3600) return `${+(s / 60).toPrecision(3)} min`;
    if (s < 72 * 3600) return `${+(s / 3600).toPrecision(3)} h`;
    return `${+(s / 86400).toPrecision(3)} days`;
  }

  // "checkpoints every 50 steps (weights) / 250 (optimizer) · last: step 200 (full), 4.1 ms stall, 12 KB ·
  // restarts 1 of 3 · restored step 60 (saved on 3 ranks, now 2) · moving: node gpu-h100-0 drained by op".
  function recoveryLine(job) {
    const r = job.recovery;
    if (!r) return "";
    const eventful = r.checkpoints || r.restarts || r.restored || r.stop_requested;
    if (!eventful && ["succeeded", "failed", "cancelled"].includes(job.state)) return "";
    const parts = [];
    const p = r.checkpoint;
    if (p) parts.push(`checkpoints every ${p.weights_every} steps (weights) / ${p.optimizer_every} (optimizer)`);
    const c = r.checkpoints;
    const notes = [];
    if (c) {
      const kind = c.latest_kind ? ` (${escapeHtml(c.latest_kind)})` : "";
      const stall = typeof c.stall_ms_avg === "number" ? `, ${c.stall_ms_avg.toFixed(1)} ms stall` : "";
      const size = typeof c.bytes === "number" ? `, ${fmtBytes(c.bytes)}` : "";
      parts.push(`last: step ${text(c.latest_step)}${kind}${stall}${size}`);
      const write = typeof c.write_ms_avg === "number" ? `, writes ${c.write_ms_avg.toFixed(1)} ms` : "";
      notes.push(`${c.count} save(s); on average training stalls ${text(c.stall_ms_avg)} ms a save${write}${c.background ? " (in the background)" : ""}`);
    }
    parts.push(`restarts ${r.restarts} of ${r.max_restarts}`);
    const s = r.restored;
    if (s) {
      const where = s.saved_world_size && s.saved_world_size !== s.world_size
        ? ` (saved on ${s.saved_world_size} ranks, now ${s.world_size})`
        : s.world_size ? ` on ${s.world_size} rank${s.world_size > 1 ? "s" : ""}` : "";
      const skipped = (s.skipped || []).length ? `, skipped ${s.skipped.length} unusable` : "";
      parts.push(`restored step ${text(s.step)}${where}${skipped}`);
      const optimizer = s.optimizer_step === null || s.optimizer_step === undefined ? "fresh" : `from step ${s.optimizer_step}`;
      notes.push(`restored with ${text(s.mode)}: optimizer state ${optimizer}, in ${text(s.restore_s)} s`);
    }
    if (r.stop_requested) parts.push(`moving: ${escapeHtml(r.stop_requested)}`);
    if (r.last_failure && r.last_failure.reason) notes.push(`last failure: ${r.last_failure.reason}`);
    const title = notes.length ? ` title="${escapeHtml(notes.join("; "))}"` : "";
    return `<div class="recovery" data-testid="recovery"${title}>${parts.join(" · ")}</div>`;
  }

  // The interval advisor's suggestion, its reasoning one click away:
  // "suggested: weights every 120 steps, optimizer every 600 (Daly, checkpoint cost 4.2 ms, job MTBF 12.5 h)".
  function adviceLine(job) {
    const a = job.recovery && job.recovery.advice;
    if (!a) return "";
    const mtbf = typeof a.mtbf_s === "number" ? `job MTBF ${fmtSeconds(a.mtbf_s)}` : "no failures on record";
    const p = job.recovery.checkpoint;
    const same = p && p.weights_every === a.weights_every && p.optimizer_every === a.optimizer_every ? " · as configured" : "";
    const summary = `suggested: weights every ${a.weights_every} steps, optimizer every ${a.optimizer_every} `
      + `(Daly, checkpoint cost ${fmtSeconds(a.checkpoint_cost_s)}, ${mtbf})${same}`;
    const source = a.failure_rate_source ? ` Failure rate: ${escapeHtml(a.failure_rate_source)}.` : "";
    return `<details class="advice" data-testid="advice"><summary title="${escapeHtml(a.reasoning || "")}">${summary}</summary>`
      + `<div class="advice-reasoning">${escapeHtml(a.reasoning || "")}${source}</div></details>`;
  }

  // Periodic progress ticks ("step 40/300") are what the progress bar already shows; every other
  // event (transitions, recovery, stragglers) is listed.
  function listed(event) { return !(event.kind === "progress" && event.data && "steps_done" in event.data); }

  const EVENTS_SHOWN = 20;
  const EVENTS_KEPT = 200;  // per job: a page left open for days must not grow without bound

  function addEvents(jobId, incoming) {
    const byId = new Map((events.get(jobId) || []).map((e) => [e.id, e]));
    for (const e of incoming.filter(listed)) byId.set(e.id, e);
    events.set(jobId, [...byId.values()].sort((a, b) => a.id - b.id).slice(-EVENTS_KEPT));
  }

  const MARKERS = {recovery: "↻", transition: "→", progress: "·"};

  function eventList(job) {
    const all = events.get(job.id) || [];
    const shown = all.slice(-EVENTS_SHOWN);
    const items = shown.map((e) => {
      const at = e.created_at ? new Date(e.created_at).toLocaleTimeString() : "";
      const moved = e.kind === "transition" && e.to_state ? `${escapeHtml(e.from_state || "new")} → ${escapeHtml(e.to_state)}${e.message ? ": " : ""}` : "";
      const marker = `<span class="marker" title="${escapeHtml(e.kind)}">${MARKERS[e.kind] || "·"}</span>`;
      return `<li class="event ${escapeHtml(e.kind)}" data-kind="${escapeHtml(e.kind)}"><time>${at}</time> ${marker} ${moved}${escapeHtml(e.message || "")}</li>`;
    });
    const more = all.length > shown.length ? `<li class="muted">… ${all.length - shown.length} earlier</li>` : "";
    const loaded = history.get(job.id) === "loaded";
    const empty = loaded ? "no events yet" : history.has(job.id) ? "loading…" : "";
    const body = items.length ? `<ol>${more}${items.join("")}</ol>` : `<div class="muted">${empty}</div>`;
    return `<details class="events" data-testid="events" data-job="${job.id}"><summary>events${loaded ? ` (${all.length})` : ""}</summary>${body}</details>`;
  }

  // A job's history comes from the API (the portal's session signs the request) the first time its
  // events are opened; what is pushed after that is added as it arrives.
  function loadHistory(jobId) {
    if (history.has(jobId)) return;
    history.set(jobId, "loading");
    // The events come in pages: follow each answer's next link until the last page.
    const page = (url) =>
      fetch(url, {credentials: "same-origin", headers: {Accept: "application/json"}})
        .then((response) => (response.ok ? response.json() : Promise.reject(new Error(`HTTP ${response.status}`))))
        .then((body) => {
          addEvents(jobId, body.events || []);
          return body.next ? page(body.next) : null;
        });
    page(`/api/v1/jobs/${jobId}/events?limit=500`)
      .then(() => {
        history.set(jobId, "loaded");
        if (jobs.has(jobId)) render(jobs.get(jobId));
      })
      .catch(() => { history.delete(jobId); });
  }

  tbody.addEventListener("toggle", (e) => {
    const details = e.target;
    if (details.matches && details.matches("details.events") && details.open) loadHistory(Number(details.dataset.job));
  }, true);

  // The first unfiltered page takes new jobs as they come; a filtered or older page only updates its rows.
  const takesNew = document.getElementById("jobs").dataset.liveNew === "yes";

  function render(job, {initial = false} = {}) {
    let row = tbody.querySelector(`tr[data-job="${job.id}"]`);
    if (!row && !initial && (!takesNew || job.id <= newestShown)) return;
    if (!row) newestShown = Math.max(newestShown, job.id);
    if (!row) {
      tbody.querySelector("tr.empty")?.remove();
      row = document.createElement("tr");
      row.dataset.job = job.id;
      tbody.prepend(row);
    }
    const pct = Math.round((job.progress.fraction || 0) * 100);
    let reason = job.state === "failed" ? job.failure_reason : job.state === "queued" ? job.pending_reason : "";
    if (job.state === "recovering") {
      const r = job.recovery || {};
      reason = job.pending_reason || (r.stop_requested ? `moving: ${r.stop_requested}` : (r.last_failure && r.last_failure.reason) || "recovering");
    }
    if (job.state === "queued" && job.queue_position) reason = `#${job.queue_position} in your queue · ${reason || "waiting"}`;
    const charge = job.quota ? `<span class="chip nau" title="charged against your quota">${job.quota.nau.toFixed(2)} NAU${job.quota.borrowing ? " · borrowed" : ""}</span>` : "";
    const changed = row.dataset.state && row.dataset.state !== job.state;
    row.dataset.state = job.state;
    // Redrawing the row must not close what the user opened (its events, the advice's reasoning).
    const open = new Set([...row.querySelectorAll("details[open]")].map((d) => d.dataset.testid));
    row.innerHTML = `
      <td class="num">${job.id}</td>
      <td><a href="/jobs/${job.id}">${escapeHtml(job.name)}</a>${eventList(job)}</td>
      <td><span class="state ${job.state}" data-testid="state">${job.state}</span>
          ${reason ? `<div class="reason">${escapeHtml(reason)}</div>` : ""}</td>
      <td><div class="chips">${deviceChips(job.devices)}${charge}</div>${rankLines(job)}${commLine(job)}${recoveryLine(job)}${adviceLine(job)}</td>
      <td><span class="bar-outer" role="progressbar" aria-label="progress of job ${job.id}" aria-valuemin="0" aria-valuemax="100" aria-valuenow="${pct}"><span class="bar-inner" style="width:${pct}%"></span></span>
          <span class="num">${job.progress.steps_done}/${job.progress.total_steps}</span></td>
      <td class="num">${job.loss.first === null ? "–" : `${fmtLoss(job.loss.first)} → ${fmtLoss(job.loss.last)}`}</td>
      <td class="num">${text(job.progress.samples_per_s)}</td>`;
    for (const d of row.querySelectorAll("details")) if (open.has(d.dataset.testid)) d.open = true;
    if (changed) { row.classList.remove("flash"); void row.offsetWidth; row.classList.add("flash"); }
    jobs.set(job.id, job);
  }

  const initial = JSON.parse(document.getElementById("initial-jobs").textContent);
  // A job newer than the page's newest is new since the page was drawn; an older one missing from the
  // page belongs to another page (the socket's snapshot holds the newest hundred).
  let newestShown = initial.reduce((most, job) => Math.max(most, job.id), 0);
  for (const job of initial.slice().reverse()) render(job, {initial: true});

  // The quota and pool cards follow what jobs do: read again from the API after a change (at most
  // once a second) and every 30 s, so they never go stale until a reload.
  const fmtAmount = (v) => String(Math.round(v * 1000) / 1000);
  function setCell(row, name, value) {
    const cell = row && row.querySelector(`[data-cell="${name}"]`);
    if (cell && cell.textContent !== value) cell.textContent = value;
  }
  async function refreshCards() {
    const [quotas, pool] = await Promise.all([window.Polychip.api("/api/v1/quotas"), window.Polychip.api("/api/v1/pool")]);
    for (const q of quotas.quotas) {
      const row = document.querySelector(`#quotas tr[data-resource="${CSS.escape(q.resource)}"]`);
      if (!row) continue;
      setCell(row, "in-use", `${fmtAmount(q.in_use)} / ${fmtAmount(q.nominal)} ${q.unit}`);
      setCell(row, "cohort-can-lend", q.cohort ? `${fmtAmount(q.cohort_can_lend)} (${q.cohort})` : "–");
      const scale = Math.max(q.nominal, q.in_use) || 1;
      row.querySelector(".quota-bar .own").style.width = `${(100 * Math.min(q.in_use, q.nominal)) / scale}%`;
      row.querySelector(".quota-bar .borrowed").style.width = `${(100 * q.borrowed) / scale}%`;
      row.querySelector(".quota-bar .nominal-mark").style.left = `${(100 * q.nominal) / scale}%`;
    }
    for (const f of pool.flavors) {
      const row = document.querySelector(`table.pool tr[data-flavor="${CSS.escape(f.flavor)}"]`);
      setCell(row, "healthy", `${f.devices.healthy} / ${f.devices.total}`);
      for (const state of ["degraded", "cordoned", "failed"]) setCell(row, state, String(f.health[state] || 0));
      setCell(row, "allocated", String(f.devices.allocated));
    }
  }
  let cardsTimer = null;
  function cardsSoon() {
    if (cardsTimer) return;
    // A failed read leaves the cards as they were; the next change or the 30 s timer reads again.
    cardsTimer = setTimeout(() => { cardsTimer = null; refreshCards().catch(() => {}); }, 1000);
  }
  setInterval(cardsSoon, 30000);

  window.Polychip.jobSocket({
    status: live,
    onEvent: (job, event) => { if (event) addEvents(job.id, [event]); render(job); if (event && event.kind === "transition") cardsSoon(); },
    onSnapshot: (snapshot) => { for (const job of snapshot.slice().reverse()) render(job); },
  });
})();
