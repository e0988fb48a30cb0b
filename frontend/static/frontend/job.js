// A job's page: its state and actions, live charts, logs per rank, checkpoints, cost and timeline.
// Everything comes from the REST API under the page's session; state changes come over the WebSocket.
(function () {
  "use strict";
  const P = window.Polychip;
  const $ = (id) => document.getElementById(id);
  let job = JSON.parse($("initial-job").textContent);
  const jobId = job.id;
  const base = `/api/v1/jobs/${jobId}`;
  const running = () => !P.TERMINAL.includes(job.state);

  // --- summary and actions ------------------------------------------------------------------------

  function figure(label, value, testid) {
    return `<div${testid ? ` data-testid="${testid}"` : ""}><div class="label">${label}</div><div class="figure">${value}</div></div>`;
  }

  function renderSummary() {
    const state = $("state");
    state.textContent = job.state;
    state.className = `state ${job.state}`;
    let reason = job.state === "failed" ? job.failure_reason : job.state === "queued" ? job.pending_reason : "";
    if (job.state === "queued") reason = `#${job.queue_position || "?"} in your queue · ${reason || "waiting for the next admission cycle"}`;
    if (job.state === "recovering") reason = job.pending_reason || (job.recovery && job.recovery.stop_requested) || "recovering";
    $("reason").textContent = reason || "";
    $("reason").dataset.testid = "reason";
    $("cancel").disabled = !running();
    $("retry").disabled = running();
    if (document.activeElement !== $("priority")) $("priority").value = job.priority;
    $("priority").disabled = $("set-priority").disabled = job.state !== "queued";
    const p = job.progress;
    const pct = Math.round((p.fraction || 0) * 100);
    const b = job.balance || {};
    const c = job.comm || {};
    const cross = c.per_step && typeof c.per_step.bytes_cross === "number" ? `${P.fmtBytes(c.per_step.bytes_cross)}/step` : "–";
    const charge = job.quota ? `${job.quota.nau.toFixed(2)} NAU${job.quota.borrowing ? " (borrowed)" : ""}` : "–";
    $("figures").innerHTML = [
      figure("Progress", `<span class="bar-outer" role="progressbar" aria-label="progress" aria-valuemin="0" aria-valuemax="100" aria-valuenow="${pct}"><span class="bar-inner" style="width:${pct}%"></span></span> ${p.steps_done}/${p.total_steps}`, "progress"),
      figure("Loss", job.loss.first === null ? "–" : `${P.fmtNumber(job.loss.first)} → ${P.fmtNumber(job.loss.last)}`, "loss"),
      figure("Samples/s", P.text(p.samples_per_s), "samples"),
      figure("Devices", `<span class="chips">${P.deviceChips(job.devices)}</span>`, "devices"),
      figure("Balance", typeof b.efficiency === "number" ? `${Math.round(b.efficiency * 100)}% (${P.escapeHtml(b.mode)})` : P.escapeHtml(b.mode || "–"), "balance"),
      figure("Communication", `${P.escapeHtml(c.policy || (c.requested && c.requested.compression) || "none")} · ${cross}`, "comm"),
      figure("Quota charge", charge, "charge"),
      figure("Attempt", `${job.attempt} · ${job.restarts} restart(s) · ${job.preemptions} preemption(s)`, "attempt"),
      figure("Submitted", P.fmtTime(job.created_at)),
      figure("Finished", P.fmtTime(job.finished_at)),
    ].join("");
  }

  async function act(button, path, body, done) {
    $("action-error").textContent = "";
    button.disabled = true;
    try {
      const answer = await P.api(`${base}/${path}`, {method: "POST", body});
      done(answer);
    } catch (error) {
      $("action-error").textContent = error.message;
    } finally {
      renderSummary();
    }
  }

  $("cancel").addEventListener("click", () => {
    if (!window.confirm(`Cancel job ${jobId}? Its devices are given back; its checkpoints stay.`)) return;
    act($("cancel"), "cancel", undefined, (answer) => { job = answer; renderAll(); P.announce(`job ${jobId} cancelled`); });
  });
  $("retry").addEventListener("click", () => act($("retry"), "retry", undefined, (answer) => { location.href = `/jobs/${answer.id}`; }));
  $("set-priority").addEventListener("click", () => {
    const value = Number($("priority").value);
    act($("set-priority"), "priority", {priority: value}, (answer) => { job = answer; renderAll(); P.announce(`priority set to ${answer.priority}`); });
  });

  // --- ranks and attempts -------------------------------------------------------------------------

  function renderRanks() {
    const stats = new Map((job.ranks || []).map((r) => [r.rank, r]));
    const rows = P.currentDevices(job.devices).map((d) => {
      const r = stats.get(d.rank) || {};
      return `<tr data-rank="${d.rank}"><td class="num">${d.rank}</td><td>${P.escapeHtml(d.device_id)}</td><td>${P.escapeHtml(d.flavor)}</td>`
        + `<td>${P.escapeHtml(d.node)}</td><td class="num">${P.text(r.micro_batch)}</td><td class="num">${typeof r.samples_per_s === "number" ? Math.round(r.samples_per_s) : "–"}</td></tr>`;
    });
    $("ranks").tBodies[0].innerHTML = rows.join("") || `<tr><td colspan="6" class="muted">No devices yet: the job has not been admitted.</td></tr>`;
    const b = job.balance || {};
    const parts = [`balancing ${P.escapeHtml(b.mode || "–")}`];
    if (typeof b.efficiency === "number") parts.push(`efficiency ${Math.round(b.efficiency * 100)}%`);
    if (b.accumulation > 1) parts.push(`${b.accumulation} accumulation steps`);
    if (b.rebalances) parts.push(`${b.rebalances} re-split(s)`);
    if ((b.stragglers || []).length) parts.push(`straggler: rank ${b.stragglers.join(", ")}`);
    const c = job.comm || {};
    if (c.policy) parts.push(`comm ${P.escapeHtml(c.policy)}${c.reason ? ` (${P.escapeHtml(c.reason)})` : ""}`);
    $("balance").innerHTML = parts.join(" · ");
    // Attempts: the allocations that started together, oldest first.
    const attempts = new Map();
    for (const d of job.devices) {
      const key = d.started_at || "";
      if (!attempts.has(key)) attempts.set(key, []);
      attempts.get(key).push(d);
    }
    const list = [...attempts.entries()].sort(([a], [b]) => (a < b ? -1 : 1)).map(([start, devices], i) => {
      const flavors = new Map();
      for (const d of devices) flavors.set(d.flavor, (flavors.get(d.flavor) || 0) + 1);
      const ended = devices.every((d) => d.ended_at) ? P.fmtTime(devices[0].ended_at) : "holding now";
      const what = [...flavors].map(([f, n]) => `${n}× ${P.escapeHtml(f)}`).join(", ");
      return `<tr><td class="num">${i + 1}</td><td>${what}</td><td>${P.escapeHtml([...new Set(devices.map((d) => d.node))].join(", "))}</td><td>${P.fmtTime(start)}</td><td>${ended}</td></tr>`;
    });
    $("attempts").innerHTML = list.length
      ? `<table><thead><tr><th>#</th><th>Devices</th><th>Nodes</th><th>From</th><th>Until</th></tr></thead><tbody>${list.join("")}</tbody></table>`
      : `<p class="muted">None yet.</p>`;
  }

  function renderRecovery() {
    const r = job.recovery || {};
    const parts = [`${r.restarts ?? job.restarts} restart(s) of at most ${P.text(r.max_restarts)}`];
    if (r.checkpoint) parts.push(`checkpoints every ${r.checkpoint.weights_every} steps (weights), ${r.checkpoint.optimizer_every} (optimizer)`);
    if (r.checkpoints) parts.push(`${r.checkpoints.count} saved, the last at step ${P.text(r.checkpoints.latest_step)}, ${P.text(r.checkpoints.stall_ms_avg)} ms stall on average`);
    if (r.last_failure && r.last_failure.reason) parts.push(`last failure: ${P.escapeHtml(r.last_failure.reason)}`);
    if (r.restored) parts.push(`restored step ${P.text(r.restored.step)} in ${P.text(r.restored.restore_s)} s`);
    if (r.stop_requested) parts.push(`moving: ${P.escapeHtml(r.stop_requested)}`);
    if (r.advice) parts.push(`suggested: weights every ${r.advice.weights_every} steps`);
    $("recovery").innerHTML = `<ul>${parts.map((p) => `<li>${p}</li>`).join("")}</ul>`;
  }

  // --- charts -----------------------------------------------------------------------------------

  const charts = {};
  function chart(id, label, color) {
    const options = {
      scales: {x: {time: false}},
      axes: [{label: "step"}, {}],
      series: [{label: "step"}, {label, stroke: color, width: 2, points: {show: false}}],
      legend: {show: true},
    };
    charts[id] = P.chart($(id), options, [[], []]);
    $(id).dataset.points = "0";
  }

  // What each chart draws, step -> value: the series as read (downsampled to at most CHART_POINTS),
  // with the points pushed since added on.
  const CHART_OF = {loss: "chart-loss", samples_per_s: "chart-speed"};
  const CHART_POINTS = 1000;
  const drawn = {"chart-loss": new Map(), "chart-speed": new Map()};

  function draw(id) {
    const steps = [...drawn[id].keys()].sort((a, b) => a - b);
    charts[id].setData([steps, steps.map((s) => drawn[id].get(s))]);
    $(id).dataset.points = String(steps.length);
  }

  // Points pushed over the WebSocket as rank 0 reports them.
  function addPoints(points) {
    const touched = new Set();
    for (const p of points) {
      const id = CHART_OF[p.name];
      if (!id || typeof p.value !== "number") continue;
      drawn[id].set(p.step, p.value);
      touched.add(id);
    }
    for (const id of touched) draw(id);
    // Past twice the read's size, read the series again: it comes back downsampled.
    if ([...touched].some((id) => drawn[id].size > 2 * CHART_POINTS)) pollMetrics();
  }

  async function loadMetrics() {
    try {
      const body = await P.api(`${base}/metrics?name=loss,samples_per_s&points=${CHART_POINTS}`);
      for (const series of body.series) {
        const id = CHART_OF[series.name];
        const read = new Map(series.points.filter((p) => typeof p.value === "number").map((p) => [p.step, p.value]));
        // Points pushed while the read was on its way, beyond its last step, stay.
        const last = Math.max(-1, ...read.keys());
        for (const [step, value] of drawn[id]) if (step > last) read.set(step, value);
        drawn[id] = read;
        draw(id);
      }
      const total = body.series.reduce((n, s) => n + s.total_points, 0);
      $("chart-note").textContent = total ? "" : "No points yet: they arrive as rank 0 reports its steps.";
    } catch (error) {
      $("chart-note").textContent = `Metrics unavailable: ${error.message}`;
    }
  }

  // --- logs -------------------------------------------------------------------------------------

  const MAX_LINES = 5000;
  let lines = [];
  let follow = null;  // the AbortController of the stream being read
  let cursor = null;

  function logQuery() {
    const rank = $("log-rank").value;
    return rank === "" ? "" : `&rank=${rank}`;
  }

  function showLines() {
    const term = $("log-search").value.trim().toLowerCase();
    const box = $("logs");
    const stick = box.scrollTop + box.clientHeight >= box.scrollHeight - 20;
    const shown = term ? lines.filter((l) => l.line.toLowerCase().includes(term)) : lines;
    box.innerHTML = shown.map((l) => {
      let body = P.escapeHtml(l.line);
      if (term) body = body.replace(new RegExp(term.replace(/[.*+?^${}()|[\]\\]/g, "\\$&").replace(/[&<>"']/g, (c) => P.escapeHtml(c)), "gi"), (m) => `<mark>${m}</mark>`);
      return `<div class="line" data-rank="${l.rank}"><span class="rank">[${l.rank}]</span> ${body}</div>`;
    }).join("") || `<div class="muted">${term ? "No line matches." : "No output yet."}</div>`;
    box.dataset.lines = String(lines.length);
    if (stick) box.scrollTop = box.scrollHeight;
  }

  function take(record) {
    if (record.cursor !== undefined) { cursor = record.cursor; return; }
    if (record.dropped !== undefined) { lines.push({rank: record.rank, line: `[polychip] ${record.dropped} earlier lines were dropped (size cap)`}); return; }
    if (record.line !== undefined) lines.push(record);
  }

  let redraw = null;
  function scheduleRedraw() {
    if (redraw) return;
    redraw = requestAnimationFrame(() => { redraw = null; lines = lines.slice(-MAX_LINES); showLines(); });
  }

  async function readLogs() {
    if (follow) follow.abort();
    const controller = new AbortController();
    follow = controller;
    const live = $("log-follow").checked && running();
    const since = cursor ? `&since=${encodeURIComponent(cursor)}` : "&tail=1000";
    const url = `${base}/logs?format=jsonl${since}${logQuery()}${live ? "&follow=true" : ""}`;
    $("log-download").href = `${base}/logs?format=text${logQuery()}`;
    $("logs-status").textContent = live ? "following" : "";
    try {
      const response = await fetch(url, {credentials: "same-origin", signal: controller.signal});
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffered = "";
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        buffered += decoder.decode(value, {stream: true});
        const parts = buffered.split("\n");
        buffered = parts.pop();
        for (const part of parts) if (part.trim()) take(JSON.parse(part));
        scheduleRedraw();
      }
      if (buffered.trim()) take(JSON.parse(buffered));
      scheduleRedraw();
      $("logs-status").textContent = "";
      // The stream ends with the attempt's run; a restarted job goes on in a new one.
      if (live && follow === controller && running()) setTimeout(readLogs, 2000);
    } catch (error) {
      if (error.name === "AbortError") return;
      $("logs-status").textContent = `logs: ${error.message}; retrying`;
      setTimeout(() => { if (follow === controller) readLogs(); }, 3000);
    }
  }

  function restartLogs() { lines = []; cursor = null; showLines(); readLogs(); }
  $("log-rank").addEventListener("change", restartLogs);
  $("log-follow").addEventListener("change", readLogs);
  $("log-search").addEventListener("input", showLines);

  function rankOptions() {
    const select = $("log-rank");
    const ranks = new Set(job.devices.map((d) => d.rank));
    for (const rank of [...ranks].sort((a, b) => a - b)) {
      if (!select.querySelector(`option[value="${rank}"]`)) {
        const option = document.createElement("option");
        option.value = String(rank);
        option.textContent = `rank ${rank}`;
        select.append(option);
      }
    }
  }

  // --- checkpoints and cost -----------------------------------------------------------------------

  async function loadCheckpoints() {
    try {
      const body = await P.api(`${base}/checkpoints`);
      const rows = body.checkpoints.map((c) => `<tr data-step="${c.step}"><td class="num">${c.step}</td><td>${P.escapeHtml(c.kind)}</td>`
        + `<td class="num">${P.fmtBytes(c.size_bytes)}</td><td>${P.fmtTime(c.created_at)}</td><td><a href="${c.download}" download>Download step ${c.step}</a></td></tr>`);
      const model = body.final_model ? `<p><a href="${body.final_model.download}" download data-testid="model">Download the final model</a> (${P.fmtBytes(body.final_model.size_bytes)})</p>` : "";
      $("checkpoints").innerHTML = (rows.length
        ? `<table><thead><tr><th>Step</th><th>Kind</th><th>Size</th><th>Saved</th><th></th></tr></thead><tbody>${rows.join("")}</tbody></table>`
        : `<p class="muted">No checkpoint yet.</p>`) + model;
    } catch (error) {
      $("checkpoints").innerHTML = `<p class="error">${P.escapeHtml(error.message)}</p>`;
    }
  }

  async function loadCost() {
    try {
      const body = await P.api(`${base}/usage`);
      let total = 0;
      const rows = body.usage.map((u) => {
        total += Number(u.cost);
        const hours = (Number(u.device_seconds) / 3600).toFixed(4);
        return `<tr data-flavor="${P.escapeHtml(u.flavor)}"><td>${P.escapeHtml(u.flavor)}</td><td class="num">${u.devices}</td><td class="num">${hours}</td><td class="num">${P.escapeHtml(u.cost)}</td></tr>`;
      });
      $("cost").innerHTML = rows.length
        ? `<table><thead><tr><th>Flavor</th><th>Devices</th><th>Device-hours</th><th>Cost (${P.escapeHtml(body.currency)})</th></tr></thead><tbody>${rows.join("")}</tbody>`
          + `<tfoot><tr><th colspan="3">Total</th><td class="num" data-testid="cost-total">${body.currency} ${total.toFixed(2)}</td></tr></tfoot></table>`
        : `<p class="muted">Nothing metered yet: usage is recorded as the job holds devices.</p>`;
    } catch (error) {
      $("cost").innerHTML = `<p class="error">${P.escapeHtml(error.message)}</p>`;
    }
  }

  // --- what would let a waiting job start ---------------------------------------------------------

  function until(iso) {
    if (!iso) return "no estimate yet";
    const minutes = Math.max(0, Math.round((Date.parse(iso) - Date.now()) / 60000));
    return `about ${new Date(iso).toLocaleTimeString([], {hour: "2-digit", minute: "2-digit"})} (in ${minutes < 90 ? `${minutes} min` : `${(minutes / 60).toFixed(1)} h`})`;
  }
  const holder = (h) => (h.job_id
    ? `<a href="/jobs/${h.job_id}">your job #${h.job_id}</a>, ${h.devices} device(s): ends ${h.expected_end ? until(h.expected_end) : "at no estimate yet (no speed reported)"}`
    : `other tenants' jobs, ${h.devices} device(s) in all`);

  function renderOutlook(o) {
    $("outlook-card").hidden = !o.waiting;
    if (!o.waiting) return;
    const items = o.flavors.map((f) => {
      let when;
      if (f.never) when = `it asks for more than the ${f.in_service} in service: never, unless devices are added or it allows more flavors`;
      else if (!f.lacking) when = "enough are free now: it starts at the next admission cycle, unless quota or jobs ahead take them";
      else when = `lacks ${f.lacking}; enough should be free by ${f.expected_at ? until(f.expected_at) : "a time that cannot be estimated yet"}`;
      const holders = f.holders.length ? `<ul>${f.holders.map((h) => `<li>${holder(h)}</li>`).join("")}</ul>` : "";
      return `<li data-flavor="${P.escapeHtml(f.flavor)}"><strong>${P.escapeHtml(f.flavor)}</strong>: ${f.free} of ${f.in_service} free; ${when}${holders}</li>`;
    });
    let quota = "";
    if (o.quota_blocked) {
      const own = o.own_running.map((h) => `<li>${holder(h)}</li>`).join("");
      quota = `<p data-testid="outlook-quota">Your quota is what holds it: it starts when your running jobs give back their share${own ? "" : " (none runs now)"}, or when an operator raises the quota.</p>${own ? `<ul>${own}</ul>` : ""}`;
    }
    $("outlook").innerHTML = `${quota}<ul class="outlook">${items.join("")}</ul>`;
  }

  let outlookTimer = null;
  function loadOutlook() {
    clearTimeout(outlookTimer);
    if (job.state !== "queued") { $("outlook-card").hidden = true; return; }
    P.api(`${base}/outlook`).then(renderOutlook).catch((error) => { $("outlook").textContent = `Outlook unavailable: ${error.message}`; })
      .finally(() => { if (job.state === "queued") outlookTimer = setTimeout(loadOutlook, 15000); });
  }

  // --- timeline ---------------------------------------------------------------------------------

  const seen = new Set();
  function addEvent(e) {
    if (seen.has(e.id) || (e.kind === "progress" && e.data && "steps_done" in e.data)) return;
    seen.add(e.id);
    const li = document.createElement("li");
    li.dataset.kind = e.kind;
    const moved = e.kind === "transition" && e.to_state ? `${e.from_state || "new"} → ${e.to_state}${e.message ? ": " : ""}` : "";
    li.innerHTML = `<time datetime="${P.escapeHtml(e.created_at)}">${P.fmtTime(e.created_at)}</time>${P.escapeHtml(moved)}${P.escapeHtml(e.message || "")}`;
    $("timeline").append(li);
  }

  async function loadEvents(url = `${base}/events?limit=500`) {
    const body = await P.api(url);
    for (const e of body.events) addEvent(e);
    if (body.next) await loadEvents(body.next);
  }

  // --- live -------------------------------------------------------------------------------------

  function renderAll() { renderSummary(); renderRanks(); renderRecovery(); rankOptions(); }

  // New points arrive over the WebSocket; the series is also read now and then, for what a push does
  // not carry (a step trained again after a restore, a point committed late) and while the socket is down.
  let metricsTimer = null;
  function pollMetrics() {
    clearTimeout(metricsTimer);
    loadMetrics().finally(() => { if (running()) metricsTimer = setTimeout(pollMetrics, $("live").classList.contains("on") ? 15000 : 2000); });
  }

  P.jobSocket({
    status: $("live"),
    metricsOf: jobId,
    onMetrics: addPoints,
    onEvent: (changed, event) => {
      if (changed.id !== jobId) return;
      const was = job.state;
      job = changed;
      renderAll();
      if (event) addEvent(event);
      loadOutlook();
      if (was !== job.state) {
        P.announce(`job ${jobId} is ${job.state}`);
        if (["running", "recovering"].includes(job.state) || !running()) { pollMetrics(); loadCost(); loadCheckpoints(); }
        if (job.state === "running" && !follow) readLogs();
      }
    },
    onSnapshot: (jobs) => {
      const fresh = jobs.find((j) => j.id === jobId);
      if (fresh) { job = fresh; renderAll(); }
    },
  });

  chart("chart-loss", "loss", "#3056d3");
  chart("chart-speed", "samples/s", "#0f9d58");
  renderAll();
  loadOutlook();
  pollMetrics();
  readLogs();
  loadCheckpoints();
  loadCost();
  loadEvents().catch((error) => { $("timeline").innerHTML = `<li class="error">${P.escapeHtml(error.message)}</li>`; });
  // While the job runs, its cost and checkpoints grow: refresh them now and then.
  setInterval(() => { if (running()) { loadCost(); loadCheckpoints(); } }, 10000);
})();
