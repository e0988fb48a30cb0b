// The operator console: the cluster map (nodes x devices, health, what runs where; cordon, drain, mark
// failed, return to service) and the queue across tenants with the cohorts' quotas. Refreshed every
// few seconds from the operator API; actions go through the same API.
(function () {
  "use strict";
  const P = window.Polychip;
  const $ = (id) => document.getElementById(id);
  const REFRESH_MS = 3000;

  function failed(error) { $("console-error").textContent = error.message; }
  function fresh() { $("live").textContent = `updated ${new Date().toLocaleTimeString()}`; $("live").className = "live on"; }

  // --- the cluster map --------------------------------------------------------------------------

  function cell(d, node) {
    const job = d.job ? `<a href="#" data-testid="holder" data-job="${d.job.id}" title="${P.escapeHtml(d.job.tenant)} · job ${d.job.id} rank ${d.job.rank} (${P.escapeHtml(d.job.state)})">#${d.job.id}</a> r${d.job.rank}` : "idle";
    const score = typeof d.failure_score === "number" ? ` · risk ${(d.failure_score * 100).toFixed(0)}%` : "";
    const actions = [];
    if (d.health === "healthy" || d.health === "degraded") actions.push(["cordoned", "Cordon"], ["failed", "Mark failed"]);
    else actions.push(["healthy", "Return to service"]);
    const buttons = actions.map(([health, label]) => `<button type="button" class="small" data-device="${P.escapeHtml(d.device_id)}" data-health="${health}" aria-label="${label} ${P.escapeHtml(d.device_id)}">${label}</button>`).join(" ");
    return `<div class="cell ${d.health}${d.job ? " busy" : ""}" data-device="${P.escapeHtml(d.device_id)}" data-health="${d.health}">`
      + `<div><strong>${d.index}</strong> ${P.escapeHtml(d.health)}${score}</div><div>${job}</div><details><summary>actions</summary>${buttons}</details></div>`;
  }

  function drawCluster(body) {
    $("flavors").innerHTML = `<table><thead><tr><th>Flavor</th><th>Devices</th><th>Healthy</th><th>Degraded</th><th>Cordoned</th><th>Failed</th><th>In use</th><th>Utilization</th></tr></thead><tbody>`
      + body.flavors.map((f) => {
        const h = f.health || {};
        const usable = (h.healthy || 0) + (h.degraded || 0);
        const util = usable ? Math.round((100 * f.devices.allocated) / usable) : 0;
        return `<tr data-flavor="${P.escapeHtml(f.flavor)}"><td>${P.escapeHtml(f.flavor)}</td><td class="num">${f.devices.total}</td><td class="num">${h.healthy || 0}</td><td class="num">${h.degraded || 0}</td>`
          + `<td class="num">${h.cordoned || 0}</td><td class="num">${h.failed || 0}</td><td class="num">${f.devices.allocated}</td><td class="num">${util}%</td></tr>`;
      }).join("") + "</tbody></table>";
    const open = new Set([...document.querySelectorAll(".cell details[open]")].map((d) => d.closest(".cell").dataset.device));
    $("nodes").innerHTML = body.nodes.map((node) => {
      const where = [node.rack && `rack ${P.escapeHtml(node.rack)}`, node.coords.length && `at (${node.coords.join(", ")})`].filter(Boolean).join(" · ");
      return `<article class="node" data-node="${P.escapeHtml(node.name)}"><h3><span>${P.escapeHtml(node.name)}</span><span class="chip">${P.escapeHtml(node.flavor)}</span></h3>`
        + `<div class="small muted">${where || "no topology position"}</div>`
        + `<div class="cells">${node.devices.map((d) => cell(d, node)).join("")}</div>`
        + `<button type="button" data-drain="${P.escapeHtml(node.name)}" aria-label="Drain node ${P.escapeHtml(node.name)}">Drain node</button></article>`;
    }).join("");
    for (const device of open) document.querySelector(`.cell[data-device="${CSS.escape(device)}"] details`)?.setAttribute("open", "");
  }

  // Redrawn only when something changed, and not while an operator has a device's actions open: a
  // button must not be replaced under the pointer that is about to press it.
  let drawn = "";
  async function refreshCluster({force = false} = {}) {
    try {
      const body = await P.api("/api/v1/operator/cluster");
      const seen = JSON.stringify(body);
      const busy = document.querySelector(".cell details[open]");
      if (force || (seen !== drawn && !busy)) { drawCluster(body); drawn = seen; }
      fresh();
    } catch (error) { failed(error); }
  }

  // --- devices' health history -------------------------------------------------------------------

  function drawDeviceEvents(body) {
    $("device-events").tBodies[0].innerHTML = body.events.map((e) => {
      const what = e.kind === "alert"
        ? `<span class="chip alert">alert</span> failure score ${(e.score * 100).toFixed(0)}%`
        : `${P.escapeHtml(e.from_health)} → <strong>${P.escapeHtml(e.to_health)}</strong>`;
      return `<tr data-event="${e.id}" data-device="${P.escapeHtml(e.device_id)}" data-kind="${e.kind}"><td>${P.fmtTime(e.created_at)}</td>`
        + `<td>${P.escapeHtml(e.device_id)}</td><td>${P.escapeHtml(e.flavor)}</td><td>${what}</td><td>${P.escapeHtml(e.by)}</td></tr>`;
    }).join("") || `<tr><td colspan="5" class="muted">No health change or alert yet.</td></tr>`;
  }

  let eventsDrawn = "";
  async function refreshDeviceEvents() {
    const body = await P.api("/api/v1/operator/device-events?limit=50");
    const seen = JSON.stringify(body);
    if (seen !== eventsDrawn) { drawDeviceEvents(body); eventsDrawn = seen; }
  }

  // --- the queue and the cohorts ------------------------------------------------------------------

  const amount = (v) => (v === null || v === undefined ? "none" : Number(v).toFixed(3).replace(/\.?0+$/, ""));

  function drawQueue(body) {
    $("queue").tBodies[0].innerHTML = body.queue.map((j) => `<tr data-job="${j.id}"><td class="num">${j.id}</td><td>${P.escapeHtml(j.tenant)}</td>`
      + `<td>${P.escapeHtml(j.name)}</td><td class="num">#${j.position}</td><td class="num">${j.priority}</td><td>${j.devices}× ${j.flavors.map(P.escapeHtml).join(" or ")}</td>`
      + `<td class="reason">${P.escapeHtml(j.reason)}</td><td>${P.fmtTime(j.submitted_at)}</td></tr>`).join("")
      || `<tr><td colspan="8" class="muted">Nothing waits.</td></tr>`;
    $("cohorts").tBodies[0].innerHTML = body.tenants.flatMap((t) => t.quotas.map((q) => `<tr data-tenant="${P.escapeHtml(t.tenant)}" data-resource="${P.escapeHtml(q.resource)}">`
      + `<td>${P.escapeHtml(t.tenant)}</td><td>${P.escapeHtml(t.cohort || "–")}</td><td>${P.escapeHtml(q.resource)}</td>`
      + `<td class="num">${amount(q.in_use)} / ${amount(q.nominal)} ${P.escapeHtml(q.unit)}</td><td class="num">${amount(q.borrowed)}</td>`
      + `<td class="num">${amount(q.borrowing_limit)}</td><td class="num">${amount(q.lending_limit)}</td><td class="num">${q.cohort ? amount(q.cohort_can_lend) : "–"}</td></tr>`)).join("")
      || `<tr><td colspan="8" class="muted">No tenant has a quota.</td></tr>`;
  }

  async function refreshQueue() {
    try { drawQueue(await P.api("/api/v1/operator/queue")); fresh(); } catch (error) { failed(error); }
  }

  // --- actions ----------------------------------------------------------------------------------

  document.addEventListener("click", async (event) => {
    const target = event.target;
    if (target.dataset.testid === "holder") event.preventDefault();
    try {
      if (target.dataset.drain) {
        if (!window.confirm(`Drain ${target.dataset.drain}? Its devices are cordoned; jobs on it checkpoint and move.`)) return;
        const answer = await P.api(`/api/v1/operator/nodes/${encodeURIComponent(target.dataset.drain)}/drain`, {method: "POST"});
        P.announce(`${answer.node} drained; ${answer.moved.length} job(s) moving${answer.moved.length ? `: ${answer.moved.map((id) => `#${id}`).join(", ")}` : ""}`);
        await refreshCluster({force: true});
      } else if (target.dataset.device && target.dataset.health) {
        const answer = await P.api(`/api/v1/operator/devices/${target.dataset.device.split("/").map(encodeURIComponent).join("/")}/health`, {method: "POST", body: {health: target.dataset.health}});
        P.announce(`${answer.device_id} is now ${answer.health}`);
        target.closest("details")?.removeAttribute("open");
        await refreshCluster({force: true});
      }
    } catch (error) {
      failed(error);
    }
  });

  const refresh = $("nodes") ? () => Promise.all([refreshCluster(), refreshDeviceEvents().catch(failed)]) : refreshQueue;
  refresh();
  setInterval(refresh, REFRESH_MS);
})();
