// Renders the jobs table and keeps it live from the /ws/jobs/ WebSocket.
(function () {
  "use strict";
  const tbody = document.querySelector("#jobs tbody");
  const live = document.getElementById("live");
  const jobs = new Map();

  function text(value) { return value === null || value === undefined ? "–" : String(value); }
  function fmtLoss(value) { return typeof value === "number" ? value.toFixed(3) : "–"; }

  function deviceChips(devices) {
    const counts = new Map();
    for (const d of devices) counts.set(d.flavor, (counts.get(d.flavor) || 0) + 1);
    if (!counts.size) return "–";
    return [...counts].map(([flavor, n]) => `<span class="chip">${n}× ${flavor}</span>`).join("");
  }

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

  // 1234567 -> "1.2 MB" (decimal units, as links are quoted).
  function fmtBytes(n) {
    if (typeof n !== "number") return "–";
    const units = ["B", "KB", "MB", "GB"];
    let i = 0;
    while (n >= 1000 && i < units.length - 1) { n /= 1000; i += 1; }
    return `${i ? n.toFixed(n < 10 ? 1 : 0) : Math.round(n)} ${units[i]}`;
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

  function render(job) {
    let row = tbody.querySelector(`tr[data-job="${job.id}"]`);
    if (!row) {
      tbody.querySelector("tr.empty")?.remove();
      row = document.createElement("tr");
      row.dataset.job = job.id;
      tbody.prepend(row);
    }
    const pct = Math.round((job.progress.fraction || 0) * 100);
    let reason = job.state === "failed" ? job.failure_reason : job.state === "queued" ? job.pending_reason : "";
    if (job.state === "queued" && job.queue_position) reason = `#${job.queue_position} in your queue · ${reason || "waiting"}`;
    const charge = job.quota ? `<span class="chip nau" title="charged against your quota">${job.quota.nau.toFixed(2)} NAU${job.quota.borrowing ? " · borrowed" : ""}</span>` : "";
    const changed = row.dataset.state && row.dataset.state !== job.state;
    row.dataset.state = job.state;
    row.innerHTML = `
      <td class="num">${job.id}</td>
      <td>${escapeHtml(job.name)}</td>
      <td><span class="state ${job.state}" data-testid="state">${job.state}</span>
          ${reason ? `<div class="reason">${escapeHtml(reason)}</div>` : ""}</td>
      <td><div class="chips">${deviceChips(job.devices)}${charge}</div>${rankLines(job)}${commLine(job)}</td>
      <td><span class="bar-outer"><span class="bar-inner" style="width:${pct}%"></span></span>
          <span class="num">${job.progress.steps_done}/${job.progress.total_steps}</span></td>
      <td class="num">${job.loss.first === null ? "–" : `${fmtLoss(job.loss.first)} → ${fmtLoss(job.loss.last)}`}</td>
      <td class="num">${text(job.progress.samples_per_s)}</td>`;
    if (changed) { row.classList.remove("flash"); void row.offsetWidth; row.classList.add("flash"); }
    jobs.set(job.id, job);
  }

  function escapeHtml(s) {
    return String(s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  }

  const initial = JSON.parse(document.getElementById("initial-jobs").textContent);
  for (const job of initial.slice().reverse()) render(job);

  let delay = 500;
  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(`${scheme}://${location.host}/ws/jobs/`);
    socket.onopen = () => { live.textContent = "live"; live.className = "live on"; delay = 500; };
    socket.onmessage = (message) => {
      const data = JSON.parse(message.data);
      if (data.type === "job_event") render(data.job);
      else if (data.type === "snapshot") for (const job of data.jobs.slice().reverse()) render(job);
    };
    socket.onclose = () => {
      live.textContent = "reconnecting…"; live.className = "live off";
      setTimeout(connect, delay); delay = Math.min(delay * 2, 10000);
    };
  }
  connect();
})();
